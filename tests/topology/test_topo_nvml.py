"""NVML discovery against a fake `pynvml` built from the parsed real captures (and the constructed layouts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fake_pynvml import make_fake_pynvml
from oneplus_contracts import NodeTopology
from oneplus_topology.analysis import nvlink_domains, nvlink_groups, pcie_switch_groups
from oneplus_topology.errors import NvmlUnavailable
from oneplus_topology.nvml import cpu_list, discover_node, normalise_bus_id
from topology_cases import CONSTRUCTED_FILES, REAL_FILES, parse_file


def _links(topo: NodeTopology) -> dict[tuple[int, int], tuple[str, int, float]]:
    return {(lk.a, lk.b): (lk.kind, lk.nvlinks, lk.gbps) for lk in topo.links}


@pytest.mark.parametrize("name", REAL_FILES + CONSTRUCTED_FILES)
def test_discovery_reproduces_the_parsed_model(name: str) -> None:
    parsed = parse_file(name)
    fake = make_fake_pynvml(parsed)
    found = discover_node(name, fake)
    assert found.source == "nvml"
    assert found.gpu_model == parsed.gpu_model
    assert _links(found) == _links(parsed)
    for mine, theirs in zip(found.gpus, parsed.gpus, strict=True):
        assert mine.numa_node == theirs.numa_node
        assert mine.cpu_affinity == theirs.cpu_affinity
        assert (mine.nvlinks_total, mine.nvlinks_active) == (theirs.nvlinks_total, theirs.nvlinks_active)
        assert mine.healthy and not mine.mig_enabled
    assert nvlink_groups(found) == nvlink_groups(parsed)
    assert nvlink_domains(found) == nvlink_domains(parsed)
    # NVML sees GPUs only: switches shared with a NIC alone need the sysfs NIC scan
    assert pcie_switch_groups(found) == [g for g in pcie_switch_groups(parsed) if len(g) > 1]
    assert found.cpus == parsed.cpus
    assert fake.init_count() == 0  # nvmlShutdown after every nvmlInit


def test_discovered_gpus_carry_identity() -> None:
    found = discover_node(
        "n1", make_fake_pynvml(parse_file("h100_sxm_8gpu_nvswitch_nv18"), name="NVIDIA H100 80GB HBM3")
    )
    g = found.gpus[1]
    assert g.pci_bus_id == "0000:28:00.0"
    assert g.uuid and g.uuid.startswith("GPU-")
    assert g.memory_mb == 80 * 1024
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert found.gpu_model == "H100"
    assert found.node == "n1"


def test_no_driver_is_an_error_not_a_default() -> None:
    with pytest.raises(NvmlUnavailable, match="NVIDIA driver"):
        discover_node("n1", make_fake_pynvml(parse_file("h100_4gpu_nv6"), driver=False))


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_a_driver_raises() -> None:
    with pytest.raises(NvmlUnavailable, match="NVML cannot start"):
        discover_node("here")


def test_missing_pynvml_module_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py"):
        discover_node("here")


def test_numa_falls_back_to_sysfs_when_nvml_lacks_the_call(tmp_path: Path) -> None:
    parsed = parse_file("h100_4gpu_nv6")
    fake = make_fake_pynvml(parsed, numa_api=False)
    assert [g.numa_node for g in discover_node("n", fake).gpus] == [None] * 4
    for i, numa in enumerate([0, 0, 1, -1]):
        d = tmp_path / "bus/pci/devices" / f"0000:{0x18 + 0x10 * i:02x}:00.0"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{numa}\n")
    assert [g.numa_node for g in discover_node("n", fake, sysfs=tmp_path).gpus] == [0, 0, 1, None]


def test_links_down_leave_the_gpu_outside_the_nvlink_domain() -> None:
    found = discover_node("n", make_fake_pynvml(parse_file("h100_sxm_8gpu_nvswitch_nv18"), down_links={3: 2}))
    assert (found.gpus[3].nvlinks_active, found.gpus[3].nvlinks_total) == (16, 18)
    assert {lk.kind for lk in found.links} == {"NV18"}
    assert nvlink_groups(found) == [[0, 1, 2, 4, 5, 6, 7]]


def test_gb200_fabric_info_names_the_multi_node_nvlink_domain() -> None:
    cluster_uuid = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    found = discover_node(
        "tray7", make_fake_pynvml(parse_file("gb200_nvl72_compute_tray_4gpu"), fabric=(cluster_uuid, 7))
    )
    assert {(g.cluster_uuid, g.clique_id) for g in found.gpus} == {(cluster_uuid, 7)}
    assert found.nvlink_domain == f"{cluster_uuid}.7"
    plain = discover_node("tray8", make_fake_pynvml(parse_file("gb200_nvl72_compute_tray_4gpu")))
    assert plain.nvlink_domain is None and plain.gpus[0].clique_id is None


def test_ecc_row_remapping_mig_and_xid_health() -> None:
    fake = make_fake_pynvml(
        parse_file("dgx_a100_8gpu_nv12_12nic"),
        ecc_uncorrected={1: 3},
        remap_pending=frozenset({2}),
        mig=frozenset({0}),
        xids=[(5, 79), (6, 13)],
    )
    found = discover_node("n", fake, xid_wait_ms=1)
    by = {g.index: g for g in found.gpus}
    assert by[0].mig_enabled and by[0].healthy
    assert not by[1].healthy and "3 uncorrected ECC errors" in (by[1].health_reason or "")
    assert not by[2].healthy and "row remapping pending" in (by[2].health_reason or "")
    assert not by[5].healthy and by[5].health_reason == "XID 79"
    assert by[6].healthy  # XID 13 is an application error, not the GPU's


def test_bus_ids_and_cpu_masks() -> None:
    assert normalise_bus_id(b"00000000:1B:00.0") == "0000:1b:00.0"
    assert normalise_bus_id("0000:07:00.0") == "0000:07:00.0"
    words = [0] * 4
    for c in [*range(52), *range(104, 156)]:
        words[c // 64] |= 1 << (c % 64)
    assert cpu_list(words) == "0-51,104-155"
    assert cpu_list([0b1011]) == "0-1,3"
    assert cpu_list([0, 0]) is None
