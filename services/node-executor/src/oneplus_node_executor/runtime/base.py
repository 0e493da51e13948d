"""The interface between the executor's handlers and whatever actually runs the ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from oneplus_contracts import LaunchRanks


class EngineUnavailable(RuntimeError):
    """The container engine cannot be reached; the node is unhealthy until it returns."""


class LaunchFailed(RuntimeError):
    """The ranks could not be started (image missing, bad command); the reason is for the user."""


class StaleToken(LaunchFailed):
    """A launch carries an older fencing token than ranks this node already holds for the job; nothing started."""


@dataclass(frozen=True)
class RunningRanks:
    """What a runtime finds running for one job on this node (used to reconcile after a restart)."""

    job_id: str
    token: int
    ranks: tuple[int, ...]
    handles: tuple[str, ...] = ()
    exited: bool = False  # every rank has ended but is still on the node: its exit may not be reported yet


@dataclass
class RanksExit:
    """How one job's local ranks ended."""

    exit_code: int
    reason: str
    per_rank: dict[int, int] = field(default_factory=dict)
    checkpointed: bool = False
    checkpoint_ts: float | None = None


class Runtime(Protocol):
    name: str

    async def launch(self, cmd: LaunchRanks, env_per_rank: dict[int, dict[str, str]]) -> None:
        """Start every local rank of `cmd`. Idempotent by (job, rank, token): a second call starts nothing."""

    async def wait(self, job_id: str) -> RanksExit:
        """Wait until every local rank of the job has exited."""

    async def signal(self, job_id: str, signal: str) -> None: ...

    async def checkpoint_acknowledged(self, job_id: str) -> float | None:
        """The time the job acknowledged its checkpoint (marker or event), or None if not yet."""

    async def stop(self, job_id: str, grace_s: float) -> None:
        """Stop the ranks: SIGTERM, wait up to grace_s, then kill."""

    async def remove(self, job_id: str, token: int | None = None) -> int:
        """Delete the job's ranks on this node (of one token, or all) and their logs; returns how many."""

    async def list_running(self) -> list[RunningRanks]: ...

    async def logs(self, job_id: str, rank: int | None, follow: bool) -> list[str]: ...

    async def healthy(self) -> tuple[bool, str | None]: ...

    async def close(self) -> None: ...


@runtime_checkable
class LauncherRuntime(Protocol):
    """A runtime that can start an MPIJob's launcher beside the ranks of its first node (the container runtime)."""

    async def launch_launcher(self, cmd: LaunchRanks, env: dict[str, str]) -> None: ...
