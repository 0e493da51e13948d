"""The suite runs under pytest-xdist (`task test`: -n 2): each worker has NATS and Redis of its own, and a run
that would share servers between workers (NATS_URL / REDIS_URL set) is refused with one clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId
from oneplus_testing import give_items_their_own_ids, parallel_refusal, planned_workers

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def run_pytest(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest in a child process with the suite's conftest as a plugin, on test files outside tests/."""
    # Not this run's servers nor its xdist worker identity (this test may itself run on a worker).
    base = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL") and not k.startswith("PYTEST_")}
    base["PYTHONPATH"] = os.pathsep.join([str(TESTS), base.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "-p", "conftest"]
    argv += ["-p", "no:cacheprovider"]
    return subprocess.run(
        [*argv, *args], cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_worker_count_comes_from_dist_and_tx() -> None:
    assert planned_workers("no", []) == 1
    assert planned_workers("load", ["popen", "popen"]) == 2  # what -n 2 sets
    assert planned_workers("loadgroup", ["3*popen"]) == 3
    assert planned_workers("load", []) == 1


def test_shared_servers_refuse_more_than_one_worker_and_name_the_variable() -> None:
    assert parallel_refusal(1, {"NATS_URL": "nats://h:4222", "REDIS_URL": "redis://h:6379"}) is None
    assert parallel_refusal(2, {}) is None
    assert parallel_refusal(2, {"NATS_URL": ""}) is None  # set but empty: the embedded default
    why = parallel_refusal(2, {"REDIS_URL": "redis://h:6379"})
    assert why is not None and why.startswith("REDIS_URL is set and 2 pytest-xdist workers")
    assert "\n" not in why and "uv run task test`" in why
    both = parallel_refusal(4, {"NATS_URL": "nats://h:4222", "REDIS_URL": "redis://h:6379"})
    assert both is not None and both.startswith("NATS_URL and REDIS_URL are set and 4 pytest-xdist workers")


def test_a_parallel_run_against_shared_servers_stops_before_any_test(tmp_path: Path) -> None:
    (tmp_path / "test_wipes.py").write_text("def test_x(servers):\n    raise AssertionError('must not run')\n")
    done = run_pytest(["-n", "2", "test_wipes.py"], tmp_path, NATS_URL="nats://127.0.0.1:1")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "NATS_URL is set and 2 pytest-xdist workers were asked for" in done.stderr
    assert "must not run" not in done.stdout


def test_each_worker_starts_nats_and_redis_of_its_own(tmp_path: Path) -> None:
    """--dist each: the same test on both workers; each writes the servers it got."""
    (tmp_path / "test_where.py").write_text(
        "from pathlib import Path\n"
        "def test_where(servers, worker_id):\n"
        f"    Path({str(tmp_path)!r}, worker_id).write_text(servers.nats_url + ' ' + servers.redis_url)\n"
    )
    done = run_pytest(["-n", "2", "--dist", "each", "-q", "test_where.py"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = {w: (tmp_path / w).read_text().split() for w in ("gw0", "gw1")}
    assert seen["gw0"][0] != seen["gw1"][0], seen  # NATS
    assert seen["gw0"][1] != seen["gw1"][1], seen  # Redis


def test_state_files_stay_in_the_sessions_own_folder(state_home: Path) -> None:
    """An executor made without a state dir (tests/e2e/test_trace_in_memory.py) keeps its outbox here, not in ~."""
    from oneplus_node_executor.outbox import state_dir_from_env

    assert os.environ["XDG_STATE_HOME"] == str(state_home)
    assert state_dir_from_env("executor-mem-0").parent.parent == state_home
    assert not state_dir_from_env("x").is_relative_to(Path.home() / ".local" / "state")


class _Item:
    """What give_items_their_own_ids reads of a pytest item: its name and its node id."""

    def __init__(self, name: str, nodeid: str) -> None:
        self.name = name
        self._id = NodeId.parse(nodeid)

    @property
    def nodeid(self) -> str:
        return str(self._id)


def test_a_modules_tests_run_on_one_worker_and_a_group_mark_still_wins(tmp_path: Path) -> None:
    """--dist loadgroup: a module's tests without a group share one worker (its module-scoped platform starts once,
    and a test reading what an earlier one left finds it); `xdist_group` marks keep their own group."""
    for name in ("alpha", "beta"):
        (tmp_path / f"test_{name}.py").write_text(
            "import pytest\n"
            "from pathlib import Path\n"
            "@pytest.mark.parametrize('i', range(6))\n"
            f"def test_{name}(i, worker_id):\n"  # outside the rootdir an id has no file part: names must differ
            f"    Path({str(tmp_path)!r}, '{name}-' + str(i)).write_text(worker_id)\n"
            "@pytest.mark.xdist_group('faults')\n"
            f"def test_{name}_fault(worker_id):\n"
            f"    Path({str(tmp_path)!r}, 'fault-{name}').write_text(worker_id)\n"
        )
    done = run_pytest(["-n", "2", "--dist", "loadgroup", "-q", "test_alpha.py", "test_beta.py"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "14 passed" in done.stdout, done.stdout
    for name in ("alpha", "beta"):
        assert len({(tmp_path / f"{name}-{i}").read_text() for i in range(6)}) == 1, name
    assert (tmp_path / "fault-alpha").read_text() == (tmp_path / "fault-beta").read_text()


def test_an_item_whose_id_lost_its_brackets_gets_them_back_and_xdist_sees_every_case() -> None:
    """schemathesis's per-operation items on pytest 9.2: the operation is in the name only, not in the id."""
    cases = [_Item(f"test_fuzz[{op}]", "t.py::test_fuzz") for op in ("GET /v1/jobs", "POST /v1/jobs")]
    plain = [_Item("test_a[1]", "t.py::test_a[1]"), _Item("test_b", "t.py::test_b")]
    give_items_their_own_ids([*cases, *plain])  # type: ignore[list-item]
    assert [i.nodeid for i in cases] == ["t.py::test_fuzz[GET /v1/jobs]", "t.py::test_fuzz[POST /v1/jobs]"]
    assert [i.nodeid for i in plain] == ["t.py::test_a[1]", "t.py::test_b"]


def test_two_tests_under_one_id_stop_the_run_with_the_id_named() -> None:
    twins = [_Item("test_x", "t.py::test_x"), _Item("test_x", "t.py::test_x"), _Item("test_y", "t.py::test_y")]
    with pytest.raises(pytest.UsageError, match=r"^1 test id\(s\) name more than one test.*: t\.py::test_x$"):
        give_items_their_own_ids(twins)  # type: ignore[arg-type]
