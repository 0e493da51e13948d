"""Advance reservations (pure): creation checks, --reservation jobs inside the window only, other jobs off its nodes
while it is active and, before it starts, unless their time limit ends them by its start."""

from __future__ import annotations

import pytest
from oneplus_contracts.advance import AdvanceReservation, AdvanceReservationRequest
from oneplus_queueing.advance import (
    AdvanceReservationError,
    check_job,
    check_new,
    check_window,
    live_rows,
    pick_nodes,
    waiting_on,
    window_rows,
)
from oneplus_queueing.config import default_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from pydantic import ValidationError
from queueing_world import World, spec

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
HOUR = 3600.0


def window(name: str, nodes: list[str], start: float, hours: float = 2, **kw: object) -> AdvanceReservation:
    return AdvanceReservation.model_validate(
        {"name": name, "nodes": nodes, "start_ts": start, "end_ts": start + hours * HOUR, "teams": ["ops"], **kw}
    )


def job(
    name: str, gpus: int, *, limit_s: int | None = None, team: str = "default", res: str | None = None
) -> PendingJob:
    s = spec(name, gpus, time_limit_s=limit_s).model_copy(update={"team": team, "reservation": res})
    return PendingJob(name, s, NOW - 10)


def test_a_job_that_would_run_into_a_future_window_is_kept_off_its_nodes() -> None:
    w = World(n_nodes=2)  # 8 GPUs each
    n0, n1 = (s.name for s in w.state.layout.slots)
    maint = window("maint", [n0], NOW + 2 * HOUR, maint=True)
    long = job("long", 8, limit_s=int(3 * HOUR))  # would still run at the window's start
    short = job("short", 8, limit_s=int(HOUR))  # ends an hour before it
    d = schedule_cycle(NOW, w.state, [long, short], [], default_config(), UsageHistory(), reservations=[maint])
    assert d.placements["long"].nodes == [n1]
    assert d.placements["short"].nodes == [n0]


def test_a_job_without_a_time_limit_never_starts_on_a_future_windows_nodes() -> None:
    w = World(n_nodes=1)
    n0 = w.state.layout.slots[0].name
    d = schedule_cycle(
        NOW, w.state, [job("open", 1)], [], default_config(), UsageHistory(),
        reservations=[window("later", [n0], NOW + 30 * 24 * HOUR)],
    )  # fmt: skip
    assert not d.placements and f"off nodes {n0}" in d.reasons["open"].message


def test_jobs_stay_off_an_active_windows_nodes_and_its_own_jobs_run_only_there() -> None:
    w = World(n_nodes=2)
    n0, n1 = (s.name for s in w.state.layout.slots)
    r1 = window("r1", [n1], NOW - 60)
    mine = job("mine", 8, limit_s=600, team="ops", res="r1")
    other = job("other", 8, limit_s=600)
    d = schedule_cycle(NOW, w.state, [mine, other], [], default_config(), UsageHistory(), reservations=[r1])
    assert d.placements["mine"].nodes == [n1] and d.placements["other"].nodes == [n0]
    third = job("third", 8, limit_s=600)
    d = schedule_cycle(NOW, w.state, [third], [], default_config(), UsageHistory(), reservations=[r1])
    assert d.placements["third"].nodes == [n0]


def test_a_reservation_job_waits_for_its_window_and_says_so() -> None:
    w = World(n_nodes=1)
    n0 = w.state.layout.slots[0].name
    r1 = window("r1", [n0], NOW + 90 * 60)
    d = schedule_cycle(
        NOW, w.state, [job("mine", 1, team="ops", res="r1")], [], default_config(), UsageHistory(), reservations=[r1]
    )
    why = d.reasons["mine"]
    assert why.code == "Reservation"
    assert why.message == "waiting for reservation r1 to start at 2027-01-15T09:30:00Z (in 1h 30m)"
    d = schedule_cycle(
        NOW + 90 * 60, w.state, [job("mine", 1, team="ops", res="r1")], [], default_config(), UsageHistory(),
        reservations=[r1],
    )  # fmt: skip
    assert list(d.placements) == ["mine"]


def test_a_job_whose_reservation_is_gone_or_not_its_own_waits_with_the_reason() -> None:
    w = World(n_nodes=1)
    n0 = w.state.layout.slots[0].name
    r1 = window("r1", [n0], NOW - 60)
    d = schedule_cycle(
        NOW, w.state, [job("gone", 1, team="ops", res="r9"), job("stranger", 1, res="r1")], [], default_config(),
        UsageHistory(), reservations=[r1],
    )  # fmt: skip
    assert d.reasons["gone"].message == "reservation r9 does not exist (deleted?)"
    assert d.reasons["stranger"].message == "reservation r1 does not admit user unknown (team default)"
    assert {d.reasons[j].code for j in ("gone", "stranger")} == {"Reservation"}


@pytest.mark.parametrize(
    ("new", "says"),
    [
        (window("old", ["a"], NOW - 3 * HOUR), "reservation old ends at 2027-01-15T07:00:00Z, which is in the past"),
        (window("late", ["a"], NOW - HOUR), "reservation late starts at 2027-01-15T07:00:00Z, which is in the past"),
        (window("r2", ["b", "c"], NOW + HOUR), "reservation r2 overlaps reservation r1 on b (2027-01-15T08:00:00Z"),
        (window("r1", ["z"], NOW + 9 * HOUR), "reservation r1 already exists"),
        (window("r3", ["q"], NOW + HOUR), "reservation r3: node 'q' is not in this cluster (it has a,b,c,z)"),
    ],
)
def test_bad_reservations_are_refused_in_one_line(new: AdvanceReservation, says: str) -> None:
    r1 = window("r1", ["a", "b"], NOW)
    with pytest.raises(AdvanceReservationError) as err:
        check_new(new, [r1], NOW, known_nodes=["a", "b", "c", "z"])
    assert str(err.value).startswith(says) and "\n" not in str(err.value)


def test_the_same_nodes_at_another_time_or_other_nodes_at_once_are_fine() -> None:
    r1 = window("r1", ["a", "b"], NOW)
    check_new(window("after", ["a"], NOW + 2 * HOUR), [r1], NOW)
    check_new(window("beside", ["c"], NOW), [r1], NOW)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"end_ts": NOW}, "ends before it starts"),
        ({"teams": []}, "admits nobody"),
        ({"nodes": "n[3-1]"}, "bad range"),
        ({"name": "no spaces"}, "reservation name 'no spaces'"),
    ],
)
def test_a_malformed_reservation_is_refused(fields: dict[str, object], says: str) -> None:
    base = {"name": "r", "nodes": ["a"], "start_ts": NOW, "end_ts": NOW + HOUR, "teams": ["ops"]}
    with pytest.raises(ValidationError, match=says.replace("[", r"\[")):
        AdvanceReservation.model_validate({**base, **fields})


def test_a_job_naming_no_reservation_or_one_not_admitting_it_is_refused() -> None:
    r1 = window("r1", ["a"], NOW + HOUR, users=["ana"])
    s = spec("j", 1).model_copy(update={"reservation": "r9"})
    with pytest.raises(AdvanceReservationError, match=r"^--reservation r9: no such reservation$"):
        check_job(s, [r1], NOW)
    s = spec("j", 1).model_copy(update={"reservation": "r1", "user": "bob", "team": "ml"})
    with pytest.raises(AdvanceReservationError, match=r"^--reservation r1 does not admit user bob \(team ml\)$"):
        check_job(s, [r1], NOW)
    check_job(s.model_copy(update={"user": "ana"}), [r1], NOW)
    check_job(s.model_copy(update={"team": "ops"}), [r1], NOW)


def test_sbatch_reservation_names_one() -> None:
    from oneplus_jobformats.errors import JobFormatError
    from oneplus_jobformats.sbatch import parse_sbatch

    tr = parse_sbatch("#!/bin/bash\n#SBATCH --gpus=1 --reservation=maint1\necho\n")
    assert tr.spec.reservation == "maint1" and not tr.warnings
    with pytest.raises(JobFormatError, match="names one reservation"):
        parse_sbatch("#!/bin/bash\n#SBATCH --gpus=1 --reservation=a,b\necho\n")


# --- a reservation by GPU count (Slurm's TRES=gres/gpu=N): whole nodes picked at creation ---------------------------

GPUS_OF = {"a100-0": 8, "a100-1": 8, "h100-0": 8, "l40s-0": 4, "l40s-1": 4, "cpu-0": 0}


def test_a_gpu_count_takes_the_smallest_node_that_holds_it_else_the_largest_nodes_first() -> None:
    assert pick_nodes("r", 4, NOW, NOW + HOUR, GPUS_OF, []) == ["l40s-0"]  # no 8-GPU node spent on 4 GPUs
    assert pick_nodes("r", 5, NOW, NOW + HOUR, GPUS_OF, []) == ["a100-0"]
    assert pick_nodes("r", 16, NOW, NOW + HOUR, GPUS_OF, []) == ["a100-0", "a100-1"]
    # The last node only tops the count up: the smallest that does it, no third 8-GPU node for 4 more GPUs.
    assert pick_nodes("r", 20, NOW, NOW + HOUR, GPUS_OF, []) == ["a100-0", "a100-1", "l40s-0"]
    assert pick_nodes("r", 12, NOW, NOW + HOUR, GPUS_OF, []) == ["a100-0", "l40s-0"]
    assert pick_nodes("r", 23, NOW, NOW + HOUR, GPUS_OF, []) == ["a100-0", "a100-1", "h100-0"]
    # Deterministic: the same ask on the same cluster picks the same nodes, whatever order the nodes came in.
    shuffled = dict(reversed(list(GPUS_OF.items())))
    assert pick_nodes("r", 20, NOW, NOW + HOUR, shuffled, []) == ["a100-0", "a100-1", "l40s-0"]


def test_a_gpu_count_skips_nodes_another_reservation_holds_in_that_window_only() -> None:
    held = window("maint", ["a100-0", "a100-1"], NOW + HOUR, hours=2)
    assert pick_nodes("r", 16, NOW, NOW + 2 * HOUR, GPUS_OF, [held]) == ["h100-0", "l40s-0", "l40s-1"]
    assert pick_nodes("r", 12, NOW, NOW + 2 * HOUR, GPUS_OF, [held]) == ["h100-0", "l40s-0"]
    # Before the other window: its nodes are free.
    assert pick_nodes("r", 16, NOW - 0, NOW + HOUR, GPUS_OF, [held]) == ["a100-0", "a100-1"]


def test_a_gpu_count_the_cluster_cannot_hold_then_is_refused_in_one_line_naming_it() -> None:
    held = window("maint", ["a100-0", "a100-1", "h100-0"], NOW, hours=4)
    with pytest.raises(AdvanceReservationError) as err:
        pick_nodes("big", 16, NOW + HOUR, NOW + 2 * HOUR, GPUS_OF, [held])
    message = str(err.value)
    assert message == (
        "reservation big: 16 GPUs asked but only 8 are free of other reservations from 2027-01-15T09:00:00Z to "
        "2027-01-15T10:00:00Z (the cluster has 32; a100-[0-1],h100-0 held by reservation maint)"
    ), message
    assert err.value.code == 409 and "\n" not in message
    with pytest.raises(AdvanceReservationError, match=r"^reservation huge: 33 GPUs asked but only 32 are free"):
        pick_nodes("huge", 33, NOW, NOW + HOUR, GPUS_OF, [])


def test_a_window_in_the_past_is_refused_before_any_node_is_picked() -> None:
    with pytest.raises(AdvanceReservationError, match=r"^reservation old ends at 2027-01-15T07:00:00Z, which is in"):
        check_window("old", NOW - 2 * HOUR, NOW - HOUR, NOW)
    with pytest.raises(AdvanceReservationError, match=r"^reservation late starts at 2027-01-15T07:00:00Z, which is"):
        check_window("late", NOW - HOUR, NOW + HOUR, NOW)
    check_window("now", NOW - 30, NOW + HOUR, NOW)  # a start within a minute's slack is now


def test_a_request_names_nodes_or_a_gpu_count_one_of_them() -> None:
    base = {"name": "r", "start_ts": NOW, "end_ts": NOW + HOUR, "teams": ["ops"]}
    for extra, says in [
        ({}, "reservation r: give nodes or a GPU count, one of them"),
        ({"nodes": "n[0-1]", "gpus": 8}, "reservation r: give nodes or a GPU count, one of them"),
        ({"gpus": 0}, "greater than or equal to 1"),
        ({"gpus": 8, "end_ts": 1e300}, "less than or equal to 253402300799"),
    ]:
        with pytest.raises(ValidationError, match=says):
            AdvanceReservationRequest.model_validate(base | extra)
    req = AdvanceReservationRequest.model_validate(base | {"gpus": 16})
    stored = req.reservation(["a100-0", "a100-1"], NOW)
    assert (stored.nodes, stored.gpus, stored.created_ts) == (["a100-0", "a100-1"], 16, NOW)
    assert (
        "gpus"
        not in AdvanceReservationRequest.model_validate(base | {"nodes": "n0"})
        .reservation(["n0"], NOW)
        .model_dump(exclude_none=True)
        and '"gpus"' not in window("w", ["n0"], NOW).model_dump_json()
    )


def test_queue_rows_waiting_on_a_reservation_are_counted_beside_it() -> None:
    rows = [
        {"job_id": "a", "reason": "Reservation", "message": "waiting for reservation r1 to start at X (in 1h 00m)"},
        {"job_id": "b", "reason": "Reservation", "message": "waiting for reservation r1 to start at X (in 1h 00m)"},
        {"job_id": "c", "reason": "Reservation", "message": "reservation gone does not exist (deleted?)"},
        {"job_id": "d", "reason": "Priority", "message": "behind reservation r1 users"},
    ]
    assert waiting_on(rows) == {"r1": 2, "gone": 1}
    listed = window_rows(NOW, [window("r1", ["n1"], NOW + HOUR), window("old", ["n0"], NOW - 3 * HOUR)])
    assert [(r["name"], r["state"], r["waiting"]) for r in live_rows(listed, rows)] == [("r1", "WAITING", 2)]
