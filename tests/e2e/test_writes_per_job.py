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
    # Written by jobs alone, so exact: each transition's event, each fact reported, one launch, one archive record.
    assert count.appends[subjects.JOBS_STREAM] == 6 * JOBS, count.table()  # accepted..finished
    assert count.appends[subjects.FACTS_STREAM] == 4 * JOBS, count.table()  # accepted, starting, running, node end
    # The reservation audit rides on `placed` and the attempt's end (oneplus_stores.audit.transition_audit).
    assert count.appends[subjects.AUDIT_STREAM] == 0, count.table()
    assert count.appends[subjects.ARCHIVE_STREAM] == JOBS, count.table()
    assert count.appends[subjects.COMMANDS_STREAM] == JOBS, count.table()  # the launch
    # A record per event at most (a batch that folds two events of one job writes its record once), and the last
    # node's end is written with the attempt's end, by the settling commit: at most 5 a job.
    assert count.appends[f"KV_{subjects.JOBS_KV}"] <= 5 * JOBS, count.table()
    assert per_job.get(f"KV_{subjects.SOLVER_STATE_KV}", 0.0) < 1.0, count.table()
    assert count.total <= 17.0, count.table()
