"""Slurm --begin in the cycle (pure): a job is not placed before its begin time and says when it may start; once the
time has come it is served as any other job; a waiting job holds no block ahead of jobs that may run now."""

from __future__ import annotations

import pytest
from oneplus_jobformats.errors import JobFormatError
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_queueing.config import default_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from queueing_world import World, spec

NOW = 1_800_000_000.0  # a wall-clock time (2027-01-15T08:00:00Z)


def later(name: str, gpus: int, begin_at: float) -> PendingJob:
    return PendingJob(name, spec(name, gpus).model_copy(update={"begin_at": begin_at}), NOW - 60)


def test_a_job_waits_for_its_begin_time_then_runs() -> None:
    w = World(n_nodes=1)
    job = later("b", 1, NOW + 5400)
    d = schedule_cycle(NOW, w.state, [job], [], default_config(), UsageHistory())
    assert not d.placements
    why = d.reasons["b"]
    assert why.code == "BeginTime"
    assert why.message == "waiting for its begin time 2027-01-15T09:30:00Z (in 1h 30m)"
    d = schedule_cycle(NOW + 5400, w.state, [job], [], default_config(), UsageHistory())
    assert list(d.placements) == ["b"]


def test_a_job_before_its_begin_time_holds_nothing_back() -> None:
    w = World(n_nodes=1)  # 8 GPUs
    big = later("big", 8, NOW + 600)
    big = PendingJob(big.job_id, big.spec.model_copy(update={"priority": 1000}), big.submitted_ts)
    small = PendingJob("small", spec("small", 4), NOW)
    d = schedule_cycle(NOW, w.state, [big, small], [], default_config(), UsageHistory())
    assert list(d.placements) == ["small"] and d.reservation is None


@pytest.mark.parametrize(
    ("begin", "at"),
    [("now+90", NOW + 90), ("now+2hours", NOW + 7200), ("now+1day", NOW + 86400), ("now", NOW)],
)
def test_sbatch_begin_forms(begin: str, at: float) -> None:
    tr = parse_sbatch(f"#!/bin/bash\n#SBATCH --gpus=1 --begin={begin}\necho\n", now=NOW)
    assert tr.spec.begin_at == at and not tr.warnings


def test_sbatch_begin_clock_time_is_the_next_one() -> None:
    tr = parse_sbatch("#!/bin/bash\n#SBATCH --gpus=1 -b 2027-01-16T10:00\necho\n", now=NOW)
    assert tr.spec.begin_at is not None and tr.spec.begin_at > NOW
    tr = parse_sbatch("#!/bin/bash\n#SBATCH --gpus=1 -b teatime\necho\n", now=NOW)
    assert tr.spec.begin_at is not None and NOW < tr.spec.begin_at <= NOW + 86400


@pytest.mark.parametrize(
    ("begin", "says"),
    [
        ("soon", "'soon' is not a time sbatch --begin takes here"),
        ("25:00", "'25:00' is not a time of day"),
        ("2027-02-30", "'2027-02-30' is not a date"),
        ("now+3fortnights", "unknown time unit 'fortnights'"),
    ],
)
def test_sbatch_refuses_a_begin_it_cannot_read(begin: str, says: str) -> None:
    with pytest.raises(JobFormatError, match=says):
        parse_sbatch(f"#!/bin/bash\n#SBATCH --gpus=1 --begin={begin}\necho\n", now=NOW)


def test_a_failed_nodelist_shape_does_not_hold_back_the_same_shape_elsewhere() -> None:
    w = World(n_nodes=2)  # 16 GPUs on two nodes
    node0 = w.state.layout.slots[0].name
    w.running["busy"] = w.run("busy", [(0, list(range(8)))])
    pinned = PendingJob("pinned", spec("pinned", 4).model_copy(update={"nodelist": [node0]}), NOW - 10)
    free = PendingJob("free", spec("free", 4), NOW)
    d = schedule_cycle(NOW, w.state, [pinned, free], list(w.running.values()), default_config(), UsageHistory())
    assert "free" in d.placements and "pinned" not in d.placements
    assert f"on nodes {node0}" in d.reasons["pinned"].message
