"""A simulated node simulates an MPS daemon, so GPU shares (isolated under MPS) run on the dev stack and the fleet."""

from __future__ import annotations

from oneplus_contracts import MpsDaemon
from oneplus_node_executor.app import simulated_node
from oneplus_node_executor.fleet import SimulatedFleet
from oneplus_topology.presets import load_preset


def test_a_simulated_node_reports_an_mps_daemon_and_keeps_one_it_was_given() -> None:
    topo = load_preset("l40s_8gpu_pcie_node_sys", "l40s-0")
    assert topo.mps is None
    assert simulated_node(topo).mps == MpsDaemon()
    mine = topo.model_copy(update={"mps": MpsDaemon(pipe_directory="/run/mps")})
    assert simulated_node(mine).mps == MpsDaemon(pipe_directory="/run/mps")


def test_every_node_of_a_simulated_fleet_runs_mps() -> None:
    nodes = [load_preset("h100_sxm_8gpu_nvswitch_nv18", f"h100-{i}") for i in range(2)]
    fleet = SimulatedFleet(nodes, name="mps")
    assert all(ex.topology.mps is not None for ex in fleet.executors.values())
