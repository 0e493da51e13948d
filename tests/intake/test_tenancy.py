"""Where a request's team comes from (pure): the NATS account's stamp, else the Oneplus-Team header."""

from __future__ import annotations

import json

import pytest
from oneplus_bus.tenancy import Caller, TenancyError, bind_team, caller_of
from oneplus_contracts import JobSpec
from oneplus_intake.settings import IntakeSettings, SettingsError


def stamp(acc: str, user: str = "nlp-ci") -> dict[str, str]:
    """What nats-server puts on a request that crossed a `share: true` service import."""
    return {"Nats-Request-Info": json.dumps({"acc": acc, "user": user, "kind": "Client", "id": 9})}


def spec(**kw: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "resources": {"gpus": 1}, **kw})


def test_a_team_account_is_the_team_and_its_user_is_known() -> None:
    caller = caller_of(stamp("nlp"))
    assert caller == Caller(team="nlp", user="nlp-ci", account="nlp") and caller.bound


def test_a_team_account_cannot_claim_another_team_by_header_or_payload() -> None:
    with pytest.raises(TenancyError, match="acts for team 'nlp' only, not 'vision'") as err:
        caller_of({**stamp("nlp"), "Oneplus-Team": "vision"})
    assert err.value.code == 403
    with pytest.raises(TenancyError, match="not 'vision'"):
        caller_of(stamp("nlp"), "vision")
    assert caller_of({**stamp("nlp"), "oneplus-team": "nlp"}).team == "nlp", "naming its own team is fine"


def test_inside_the_platform_account_the_header_is_the_team_and_no_header_is_an_operator() -> None:
    assert caller_of({"Oneplus-Team": "nlp"}) == Caller(team="nlp")
    assert caller_of({}) == Caller(team=None) and caller_of(None).sees("anyone")
    assert caller_of({**stamp("PLATFORM", "admin"), "Oneplus-Team": "vision"}).team == "vision"
    assert caller_of(stamp("OPS"), platform_accounts=frozenset({"OPS"})).team is None


def test_header_and_payload_that_disagree_or_a_bad_stamp_are_400() -> None:
    with pytest.raises(TenancyError, match="says 'nlp'") as err:
        caller_of({"Oneplus-Team": "nlp"}, "vision")
    assert err.value.code == 400
    with pytest.raises(TenancyError, match="must be a string"):
        caller_of({}, ["nlp"])
    with pytest.raises(TenancyError, match="not JSON"):
        caller_of({"Nats-Request-Info": "{acc"})
    with pytest.raises(TenancyError, match="JSON object"):
        caller_of({"Nats-Request-Info": "[]"})


def test_bind_team_fills_the_default_team_and_user_and_refuses_another_team() -> None:
    bound = bind_team(spec(), Caller(team="nlp", user="nlp-ci", account="nlp"))
    assert (bound.team, bound.user) == ("nlp", "nlp-ci")
    assert bind_team(spec(user="alice"), Caller(team="nlp", user="nlp-ci", account="nlp")).user == "alice"
    assert bind_team(spec(team="vision"), Caller(team=None)).team == "vision", "an operator submits for any team"
    with pytest.raises(TenancyError, match="names team 'vision' but the request comes from team 'nlp'"):
        bind_team(spec(team="vision"), Caller(team="nlp"))


def test_an_account_name_that_is_no_valid_team_name_is_a_clear_error() -> None:
    with pytest.raises(TenancyError, match="not a valid name"):
        bind_team(spec(), Caller(team="team with spaces", account="team with spaces"))


def test_settings_from_the_environment() -> None:
    s = IntakeSettings.from_env({})
    assert (s.http_host, s.http_port, s.http_port_explicit, s.mlflow_secret) == ("127.0.0.1", 8080, False, "")
    s = IntakeSettings.from_env({"ONEPLUS_HTTP_PORT": "9000", "ONEPLUS_PLATFORM_ACCOUNTS": "OPS, $G"})
    assert s.http_port == 9000 and s.http_port_explicit and s.platform_accounts == {"OPS", "$G"}
    assert IntakeSettings.from_env({"ONEPLUS_HTTP_PORT": "off"}).http_port is None
    with pytest.raises(SettingsError, match="ONEPLUS_HTTP_PORT='http': not an integer"):
        IntakeSettings.from_env({"ONEPLUS_HTTP_PORT": "http"})
    with pytest.raises(SettingsError, match="between 1 and 86400"):
        IntakeSettings.from_env({"ONEPLUS_MLFLOW_REPLAY_WINDOW_S": "0"})
