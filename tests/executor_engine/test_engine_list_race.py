"""A listing that races a container's exit is asked again; no engine is needed for this test.

CI met Podman 4.3 (Debian 12's) failing `GET /containers/json` with 500 "read /proc/15378/cgroup: no such process"
while a rank restarted (containers/podman#16383, fixed in 4.4): a rank's wait read that as an engine error.
"""

from __future__ import annotations

from typing import Any

import aiodocker
import pytest
from oneplus_node_executor.runtime.docker import LIST_RACE_TRIES, DockerRuntime

RACE = "read /proc/15378/cgroup: no such process"


class Containers:
    """`containers.list` failing `failures` times with `status` / `message`, then listing nothing."""

    def __init__(self, failures: int, message: str = RACE, status: int = 500) -> None:
        self.failures, self.message, self.status = failures, message, status
        self.calls = 0

    async def list(self, **_: Any) -> list[Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise aiodocker.DockerError(self.status, {"message": self.message})
        return []


class Engine:
    def __init__(self, containers: Containers) -> None:
        self.containers = containers


def runtime_over(containers: Containers, monkeypatch: pytest.MonkeyPatch) -> DockerRuntime:
    rt = DockerRuntime("unix:///nowhere/engine.sock", node="n")
    monkeypatch.setattr(rt, "_client", lambda: Engine(containers))
    return rt


async def test_a_listing_that_raced_an_exit_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    containers = Containers(failures=LIST_RACE_TRIES - 1)
    assert await runtime_over(containers, monkeypatch).list_managed() == []
    assert containers.calls == LIST_RACE_TRIES


async def test_a_race_that_keeps_failing_is_the_engine_error_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    containers = Containers(failures=LIST_RACE_TRIES + 5)
    with pytest.raises(aiodocker.DockerError, match="no such process"):
        await runtime_over(containers, monkeypatch).list_managed()
    assert containers.calls == LIST_RACE_TRIES


@pytest.mark.parametrize(("status", "message"), [(500, "database is locked"), (404, "no such process")])
async def test_other_engine_errors_are_not_asked_again(
    status: int, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    containers = Containers(failures=1, message=message, status=status)
    with pytest.raises(aiodocker.DockerError, match=message):
        await runtime_over(containers, monkeypatch).list_managed()
    assert containers.calls == 1
