"""Rows for `oneplus queue` and `oneplus queues`."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from oneplus_contracts import Allocation, JobRecord, RankPlacement
from oneplus_contracts.slurm import compress_hostlist, format_elapsed
from oneplus_queueing import (
    QUEUE_HEADER,
    QUEUES_HEADER,
    PendingReason,
    UsageHistory,
    load_queue_config,
    queue_rows,
    queues_rows,
    split_records,
)
from queueing_world import spec

TREE = """
queues:
  - {name: org, guarantee_gpus: 16, borrow_limit_gpus: 8}
  - {name: red, parent: org, guarantee_gpus: 4}
  - {name: blue, parent: org, guarantee_gpus: 8, placement: fgd}
"""


def _rec(
    job_id: str,
    state: str,
    gpus: int,
    queue: str,
    nodes: Sequence[str] = (),
    started: float | None = None,
    submitted: float = 0.0,
) -> JobRecord:
    alloc = Allocation(ranks=[RankPlacement(rank=i, node=n, gpus=list(range(gpus))) for i, n in enumerate(nodes)])
    s = spec(job_id, gpus, ranks=max(1, len(nodes)), queue=queue)
    return JobRecord(
        job_id=job_id,
        spec=s.model_copy(update={"user": "ada"}),
        state=state,
        submitted_ts=submitted,
        updated_ts=submitted,
        started_ts=started,
        allocation=alloc if nodes else None,
    )


def _records() -> list[JobRecord]:
    return [
        _rec("j-wait2", "ACCEPTED", 8, "red", submitted=5.0),
        _rec("j-run", "RUNNING", 4, "red", ["node-00", "node-01", "node-03"], started=100.0),
        _rec("j-wait1", "ACCEPTED", 2, "blue", submitted=9.0),
        _rec("j-done", "SUCCEEDED", 1, "blue"),
        _rec("j-ckpt", "PREEMPTING", 2, "blue", ["node-02"], started=3000.0),
    ]


def test_queue_rows_list_running_then_pending_in_serving_order_with_reasons() -> None:
    reasons = {
        "j-wait1": PendingReason("j-wait1", "Resources", "needs 2 GPUs; 0 are free"),
        "j-wait2": PendingReason("j-wait2", "QuotaExceeded", "queue red holds 12 GPUs"),
    }
    rows = queue_rows(3700.0, _records(), reasons, order=["j-wait1", "j-wait2"])
    assert len(QUEUE_HEADER) == len(rows[0].cells())
    assert [r.cells() for r in rows] == [
        ("j-run", "red", "j-run", "ada", "R", "1:00:00", "12", "node-[00-01,03]"),
        ("j-ckpt", "blue", "j-ckpt", "ada", "SI", "11:40", "2", "node-02"),
        ("j-wait1", "blue", "j-wait1", "ada", "PD", "1:01:31", "2", "(Resources)"),  # waited since submission
        ("j-wait2", "red", "j-wait2", "ada", "PD", "1:01:35", "8", "(QuotaExceeded)"),
    ]
    assert rows[2].to_dict()["message"] == "needs 2 GPUs; 0 are free"


def test_split_records_gives_the_cycle_its_inputs() -> None:
    pending, running = split_records(_records())
    assert [p.job_id for p in pending] == ["j-wait2", "j-wait1"]
    assert [(r.job_id, r.preempting) for r in running] == [("j-run", False), ("j-ckpt", True)]
    with pytest.raises(ValueError, match="not pending"):
        type(pending[0]).from_record(_records()[1])


def test_queues_rows_show_guarantee_use_borrowing_and_fair_share_in_tree_order() -> None:
    cfg = load_queue_config(TREE)
    pending, running = split_records(_records())
    usage = UsageHistory(usage={"red": 7200.0, "blue": 0.0})
    rows = queues_rows(0.0, cfg, pending, running, usage)
    assert [r.queue for r in rows] == ["org", "red", "blue"]
    org, red, blue = rows
    assert (org.used_gpus, org.borrowed_gpus, org.limit_gpus, org.fairshare) == (14, 0, 24, None)
    assert (red.used_gpus, red.borrowed_gpus, red.limit_gpus) == (12, 8, None)
    assert (red.pending_jobs, red.pending_gpus, red.usage_gpu_hours) == (1, 8, 2.0)
    assert blue.fairshare == 1.0 and red.fairshare == 0.5  # blue used nothing: it is owed more
    assert red.cells() == ("  red", "4", "-", "12", "8", "1 (8 GPUs)", "0.500", "1", "best-fit", "best-effort-fifo")
    assert len(QUEUES_HEADER) == len(red.cells())
    assert blue.to_dict()["level_fs"] is None and blue.to_dict()["placement"] == "fgd"


@pytest.mark.parametrize(
    ("nodes", "text"),
    [
        (["node-00"], "node-00"),
        (["node-03", "node-01", "node-02", "node-07"], "node-[01-03,07]"),
        (["gpu9", "gpu10", "login"], "gpu[9-10],login"),
        (["a1", "a2", "b1"], "a[1-2],b1"),
    ],
)
def test_hostlists_compress_like_slurm(nodes: list[str], text: str) -> None:
    assert compress_hostlist(nodes) == text


def test_elapsed_time_formats_like_squeue() -> None:
    assert [format_elapsed(s) for s in (0, 59, 61, 3600, 90061)] == ["0:00", "0:59", "1:01", "1:00:00", "1-01:01:01"]
