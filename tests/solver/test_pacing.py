"""Cycle pacing: after a cycle the scheduler rests in proportion to its length, so back-to-back cycles take at most
the configured share of the solver's time (the job owner, on the same event loop, folds the facts meanwhile)."""

from __future__ import annotations

import pytest
from oneplus_placement_solver.app import SolverSettings
from oneplus_placement_solver.pacing import MAX_REST_S, cycle_rest


def test_half_duty_rests_as_long_as_the_cycle_ran() -> None:
    assert cycle_rest(0.004, 0.5) == pytest.approx(0.004)
    assert cycle_rest(0.030, 0.25) == pytest.approx(0.090)


def test_full_duty_never_rests_and_a_long_cycle_rests_at_most_the_cap() -> None:
    assert cycle_rest(0.5, 1.0) == 0.0
    assert cycle_rest(10.0, 0.5) == MAX_REST_S
    assert cycle_rest(-1.0, 0.5) == 0.0  # a clock step backwards is no reason to rest


@pytest.mark.parametrize("duty", [0.0, -0.5, 1.5])
def test_a_duty_outside_zero_to_one_is_refused(duty: float) -> None:
    with pytest.raises(ValueError, match="a share of the time"):
        cycle_rest(0.01, duty)


def test_the_duty_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEPLUS_SCHEDULE_DUTY", "0.25")
    assert SolverSettings.from_env().schedule_duty == 0.25
    monkeypatch.delenv("ONEPLUS_SCHEDULE_DUTY")
    assert SolverSettings.from_env().schedule_duty == 0.5


@pytest.mark.parametrize("value", ["0", "2", "1.01", "half"])
def test_a_duty_out_of_range_in_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ONEPLUS_SCHEDULE_DUTY", value)
    with pytest.raises(ValueError, match="ONEPLUS_SCHEDULE_DUTY"):
        SolverSettings.from_env()
