"""Fair share: decayed usage and the Fair-Tree factor."""

from __future__ import annotations

import json
import math

import pytest
from oneplus_contracts import Allocation, JobSpec, RankPlacement, RankResources
from oneplus_queueing.config import load_queue_config
from oneplus_queueing.fairshare import UsageHistory, fair_tree, fairshare_factors
from oneplus_queueing.model import RunningJob

TREE = """
queues:
  - {name: a, weight: 1}
  - {name: a1, parent: a}
  - {name: a2, parent: a}
  - {name: b, weight: 1}
  - {name: b1, parent: b}
"""


def _running(job_id: str, queue: str, gpus: int, started: float) -> RunningJob:
    spec = JobSpec(name=job_id, queue=queue, resources=RankResources(gpus=gpus))
    alloc = Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=list(range(gpus)))])
    return RunningJob(job_id, spec, alloc, started)


def test_usage_decays_by_half_each_half_life_and_charging_often_or_once_agrees() -> None:
    job = _running("j", "a1", 4, started=0.0)
    once = UsageHistory(half_life_s=100.0)
    once.charge(300.0, [job])
    often = UsageHistory(half_life_s=100.0)
    for t in range(10, 301, 10):
        often.charge(float(t), [job])
    assert once.usage["a1"] == pytest.approx(often.usage["a1"], rel=1e-9)
    expected = 4 * 100.0 / math.log(2) * (1 - 2 ** (-3))
    assert once.usage["a1"] == pytest.approx(expected)
    assert once.usage_at(400.0)["a1"] == pytest.approx(expected / 2)
    with pytest.raises(ValueError, match="cannot charge back"):
        once.charge(100.0, [job])


def test_a_usage_history_survives_a_trip_through_json_and_charges_on_the_same() -> None:
    job = _running("j", "a1", 4, started=0.0)
    usage = UsageHistory(half_life_s=100.0)
    usage.charge(300.0, [job])
    usage.record_preemption(250.0, "v", "p", 8.0)
    back = UsageHistory.from_dict(json.loads(json.dumps(usage.to_dict())))
    assert back == usage
    usage.charge(400.0, [job])
    back.charge(400.0, [job])
    assert back.usage == usage.usage and back.preemptions_since(200.0) == 1


def test_fair_tree_puts_the_less_used_organisation_first_whatever_its_teams_did() -> None:
    cfg = load_queue_config(TREE)
    factors = fairshare_factors(cfg, {"a1": 100.0, "a2": 0.0, "b1": 10.0})
    # b used less than a, so b1 ranks first; inside a, the unused a2 ranks before a1.
    assert factors == {"b1": 1.0, "a2": pytest.approx(2 / 3), "a1": pytest.approx(1 / 3)}


def test_fair_tree_weights_shift_the_share() -> None:
    cfg = load_queue_config(TREE.replace("{name: a, weight: 1}", "{name: a, weight: 20}"))
    entries = fair_tree(cfg, {"a1": 100.0, "b1": 10.0})
    assert entries["a"].share == pytest.approx(20 / 21)
    assert entries["a"].level_fs > entries["b"].level_fs
    assert fairshare_factors(cfg, {"a1": 100.0, "b1": 10.0})["a2"] == 1.0


def test_unused_queues_tie_at_the_top() -> None:
    cfg = load_queue_config(TREE)
    assert set(fairshare_factors(cfg, {}).values()) == {1.0}
