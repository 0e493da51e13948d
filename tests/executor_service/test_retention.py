"""Which ended attempts keep their containers for `oneplus logs`."""

from __future__ import annotations

import pytest
from oneplus_node_executor.retention import FinishedRanks


def test_beyond_keep_the_oldest_attempts_are_handed_back_in_order() -> None:
    kept = FinishedRanks(2)
    assert kept.ended("a", 1) == []
    assert kept.ended("b", 1) == []
    assert kept.ended("c", 4) == [("a", 1)]
    assert ("b", 1) in kept and ("a", 1) not in kept and len(kept) == 2


def test_an_attempt_reported_twice_counts_once_and_becomes_the_newest() -> None:
    kept = FinishedRanks(2)
    kept.ended("a", 1)
    kept.ended("b", 1)
    assert kept.ended("a", 1) == []
    assert kept.ended("c", 1) == [("b", 1)]


def test_two_attempts_of_one_job_are_kept_apart_and_drain_empties_oldest_first() -> None:
    kept = FinishedRanks(3)
    kept.ended("a", 1)
    kept.ended("a", 2)
    assert kept.drain() == [("a", 1), ("a", 2)]
    assert len(kept) == 0


def test_keep_zero_removes_at_once_and_a_negative_keep_is_refused() -> None:
    assert FinishedRanks(0).ended("a", 1) == [("a", 1)]
    with pytest.raises(ValueError, match="keep=-1"):
        FinishedRanks(-1)
