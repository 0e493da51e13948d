"""Each service's settings: one typed object from the `ONEPLUS_*` environment, and a bad value stops the service at
start with one line that names the variable and the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from oneplus_bus.config import ServiceSettings, SettingsError
from oneplus_intake.settings import IntakeSettings
from oneplus_node_executor.settings import ExecutorSettings
from oneplus_placement_solver.settings import SolverSettings
from oneplus_preemption.settings import PreemptionSettings
from oneplus_topology_registry.settings import RegistrySettings

# (settings class, its service's module, a bad variable, its value, the line's explanation)
BAD_VALUES: list[tuple[type[ServiceSettings], str, str, str, str]] = [
    (IntakeSettings, "oneplus_intake", "ONEPLUS_SUBMIT_WORKERS", "x", "not an integer"),
    (RegistrySettings, "oneplus_topology_registry", "ONEPLUS_NODE_LOST_AFTER_S", "soon", "not a number"),
    (SolverSettings, "oneplus_placement_solver", "ONEPLUS_SOLVER_LEASE_S", "1", "must be between 2.0 and 300.0"),
    (ExecutorSettings, "oneplus_node_executor", "ONEPLUS_KEEP_FINISHED", "-1", "must be at least 0"),
]


@pytest.mark.parametrize(
    ("cls", "module", "name", "value", "why"), BAD_VALUES, ids=lambda v: getattr(v, "__name__", None)
)
def test_a_bad_value_is_one_line_naming_the_variable_and_the_value(
    cls: type[ServiceSettings], module: str, name: str, value: str, why: str
) -> None:
    with pytest.raises(SettingsError) as err:
        cls.load({name: value})
    assert str(err.value) == f"{name}={value!r}: {why}"


@pytest.mark.parametrize(
    ("module", "name", "value", "why"), [(m, n, v, w) for _, m, n, v, w in BAD_VALUES], ids=lambda v: str(v)
)
def test_a_service_with_a_bad_value_exits_at_start_with_that_line(module: str, name: str, value: str, why: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPLUS_")} | {name: value, "ONEPLUS_NODE": "n0"}
    # No NATS is reachable at this address: a service that got past its settings would hang or fail differently.
    env["NATS_URL"] = "nats://127.0.0.1:1"
    proc = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {name}={value!r}: {why}"]


def test_the_preemption_forwarder_has_no_variables_of_its_own_and_checks_the_scaffolds_at_start() -> None:
    assert PreemptionSettings.model_fields == {}  # the queue tree is the owner's alone
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPLUS_")} | {"ONEPLUS_STREAM_REPLICAS": "x"}
    env["NATS_URL"] = "nats://127.0.0.1:1"
    proc = subprocess.run(
        [sys.executable, "-m", "oneplus_preemption"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: ONEPLUS_STREAM_REPLICAS='x' is not a whole number (1, or 3 on a cluster)"
    ]


def test_settings_read_the_process_environment_with_the_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues: []\n")
    monkeypatch.setenv("ONEPLUS_SOLVER_REPLICA", "solver-b")
    monkeypatch.setenv("ONEPLUS_MIN_JOB_AGE_S", "7")
    monkeypatch.setenv("ONEPLUS_QUEUES_FILE", str(queues))
    monkeypatch.setenv("ONEPLUS_HTTP_PORT", "")  # empty: the default
    solver = SolverSettings.load()
    assert (solver.replica, solver.min_job_age_s, solver.queues_file) == ("solver-b", 7.0, str(queues))
    assert IntakeSettings.load().http_port == 8080
    monkeypatch.setenv("ONEPLUS_SOLVER_REPLICA", "solver b")
    with pytest.raises(SettingsError, match=r"^ONEPLUS_SOLVER_REPLICA='solver b': letters, digits"):
        SolverSettings.load()


def test_a_bad_boolean_and_a_bad_imex_channel_are_named() -> None:
    with pytest.raises(SettingsError, match=r"^ONEPLUS_SIMULATION='maybe': not a boolean"):
        ExecutorSettings.load({"ONEPLUS_SIMULATION": "maybe"})
    with pytest.raises(SettingsError, match=r"^ONEPLUS_IMEX_CHANNEL='x': give a channel number"):
        ExecutorSettings.load({"ONEPLUS_IMEX_CHANNEL": "x"})
    assert ExecutorSettings.load({"ONEPLUS_IMEX_CHANNEL": "none"}).imex is None


def test_the_intake_builds_its_token_book_and_accounts_from_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONEPLUS_HTTP_TOKENS", "nlp=0123456789abcdef0123456789abcdef")
    monkeypatch.setenv("ONEPLUS_PLATFORM_ACCOUNTS", "OPS, X")
    monkeypatch.setenv("ONEPLUS_HTTP_PORT", "off")
    s = IntakeSettings.load()
    assert (s.http_tokens.teams, s.platform_accounts, s.http_port) == ({"nlp"}, {"OPS", "X"}, None)
    monkeypatch.setenv("ONEPLUS_HTTP_TOKENS", "nlp=short")
    with pytest.raises(SettingsError, match=r"^ONEPLUS_HTTP_TOKENS: entry 1: a token must be at least 16"):
        IntakeSettings.load()


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("ONEPLUS_STREAM_REPLICAS", "x", "ONEPLUS_STREAM_REPLICAS='x' is not a whole number (1, or 3 on a cluster)"),
        ("ONEPLUS_MAX_DELIVER", "0", "ONEPLUS_MAX_DELIVER='0': a whole number of deliveries, 1 or more"),
    ],
)
def test_a_bad_scaffold_value_also_stops_a_service_at_start(name: str, value: str, line: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPLUS_")} | {name: value}
    env["NATS_URL"] = "nats://127.0.0.1:1"
    proc = subprocess.run(
        [sys.executable, "-m", "oneplus_preemption"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [f"error: {line}"])
