"""The preemption handshake over the runtime protocol: signal, wait for the acknowledgement up to the grace, stop."""

from __future__ import annotations

import pytest
from oneplus_contracts import LaunchRanks
from oneplus_node_executor.runtime.base import RanksExit, RunningRanks
from oneplus_node_executor.runtime.preemption import preempt_with_checkpoint


class ScriptedRanks:
    """Acknowledges the checkpoint `ack_after` polls after the signal (never when None); records what it was told."""

    name = "scripted"

    def __init__(self, ack_after: int | None) -> None:
        self.ack_after = ack_after
        self.calls: list[str] = []
        self.polls = 0

    async def launch(self, cmd: LaunchRanks, env_per_rank: dict[int, dict[str, str]]) -> None:
        raise AssertionError("not used")

    async def wait(self, job_id: str) -> RanksExit:
        raise AssertionError("not used")

    async def signal(self, job_id: str, signal: str) -> None:
        self.calls.append(f"signal {signal}")

    async def checkpoint_acknowledged(self, job_id: str) -> float | None:
        self.polls += 1
        return 1234.5 if self.ack_after is not None and self.polls > self.ack_after else None

    async def stop(self, job_id: str, grace_s: float) -> None:
        self.calls.append(f"stop {grace_s:g}")

    async def list_running(self) -> list[RunningRanks]:
        return []

    async def logs(self, job_id: str, rank: int | None, follow: bool) -> list[str]:
        return []

    async def healthy(self) -> tuple[bool, str | None]:
        return True, None

    async def close(self) -> None:
        return None


async def test_acknowledged_checkpoint_ends_the_wait_early_then_stops() -> None:
    ranks = ScriptedRanks(ack_after=2)
    out = await preempt_with_checkpoint(ranks, "j", signal="SIGUSR1", grace_s=30, poll_s=0.01, stop_grace_s=5)
    assert out.acknowledged and out.checkpoint_ts == 1234.5
    assert out.waited_s < 5
    assert ranks.calls == ["signal SIGUSR1", "stop 5"]


async def test_no_acknowledgement_waits_the_grace_then_stops_anyway() -> None:
    ranks = ScriptedRanks(ack_after=None)
    out = await preempt_with_checkpoint(ranks, "j", signal="SIGUSR2", grace_s=0.2, poll_s=0.05)
    assert not out.acknowledged and out.checkpoint_ts is None
    assert 0.2 <= out.waited_s < 1.0
    assert ranks.calls == ["signal SIGUSR2", "stop 10"]


async def test_negative_grace_is_refused() -> None:
    with pytest.raises(ValueError, match="grace_s=-1"):
        await preempt_with_checkpoint(ScriptedRanks(None), "j", signal="SIGUSR1", grace_s=-1)
