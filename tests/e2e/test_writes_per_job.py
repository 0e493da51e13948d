"""Durable JetStream appends per one-GPU job, submission to archive, counted from stream sequences (issue 42).

A count, not a timing: every stream's last sequence before and after 20 one-GPU jobs on the embedded stack with
simulated executors, the idle rate of the streams that change without jobs subtracted (`oneplus.writecount`).
The streams only jobs write are counted exactly; the figures are docs/architecture.md's write path of one job.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import subjects

from oneplus.writecount import measure

pytestmark = pytest.mark.e2e

JOBS = 20


@pytest.mark.timeout(300)
async def test_durable_appends_per_one_gpu_job_from_submission_to_archive(tmp_path: Path) -> None:
    count = await measure(JOBS, tmp_path, idle_s=5.0)
    print(count.table())
    per_job = count.per_job()
    # Written by jobs alone, so exact: each transition's event, each fact reported, one archive record.
    assert count.appends[subjects.JOBS_STREAM] == 6 * JOBS, count.table()  # accepted..finished
    # None: the intake's `accepted` and the executor's facts are requests the owner answers once their event is
    # committed (the executor's outbox holds its facts until then), so each costs its event and no append of its own.
    assert count.appends[subjects.FACTS_STREAM] == 0, count.table()
    # The reservation audit rides on `placed` and the attempt's end (oneplus_stores.audit.transition_audit).
    assert count.appends[subjects.AUDIT_STREAM] == 0, count.table()
    assert count.appends[subjects.ARCHIVE_STREAM] == JOBS, count.table()
    # The launches: one message per node and commit (a launch_batch), so at most 4 a cycle on the demo's 4 nodes;
    # the 20 jobs fit at once and are placed in a cycle or a few (5 to 7 messages measured), not one each.
    assert 1 <= count.appends[subjects.COMMANDS_STREAM] <= JOBS // 2, count.table()
    # Records are saved by the owner's state save, not per transition: a live one once it has not changed for
    # SAVE_SETTLED_S (a job that ends sooner is never in the bucket), a finished one to the archive (counted above).
    # These jobs end within a second or two of their last change; on a slow machine one may be saved while it waits
    # or runs, once each at most.
    assert count.appends[f"KV_{subjects.JOBS_KV}"] <= 2 * JOBS, count.table()
    assert per_job.get(f"KV_{subjects.SOLVER_STATE_KV}", 0.0) < 1.0, count.table()
    # 7.6 measured in `task bench:writes` (100 jobs); the bound leaves room for the saves of a slow machine.
    assert count.total <= 8.0 + count.appends[f"KV_{subjects.JOBS_KV}"] / JOBS, count.table()
