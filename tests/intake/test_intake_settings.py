"""The intake's own settings from the environment: each bad value refused by name, the defaults kept."""

from __future__ import annotations

import pytest
from oneplus_intake.settings import SUBMIT_WORKERS, IntakeSettings, SettingsError, submit_workers


def test_submission_concurrency_comes_from_the_environment_or_the_default() -> None:
    assert IntakeSettings.from_env({}).submit_workers == SUBMIT_WORKERS
    assert IntakeSettings.from_env({"ONEPLUS_SUBMIT_WORKERS": "300"}).submit_workers == 300
    assert submit_workers(IntakeSettings(submit_workers=7)) == 7


@pytest.mark.parametrize(
    ("raw", "why"), [("many", "not an integer"), ("0", "between 1 and 4096"), ("5000", "between 1 and 4096")]
)
def test_a_bad_submission_concurrency_is_refused_by_name(raw: str, why: str) -> None:
    with pytest.raises(SettingsError, match=f"ONEPLUS_SUBMIT_WORKERS.*{why}"):
        IntakeSettings.from_env({"ONEPLUS_SUBMIT_WORKERS": raw})
