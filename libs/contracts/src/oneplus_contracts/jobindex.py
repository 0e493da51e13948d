"""The job working set: live jobs and recently finished ones, indexed the way a scheduling cycle reads them (pure).

The job owner folds every event into it with `apply_event`; informers (other services) fold the events they read
from the job-event stream. Its size follows the jobs that are alive, never the history: a finished job leaves the
pending and holder indexes at once, and the hot view `min_age_s` after it finished (Slurm's `MinJobAge`).
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from .arrays import split_task_id
from .events import ACTIVE_STATES, Allocation, JobEvent, JobRecord, JobRejected
from .lifecycle import IllegalTransition, apply_event
from .slim import slim

# States in which a job holds its reservation: the active ones, and checkpointed while its ranks stop.
HOLDING_STATES: frozenset[str] = ACTIVE_STATES | {"CHECKPOINTED"}


Slot = tuple[str, str]  # (node, GPU index) or (node, MIG instance UUID)
WHOLE = 1000  # milli-GPUs of a whole GPU


def slots_of(alloc: Allocation) -> list[tuple[Slot, int]]:
    """The GPUs and MIG instances an allocation holds, each with its share in milli-GPUs (a whole one: 1000)."""
    out: list[tuple[Slot, int]] = []
    for r in alloc.ranks:
        milli = r.gpu_milli or WHOLE
        out.extend(((r.node, str(g)), milli) for g in r.gpus)
        out.extend(((r.node, uuid), WHOLE) for uuid in r.mig)
    return out


@dataclass
class GpuSlots:
    """Who holds each GPU (and MIG instance), with how much of it: the job owner refuses to record a placement on a
    GPU another live attempt holds, whatever the reservation store said (the store forgets a hold whose lease ran
    out before the attempt's end is recorded; the job stream must never show a GPU held twice)."""

    held: dict[Slot, dict[str, int]] = field(default_factory=dict)
    by_job: dict[str, list[tuple[Slot, int]]] = field(default_factory=dict)

    def hold(self, job_id: str, alloc: Allocation) -> None:
        self.release(job_id)
        slots = self.by_job[job_id] = slots_of(alloc)
        for slot, milli in slots:
            self.held.setdefault(slot, {})[job_id] = milli

    def release(self, job_id: str) -> None:
        for slot, _ in self.by_job.pop(job_id, ()):
            holders = self.held.get(slot)
            if holders is not None:
                holders.pop(job_id, None)
                if not holders:
                    del self.held[slot]

    def conflict(self, job_id: str, alloc: Allocation, *also: GpuSlots, ended: Collection[str] = ()) -> str | None:
        """Why `alloc` cannot be held by `job_id` beside the holders here (and in `also`, less the `ended` ones), or
        None when it can: a whole GPU or MIG instance someone else holds, or shares adding up to more than one GPU."""
        for slot, milli in slots_of(alloc):
            used = 0
            for table in (self, *also):
                for other, m in table.held.get(slot, {}).items():
                    if other == job_id or other in ended:
                        continue
                    if milli == WHOLE or m == WHOLE:
                        return f"{slot[0]} GPU {slot[1]} is held by {other}"
                    used += m
            if used + milli > WHOLE:
                return f"{slot[0]} GPU {slot[1]} has {WHOLE - used} milli-GPUs left, {milli} asked"
        return None


def fold_event(rec: JobRecord | None, event: JobEvent, seq: int, traceparent: str | None = None) -> JobRecord | None:
    """`rec` with `event`, read from the job-event stream at `seq`, folded in; None where it changes nothing.

    An event the record already holds (`seq` not above the record's) changes nothing; so does a submission outcome
    (`rejected` of a job that never had a record) and an event of a job with no record that is not its acceptance
    (one that has left the hot view, or whose first events the stream no longer holds). `traceparent` is the
    event's header: a record made here carries the job's trace like the owner's does.
    """
    if rec is not None and seq <= rec.seq:
        return None
    if rec is None and (isinstance(event, JobRejected) or event.type not in ("accepted", "submitted")):
        return None
    try:
        new = apply_event(rec, event)
    except IllegalTransition:
        return None  # the stream holds only applied events: this is one of a job read from past its start
    update: dict[str, object] = {"seq": seq}
    if new.traceparent is None and traceparent:
        update["traceparent"] = traceparent  # the job's trace travels in the event's header, not its body
    return new.model_copy(update=update)


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A finished job as the hot view keeps it until it leaves for the archive: its record's JSON, and the fields the
    archive files it under, taken at the finish so that archiving never parses the record back (a burst of finished
    jobs expired together was a burst of full records made and dropped at once)."""

    job_id: str
    seq: int
    state: str
    team: str
    user: str
    ts: float  # when it finished
    data: bytes


@dataclass
class JobIndex:
    """Records by job id, with the pending and holding jobs indexed apart, and the stream sequence folded so far.

    A finished job is kept as its record's JSON until it leaves the hot view (about a fifth of the memory of the
    record's objects, which live jobs keep for the cycle to read): in a busy hour most of the hot view is finished
    jobs, and the solver's memory follows its busiest moment (CPython's allocator seldom gives back what a peak took).
    `keep_finished` False (an informer that needs only live jobs) drops a finished job at once.
    """

    jobs: dict[str, JobRecord] = field(default_factory=dict)  # the live jobs (not finished)
    pending: dict[str, JobRecord] = field(default_factory=dict)  # ACCEPTED, in arrival order
    holders: dict[str, JobRecord] = field(default_factory=dict)  # holding GPUs (HOLDING_STATES with an allocation)
    finished: dict[str, FinishedJob] = field(default_factory=dict)  # finished job → its record's JSON, in fold order
    arrays: dict[str, dict[str, None]] = field(default_factory=dict)  # array id → its tasks held here (live, finished)
    slots: GpuSlots = field(default_factory=GpuSlots)  # the GPUs the holders hold
    last_seq: int = 0
    keep_finished: bool = True

    def __len__(self) -> int:
        return len(self.jobs) + len(self.finished)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.jobs or job_id in self.finished

    def __iter__(self) -> Iterator[JobRecord]:
        yield from list(self.jobs.values())
        for done in list(self.finished.values()):
            yield JobRecord.model_validate_json(done.data)

    def get(self, job_id: str) -> JobRecord | None:
        rec = self.jobs.get(job_id)
        if rec is None and (done := self.finished.get(job_id)) is not None:
            return JobRecord.model_validate_json(done.data)  # a late event of a finished job, a lookup: seldom
        return rec

    def put(self, rec: JobRecord) -> None:
        """Store a record (the owner's commit, a replayed event, a bootstrap entry) and keep the indexes right."""
        job_id = rec.job_id
        self.last_seq = max(self.last_seq, rec.seq)
        task = rec.spec.array_task
        if task is not None and (self.keep_finished or not rec.terminal):
            self.arrays.setdefault(task.array_job_id, {})[job_id] = None
        elif task is not None:
            self._leave_array(job_id)
        if rec.terminal:
            self.jobs.pop(job_id, None)
            self.pending.pop(job_id, None)
            self.holders.pop(job_id, None)
            self.slots.release(job_id)
            if self.keep_finished:
                was = self.finished.get(job_id)
                self.finished[job_id] = FinishedJob(
                    job_id,
                    rec.seq,
                    sys.intern(rec.state),
                    rec.spec.team,
                    rec.spec.user,
                    # The first finish counts: a late event changes the record, not when the job left.
                    was.ts if was is not None else (rec.finished_ts if rec.finished_ts is not None else rec.updated_ts),
                    rec.model_dump_json().encode(),
                )
            return
        slim(rec)
        self.jobs[job_id] = rec
        if rec.state == "ACCEPTED":
            self.pending[job_id] = rec
        else:
            self.pending.pop(job_id, None)
        if rec.state in HOLDING_STATES and rec.allocation is not None:
            held = self.holders.get(job_id)
            self.holders[job_id] = rec
            if held is None or held.allocation is not rec.allocation:
                self.slots.hold(job_id, rec.allocation)
        else:
            self.holders.pop(job_id, None)
            self.slots.release(job_id)

    def apply(self, event: JobEvent, seq: int, traceparent: str | None = None) -> JobRecord | None:
        """Fold an event read from the job-event stream at `seq` (an informer's or a restarted owner's replay).

        An event the record already holds (`seq` not above the record's) changes nothing; so does a submission
        outcome (`rejected` of a job that never had a record) and an event of a job that has left the hot view.
        `traceparent` is the event's header: a record made here carries the job's trace like the owner's does.
        """
        self.last_seq = max(self.last_seq, seq)
        new = fold_event(self.get(event.job_id), event, seq, traceparent)
        if new is not None:
            self.put(new)
        return new

    def expire(self, now: float, min_age_s: float) -> list[JobRecord]:
        """Finished jobs older than `min_age_s`, taken out of the hot view, as records (in fold order)."""
        return [JobRecord.model_validate_json(done.data) for done in self.expire_finished(now, min_age_s)]

    def expire_finished(self, now: float, min_age_s: float) -> list[FinishedJob]:
        """`expire`, as kept: the JSON the archive stores and the fields it files it under, nothing parsed."""
        return self.forget_finished(self.due_finished(now, min_age_s))

    def due_finished(self, now: float, min_age_s: float) -> list[FinishedJob]:
        """The finished jobs older than `min_age_s`, as kept, still in the hot view (`forget_finished` drops them)."""
        return [done for done in self.finished.values() if now - done.ts >= min_age_s]

    def forget_finished(self, due: Iterable[FinishedJob]) -> list[FinishedJob]:
        """Take `due` out of the hot view; the ones a late event changed since (kept anew) stay. Returns those taken."""
        out = [done for done in due if self.finished.get(done.job_id) is done]
        for done in out:
            del self.finished[done.job_id]
            self._leave_array(done.job_id)
        return out

    def _leave_array(self, job_id: str) -> None:
        split = split_task_id(job_id)
        if split is None:
            return
        members = self.arrays.get(split[0])
        if members is not None:
            members.pop(job_id, None)
            if not members:
                del self.arrays[split[0]]

    def state_of(self, job_id: str) -> str | None:
        """A job's state without parsing a finished one's record."""
        rec = self.jobs.get(job_id)
        if rec is not None:
            return rec.state
        done = self.finished.get(job_id)
        return done.state if done is not None else None

    def live_tasks(self, array_job_id: str) -> list[str]:
        """The array's tasks that have not ended, in the order they were folded."""
        return [j for j in self.arrays.get(array_job_id, ()) if j in self.jobs]

    def task_states(self, array_job_id: str) -> dict[str, str]:
        """Task id → state of every task of the array held here (none: no such array, or it left the hot view)."""
        out: dict[str, str] = {}
        for job_id in self.arrays.get(array_job_id, ()):
            state = self.state_of(job_id)
            if state is not None:
                out[job_id] = state
        return out

    def forget(self, job_id: str) -> None:
        self._leave_array(job_id)
        self.jobs.pop(job_id, None)
        self.pending.pop(job_id, None)
        self.holders.pop(job_id, None)
        self.slots.release(job_id)
        self.finished.pop(job_id, None)

    @classmethod
    def of(cls, records: Iterable[JobRecord], *, keep_finished: bool = True) -> JobIndex:
        idx = cls(keep_finished=keep_finished)
        for rec in sorted(records, key=lambda r: (r.seq, r.submitted_ts, r.job_id)):
            idx.put(rec)
        return idx
