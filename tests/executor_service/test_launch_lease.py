"""A launch's fencing check is its lease renewal: one store round trip, and another only after a slow start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from executor_fakes import executor, placed, spec
from oneplus_bus.settings import BusSettings
from oneplus_contracts import LaunchRanks
from oneplus_node_executor import fleet as fleet_module
from oneplus_node_executor import node as node_module
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_testing import until
from oneplus_topology.presets import load_preset


class SlowStart(SimulatedRuntime):
    """An engine that takes a while to start the ranks (an image pull)."""

    async def launch(self, cmd: LaunchRanks, env: dict[str, str]) -> None:
        await asyncio.sleep(0.3)
        await super().launch(cmd, env)


async def test_a_launch_renews_its_lease_once_as_its_token_check() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-l1", spec(simulate={"duration_s": 5}))
    await ex.launch(cmd)
    await until(lambda: "running" in svc.ledger.types("j-l1"))
    assert store.renewals == [("j-l1", cmd.token)]
    await rt.close()


async def test_a_stale_token_starts_nothing_and_reports_nothing() -> None:
    rt = SimulatedRuntime()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-l2", spec(simulate={"duration_s": 5}))
    store.tokens["j-l2"] = cmd.token + 1  # a newer attempt holds the reservation
    await ex.launch(cmd)
    assert "starting" not in svc.ledger.types("j-l2") and "j-l2" not in ex.tokens
    assert store.renewals == [("j-l2", cmd.token)], "the refused renewal was the check"
    await rt.close()


async def test_a_slow_start_renews_the_lease_again_once_the_ranks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_module, "LEASE_S", 0.8)  # a quarter of it is shorter than the start
    rt = SlowStart()
    ex, svc, store = executor(rt)
    cmd = await placed(svc, store, "j-l3", spec(simulate={"duration_s": 5}))
    await ex.launch(cmd)
    await until(lambda: "running" in svc.ledger.types("j-l3"))
    assert store.renewals[:2] == [("j-l3", cmd.token), ("j-l3", cmd.token)]
    await rt.close()


async def test_a_node_remembers_only_its_last_ended_attempts_and_a_fleet_node_fewer(tmp_path: Path) -> None:
    rt = SimulatedRuntime()
    ex, _, _ = executor(rt)
    assert ex.remember_ends == node_module.REMEMBER_ENDS
    ex.remember_ends = 2
    for i in range(3):
        await ex.node_finished(f"j-e{i}", 1, 0, "exited")
    assert list(ex.ends) == [("j-e1", 1), ("j-e2", 1)], "the oldest is forgotten first"
    await rt.close()
    nodes = [load_preset("h100_sxm_8gpu_nvswitch_nv18", f"fn-{i}") for i in range(2)]
    fleet = fleet_module.SimulatedFleet(
        nodes, BusSettings("nats://127.0.0.1:1", "redis://127.0.0.1:1"), state_dir=tmp_path
    )
    assert {e.remember_ends for e in fleet.executors.values()} == {fleet_module.FLEET_REMEMBER_ENDS}
    assert fleet_module.FLEET_REMEMBER_ENDS < node_module.REMEMBER_ENDS
