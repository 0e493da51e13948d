"""The layers hold: the bus is transport only, and the node executor never loads the solver's libraries."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The libraries that decide (placement pulls OR-Tools); transport and executors sit below or beside them.
DOMAIN_LIBS = ("oneplus-placement", "oneplus-queueing", "oneplus-stores", "oneplus-jobformats", "oneplus-sim")
SOLVER_MODULES = ("ortools", "oneplus_placement", "oneplus_queueing", "oneplus_stores")

# Imports every module of a package (its __main__ aside, which would start the service) and prints which of the
# solver's modules ended up loaded.
_PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted(name for name in sys.argv[2:] if name in sys.modules)))
"""


def _dependencies(pyproject: Path) -> list[str]:
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def _loaded(package: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, package, *SOLVER_MODULES], capture_output=True, text=True, check=True
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_bus_depends_on_no_domain_library() -> None:
    deps = _dependencies(ROOT / "libs/bus/pyproject.toml")
    assert [d for d in deps if d.split("[")[0].split(">")[0].strip() in DOMAIN_LIBS] == [], deps


def test_node_executor_package_depends_on_no_solver_library() -> None:
    deps = _dependencies(ROOT / "services/node-executor/pyproject.toml")
    assert [d for d in deps if d.split("[")[0].split(">")[0].strip() in DOMAIN_LIBS] == [], deps


def test_bus_modules_load_no_solver_library() -> None:
    assert _loaded("oneplus_bus") == []


def test_node_executor_modules_load_no_solver_library() -> None:
    assert _loaded("oneplus_node_executor") == []
