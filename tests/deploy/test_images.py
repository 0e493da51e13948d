"""The Dockerfile and compose.yaml, checked without Docker (it does not run here): every COPY source exists, the
runtime stage runs as an unprivileged user, each service's image installs the workspace package its command comes
from, and every service has a health check that runs the real probe."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line.removesuffix("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            lines.append((word.upper(), rest.strip()))
            pending = ""
    return lines


def stages() -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for word, rest in instructions():
        if word == "FROM":
            m = re.fullmatch(r"(\S+)(?: AS (\S+))?", rest, flags=re.IGNORECASE)
            assert m and m.group(2), f"every stage is named: FROM {rest}"
            current = m.group(2)
            out[current] = []
        else:
            assert current, f"{word} before FROM"
            out[current].append((word, rest))
    return out


def workspace_packages() -> dict[str, Path]:
    """Workspace member name -> its directory."""
    found = {"oneplus": ROOT}
    for pyproject in [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]:
        found[tomllib.loads(pyproject.read_text())["project"]["name"]] = pyproject.parent
    return found


def test_the_image_is_multi_stage_and_the_runtime_copies_only_the_environment() -> None:
    s = stages()
    assert list(s) == ["build", "runtime"]
    copies = [rest for word, rest in s["runtime"] if word == "COPY"]
    assert copies == ["--from=build /app/.venv /app/.venv"]
    sync = "uv sync --frozen --no-dev --no-editable --package"
    assert any(word == "RUN" and sync in rest for word, rest in s["build"])


def test_every_copied_path_exists() -> None:
    for stage in stages().values():
        for word, rest in stage:
            if word in {"COPY", "ADD"} and not rest.startswith("--from"):
                *sources, _ = shlex.split(rest)
                for src in sources:
                    assert (ROOT / src).exists(), f"COPY {src}: no such path"


def test_the_runtime_stage_runs_as_an_unprivileged_user() -> None:
    users = [rest for word, rest in stages()["runtime"] if word == "USER"]
    assert users, "no USER: the services would run as root"
    uid = users[-1].split(":")[0]
    assert uid not in {"0", "root"} and int(uid) >= 1000


def test_the_default_package_is_the_whole_platform_for_the_tools_image() -> None:
    args = [rest for word, rest in stages()["build"] if word == "ARG"]
    assert "PACKAGE=oneplus" in args
    # The simulator's heavy dependencies come with oneplus-sim, which no service needs.
    for name, path in workspace_packages().items():
        if name.startswith("oneplus-") and path.parent.name == "services":
            deps = " ".join(tomllib.loads((path / "pyproject.toml").read_text())["project"]["dependencies"])
            assert "oneplus-sim" not in deps and "matplotlib" not in deps and "pandas" not in deps, name


def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_each_service_image_holds_the_package_its_command_runs() -> None:
    packages = workspace_packages()
    for name, svc in compose()["services"].items():
        if "build" not in svc:
            continue
        package = svc["build"]["args"]["PACKAGE"]
        assert package in packages, f"{name}: PACKAGE={package} is not a workspace member"
        command = svc["command"]
        assert command[:2] == ["python", "-m"], name
        module = command[2]
        assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
        src = packages[package] / "src" / module
        assert (src / "__main__.py").exists(), f"{name}: {module} is not in {package} or has no __main__"


def test_every_service_has_a_real_health_check() -> None:
    services = compose()["services"]
    for name, svc in services.items():
        test = svc.get("healthcheck", {}).get("test")
        assert test, f"{name} has no health check"
        if "build" in svc:
            assert test[:4] == ["CMD", "python", "-m", "oneplus_bus.health"], name
            assert f"oneplus-{test[4]}" == svc["build"]["args"]["PACKAGE"], name
        for dep, cond in svc.get("depends_on", {}).items():
            assert cond == {"condition": "service_healthy"} and "healthcheck" in services[dep], f"{name} -> {dep}"


def test_compose_executors_are_declared_simulations() -> None:
    for name, svc in compose()["services"].items():
        if svc.get("command", [None, None, None])[2:3] == ["oneplus_node_executor"]:
            cmd = svc["command"]
            assert "--topology" in cmd and "--runtime" in cmd, name
