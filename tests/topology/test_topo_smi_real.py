"""The parser on the six real `nvidia-smi topo -m` captures: facts read off each file by hand."""

from __future__ import annotations

import pytest
from oneplus_contracts import NicInfo, NodeTopology
from oneplus_topology.analysis import nvlink_groups, pcie_switch_groups, rails
from topology_cases import REAL_FILES, kind
from topology_cases import parse_file as parsed


def nic(topo: NodeTopology, name: str) -> NicInfo:
    return next(n for n in topo.nics if n.name == name)


@pytest.mark.parametrize("name", REAL_FILES)
def test_every_real_file_gives_one_link_per_gpu_pair(name: str) -> None:
    topo = parsed(name)
    n = len(topo.gpus)
    assert [(lk.a, lk.b) for lk in topo.links] == [(a, b) for a in range(n) for b in range(a + 1, n)]
    assert all(lk.gbps > 0 for lk in topo.links)
    assert topo.source == "nvidia-smi"


def test_h100_is_nv18_all_to_all_on_two_numa_nodes() -> None:
    topo = parsed("h100_sxm_8gpu_nvswitch_nv18")
    assert topo.gpu_model == "H100"
    assert {lk.kind for lk in topo.links} == {"NV18"}
    assert {lk.gbps for lk in topo.links} == {450.0}
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.gpus[0].cpu_affinity == "0-51,104-155"
    assert topo.gpus[7].cpu_affinity == "52-103,156-207"
    assert topo.cpus == 208
    assert topo.nics == []
    assert all(g.nvlinks_total == g.nvlinks_active == 18 for g in topo.gpus)
    assert nvlink_groups(topo) == [list(range(8))]


def test_dgx_a100_nv12_nps4_numa_and_pxb_nic_pairs() -> None:
    topo = parsed("dgx_a100_8gpu_nv12_12nic")
    assert topo.gpu_model == "A100"
    assert kind(topo, 0, 1) == "NV12"
    assert kind(topo, 3, 6) == "NV12"
    assert topo.links[0].gbps == 300.0
    assert [g.numa_node for g in topo.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert topo.gpus[4].numa_node == 7
    assert topo.gpus[4].cpu_affinity == "112-127,240-255"
    assert [n.name for n in topo.nics] == [f"mlx5_{i}" for i in range(12)]
    assert nic(topo, "mlx5_0").near_gpus == [0, 1]
    assert nic(topo, "mlx5_1").near_gpus == [0, 1]
    assert nic(topo, "mlx5_0").gpu_tiers[0] == "PXB"
    assert nic(topo, "mlx5_0").numa_node == 3
    assert nic(topo, "mlx5_6").near_gpus == [4, 5]
    assert nic(topo, "mlx5_9").near_gpus == [6, 7]
    # storage and management ports: SYS from every GPU, NUMA node not derivable
    for storage in ("mlx5_4", "mlx5_5", "mlx5_10", "mlx5_11"):
        assert nic(topo, storage).near_gpus == []
        assert set(nic(topo, storage).gpu_tiers.values()) == {"SYS"}
        assert nic(topo, storage).numa_node is None
    assert pcie_switch_groups(topo) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert rails(topo)[2] == ["mlx5_2", "mlx5_3"]


def test_a800_nv8_crlf_capture_with_nic_legend() -> None:
    topo = parsed("a800_8gpu_nvswitch_nv8_4nic")
    assert topo.gpu_model == "A800"
    assert {lk.kind for lk in topo.links} == {"NV8"}
    assert {lk.gbps for lk in topo.links} == {200.0}
    assert all(g.nvlinks_total == 8 for g in topo.gpus)
    assert [n.name for n in topo.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert nic(topo, "mlx5_0").near_gpus == [1]
    assert nic(topo, "mlx5_1").near_gpus == [3]
    assert nic(topo, "mlx5_2").near_gpus == [7]
    assert nic(topo, "mlx5_3").near_gpus == [7]
    assert nic(topo, "mlx5_0").gpu_tiers[0] == "NODE"
    assert nic(topo, "mlx5_0").gpu_tiers[4] == "SYS"
    assert [nic(topo, f"mlx5_{i}").numa_node for i in range(4)] == [0, 0, 1, 1]
    assert [g.numa_node for g in topo.gpus] == [0] * 4 + [1] * 4
    assert topo.gpus[5].cpu_affinity == "32-63,96-127"
    assert rails(topo)[7] == ["mlx5_2", "mlx5_3"]
    assert rails(topo)[0] == []


def test_gb200_tray_multi_numa_affinity_maps_to_first_node_and_nics_are_all_sys() -> None:
    topo = parsed("gb200_nvl72_compute_tray_4gpu")
    assert topo.gpu_model == "GB200"
    assert len(topo.gpus) == 4
    assert {lk.kind for lk in topo.links} == {"NV18"}
    assert {lk.gbps for lk in topo.links} == {900.0}  # NVLink5: 50 GB/s per link
    # NUMA Affinity "0,2-17" / "1,18-33": the CPU node comes first, GPU memory nodes after it
    assert [g.numa_node for g in topo.gpus] == [0, 0, 1, 1]
    assert [g.cpu_affinity for g in topo.gpus] == ["0-71", "0-71", "72-143", "72-143"]
    assert topo.cpus == 144
    assert len(topo.nics) == 8
    for n in topo.nics:
        assert set(n.gpu_tiers.values()) == {"SYS"}
        assert n.near_gpus == []
        assert n.numa_node is None
    assert all(v == [] for v in rails(topo).values())


def test_l40s_node_within_socket_sys_across() -> None:
    topo = parsed("l40s_8gpu_pcie_node_sys")
    assert topo.gpu_model == "L40S"
    assert kind(topo, 0, 1) == "NODE"
    assert kind(topo, 4, 7) == "NODE"
    assert kind(topo, 0, 4) == "SYS"
    assert kind(topo, 3, 5) == "SYS"
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.cpu_affinity for g in topo.gpus] == ["0-89"] * 4 + ["90-179"] * 4
    assert all(g.nvlinks_total == 0 for g in topo.gpus)
    assert nvlink_groups(topo) == []
    (only,) = topo.nics
    assert only.name == "NIC0"  # no NIC legend in this capture
    assert set(only.gpu_tiers.values()) == {"SYS"}
    node_gbps = next(lk.gbps for lk in topo.links if lk.kind == "NODE")
    sys_gbps = next(lk.gbps for lk in topo.links if lk.kind == "SYS")
    assert node_gbps > sys_gbps


def test_rtx4090_every_pair_sys_and_empty_tab_cell() -> None:
    topo = parsed("rtx4090_8gpu_pcie_all_sys")
    assert topo.gpu_model == "RTX 4090"
    assert {lk.kind for lk in topo.links} == {"SYS"}
    assert [g.numa_node for g in topo.gpus] == [0] * 4 + [1] * 4
    assert topo.gpus[6].cpu_affinity == "56-111,168-223"
    assert [n.name for n in topo.nics] == ["NIC0", "NIC1"]
    for n in topo.nics:
        assert n.gpu_tiers[6] == "PHB"
        assert n.near_gpus == []  # PHB is through the CPU: not a rail
        assert n.numa_node == 1
    assert pcie_switch_groups(topo) == []
