"""The job working set: live jobs and recently finished ones, indexed the way a scheduling cycle reads them (pure).

The job owner folds every event into it with `apply_event`; informers (other services) fold the events they read
from the job-event stream. Its size follows the jobs that are alive, never the history: a finished job leaves the
pending and holder indexes at once, and the hot view `min_age_s` after it finished (Slurm's `MinJobAge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .events import ACTIVE_STATES, JobEvent, JobRecord, JobRejected
from .lifecycle import IllegalTransition, apply_event

# States in which a job holds its reservation: the active ones, and checkpointed while its ranks stop.
HOLDING_STATES: frozenset[str] = ACTIVE_STATES | {"CHECKPOINTED"}


@dataclass
class JobIndex:
    """Records by job id, with the pending and holding jobs indexed apart, and the stream sequence folded so far."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    pending: dict[str, JobRecord] = field(default_factory=dict)  # ACCEPTED, in arrival order
    holders: dict[str, JobRecord] = field(default_factory=dict)  # holding GPUs (HOLDING_STATES with an allocation)
    finished_at: dict[str, float] = field(default_factory=dict)  # terminal job → when it finished, oldest first
    last_seq: int = 0

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.jobs

    def __iter__(self) -> Iterator[JobRecord]:
        return iter(self.jobs.values())

    def get(self, job_id: str) -> JobRecord | None:
        return self.jobs.get(job_id)

    def put(self, rec: JobRecord) -> None:
        """Store a record (the owner's commit, a replayed event, a bootstrap entry) and keep the indexes right."""
        job_id = rec.job_id
        self.jobs[job_id] = rec
        self.last_seq = max(self.last_seq, rec.seq)
        if rec.state == "ACCEPTED":
            self.pending[job_id] = rec
        else:
            self.pending.pop(job_id, None)
        if rec.state in HOLDING_STATES and rec.allocation is not None:
            self.holders[job_id] = rec
        else:
            self.holders.pop(job_id, None)
        if rec.terminal:
            self.finished_at.setdefault(job_id, rec.finished_ts if rec.finished_ts is not None else rec.updated_ts)

    def apply(self, event: JobEvent, seq: int, traceparent: str | None = None) -> JobRecord | None:
        """Fold an event read from the job-event stream at `seq` (an informer's or a restarted owner's replay).

        An event the record already holds (`seq` not above the record's) changes nothing; so does a submission
        outcome (`rejected` of a job that never had a record) and an event of a job that has left the hot view.
        `traceparent` is the event's header: a record made here carries the job's trace like the owner's does.
        """
        self.last_seq = max(self.last_seq, seq)
        rec = self.jobs.get(event.job_id)
        if rec is not None and seq <= rec.seq:
            return None
        if rec is None and (isinstance(event, JobRejected) or event.type not in ("accepted", "submitted")):
            return None
        try:
            new = apply_event(rec, event)
        except IllegalTransition:
            return None  # the stream holds only applied events: this is one of a job we bootstrapped past
        update: dict[str, object] = {"seq": seq}
        if new.traceparent is None and traceparent:
            update["traceparent"] = traceparent  # the job's trace travels in the event's header, not its body
        new = new.model_copy(update=update)
        self.put(new)
        return new

    def expire(self, now: float, min_age_s: float) -> list[JobRecord]:
        """Finished jobs older than `min_age_s`, taken out of the hot view (oldest first)."""
        out: list[JobRecord] = []
        for job_id, ts in list(self.finished_at.items()):
            if now - ts < min_age_s:
                continue
            del self.finished_at[job_id]
            rec = self.jobs.pop(job_id, None)
            if rec is not None:
                out.append(rec)
        return out

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.pending.pop(job_id, None)
        self.holders.pop(job_id, None)
        self.finished_at.pop(job_id, None)

    @classmethod
    def of(cls, records: Iterable[JobRecord]) -> JobIndex:
        idx = cls()
        for rec in sorted(records, key=lambda r: (r.seq, r.submitted_ts, r.job_id)):
            idx.put(rec)
        return idx
