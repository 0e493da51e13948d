from collections import Counter

import pytest
from oneplus_queueing.shards import replica_for

JOBS = [f"j-{i:06x}" for i in range(6000)]


def test_one_replica_places_everything() -> None:
    assert {replica_for(j, ["a"]) for j in JOBS} == {"a"}


def test_the_choice_does_not_depend_on_the_order_replicas_are_listed() -> None:
    assert [replica_for(j, ["a", "b", "c"]) for j in JOBS] == [replica_for(j, ["c", "a", "b"]) for j in JOBS]


def test_jobs_spread_evenly() -> None:
    counts = Counter(replica_for(j, ["s-0", "s-1", "s-2"]) for j in JOBS)
    assert set(counts) == {"s-0", "s-1", "s-2"}
    assert all(1700 <= n <= 2300 for n in counts.values()), counts


def test_a_replica_leaving_moves_only_its_own_jobs() -> None:
    before = {j: replica_for(j, ["s-0", "s-1", "s-2"]) for j in JOBS}
    after = {j: replica_for(j, ["s-0", "s-2"]) for j in JOBS}
    moved = {j for j in JOBS if before[j] != after[j]}
    assert moved == {j for j in JOBS if before[j] == "s-1"}


def test_no_replicas_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no replicas"):
        replica_for("j-1", [])
