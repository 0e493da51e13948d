"""The platform across hosts (issue 15): network namespaces made by the test, three NATS servers clustered, Redis with
a replica and three sentinels, the services and the executors on hosts of their own; a short run of
`oneplus.multihost` with every fault (the jobs stream's leader killed, a NATS server cut off and healed, a Redis
failover, the solver killed, the solver paused past its lease, every process restarted once); no write of a
deposed owner lands on the replicated streams. Skipped, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from oneplus_testing import FAULTS

from oneplus.netlab import NetLab
from oneplus.testing.chaos import FENCED_WRITES, ChaosConfig, render
from oneplus.testing.multihost import MultiHostRun, lab_faults, sentinel_config

KINDS = {"nats-leader-kill", "nats-partition", "redis-failover", "kill", "pause-leader", "rolling-restart"}


def test_the_fault_schedule_has_every_multihost_fault_and_restarts_last() -> None:
    faults = lab_faults(1, ("a", "b"))
    assert {f.kind for f in faults} == KINDS
    assert faults[-1].kind == "rolling-restart"
    assert [f.kind for f in lab_faults(1, ("a",))] == [f.kind for f in faults], "seeded"


def test_the_sentinels_watch_the_primary_with_a_quorum_of_two() -> None:
    conf = sentinel_config("10.0.0.5")
    assert "sentinel monitor oneplus 10.0.0.5 6379 2" in conf


@pytest.mark.e2e
@FAULTS
@pytest.mark.timeout(480)
async def test_across_hosts_no_job_lost_no_gpu_used_twice_whatever_fails(tmp_path: Path) -> None:
    why = NetLab.available()
    if why is not None:
        pytest.skip(f"no multi-host lab here: {why}")
    cfg = ChaosConfig(gangs=50, seed=1, profile="multihost", drain_timeout_s=150.0, workdir=tmp_path / "mh")
    # Two solver replicas, as `task multihost`: the owner lease's holder is the one killed, the other takes over.
    result = await MultiHostRun(cfg).run()
    render(result)
    (tmp_path / "multihost.json").write_text(json.dumps(asdict(result), indent=2))

    kinds = [f["kind"] for f in result.faults]
    assert set(kinds) == KINDS
    failover = next(f for f in result.faults if f["kind"] == "redis-failover")
    assert "promoted" in failover["note"], failover
    assert result.jobs["submitted"] == cfg.gangs
    assert all(f["recovery_list_s"] is not None for f in result.faults), result.faults
    broken = {name: v for name, v in result.invariants.items() if v}
    evidence = json.dumps(result.evidence, indent=1)
    assert FENCED_WRITES in result.invariants
    assert not broken, f"{json.dumps(broken, indent=1)}\nlog lines: {evidence}\nlogs in {result.workdir}"
