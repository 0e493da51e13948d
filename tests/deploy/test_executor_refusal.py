"""An executor deployed without flags no longer registers a fake H100 whose jobs 'succeed': it refuses to start
unless it is given its topology and runtime, or told it is a simulation."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from oneplus_node_executor.app import SIMULATION_TOPOLOGY, parse_args

NO_ENV = ("ONEPLUS_TOPOLOGY", "ONEPLUS_RUNTIME", "ONEPLUS_SIMULATION", "ONEPLUS_NODE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in NO_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("argv", "missing"),
    [
        ([], "no --topology and no --runtime given"),
        (["--topology", "nvml"], "no --runtime given"),
        (["--runtime", "docker"], "no --topology given"),
    ],
)
def test_a_node_without_topology_or_runtime_is_refused(
    argv: list[str], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--node", "gpu-0", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert missing in err and "--simulate or ONEPLUS_SIMULATION=1" in err


def test_the_refusal_is_the_process_exit() -> None:
    env = {k: v for k, v in os.environ.items() if k not in NO_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "oneplus_node_executor", "--node", "gpu-0"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "no --topology and no --runtime given" in out.stderr


def test_a_simulation_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    a = parse_args(["--node", "sim-0", "--simulate"])
    assert (a.topology, a.runtime) == (SIMULATION_TOPOLOGY, "simulated")
    monkeypatch.setenv("ONEPLUS_SIMULATION", "1")
    a = parse_args(["--node", "sim-0", "--topology", "a100_sxm_8gpu_nvswitch"])
    assert (a.topology, a.runtime) == ("a100_sxm_8gpu_nvswitch", "simulated")


def test_explicit_topology_and_runtime_need_no_simulation_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the dev stack, the secured-platform tests and the engine tests pass.
    a = parse_args(["--node", "h100-0", "--topology", SIMULATION_TOPOLOGY, "--runtime", "simulated"])
    assert (a.topology, a.runtime, a.simulate) == (SIMULATION_TOPOLOGY, "simulated", False)
    # The DaemonSet's way: the environment.
    monkeypatch.setenv("ONEPLUS_NODE", "gpu-7")
    monkeypatch.setenv("ONEPLUS_TOPOLOGY", "nvml")
    monkeypatch.setenv("ONEPLUS_RUNTIME", "docker")
    a = parse_args([])
    assert (a.node, a.topology, a.runtime) == ("gpu-7", "nvml", "docker")
