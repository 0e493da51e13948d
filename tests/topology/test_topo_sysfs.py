"""NICs and their PCIe tiers to each GPU from a sysfs tree (built here in a temporary folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_pynvml import make_fake_pynvml
from oneplus_topology.analysis import pcie_switch_groups, rails
from oneplus_topology.nvml import discover_node
from oneplus_topology.smi import parse_topo_matrix
from oneplus_topology.sysfs import pcie_tier

# GPU0 (bus 18) and NIC mlx5_0 share one switch; mlx5_2 hangs two switch levels lower; GPU1 (bus 28) sits on its own
# root port with mlx5_1 on another port of the same root complex; mlx5_3 is on a third root complex, NUMA node 0.
DEVICES = {
    "0000:18:00.0": ("pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:18:00.0", 0),
    "0000:19:00.0": ("pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:08.0/0000:19:00.0", 0),
    "0000:1a:00.0": ("pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:10.0/0000:13:00.0/0000:14:00.0/0000:1a:00.0", 0),
    "0000:28:00.0": ("pci0000:20/0000:20:01.0/0000:28:00.0", 1),
    "0000:29:00.0": ("pci0000:20/0000:20:03.0/0000:29:00.0", 1),
    "0000:31:00.0": ("pci0000:30/0000:30:01.0/0000:31:00.0", 0),
}
NICS = {"mlx5_0": "0000:19:00.0", "mlx5_1": "0000:29:00.0", "mlx5_2": "0000:1a:00.0", "mlx5_3": "0000:31:00.0"}


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    for bus, (path, numa) in DEVICES.items():
        device = tmp_path / "devices" / path
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
        link = tmp_path / "bus/pci/devices" / bus
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(device)
    for name, bus in NICS.items():
        port = tmp_path / "class/infiniband" / name
        port.mkdir(parents=True)
        (port / "device").symlink_to(tmp_path / "devices" / DEVICES[bus][0])
    return tmp_path


def test_nic_tiers_and_rails_come_from_pci_paths(sysfs: Path) -> None:
    two = parse_topo_matrix("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tSYS\t0\nGPU1\tSYS\t X \t1\n")
    found = discover_node("n", make_fake_pynvml(two), sysfs=sysfs)
    tiers = {n.name: n.gpu_tiers for n in found.nics}
    assert tiers == {
        "mlx5_0": {0: "PIX", 1: "SYS"},
        "mlx5_1": {0: "SYS", 1: "PHB"},
        "mlx5_2": {0: "PXB", 1: "SYS"},
        "mlx5_3": {0: "NODE", 1: "SYS"},
    }
    assert [n.numa_node for n in found.nics] == [0, 1, 0, 0]
    assert rails(found) == {0: ["mlx5_0", "mlx5_2"], 1: []}
    assert pcie_switch_groups(found) == [[0]]


def test_pcie_tier_rules() -> None:
    gpu = ["pci0000:00", "00:01.0", "01:00.0", "02:00.0", "03:00.0"]
    assert pcie_tier(gpu, ["pci0000:00", "00:01.0", "01:00.0", "02:04.0", "04:00.0"], 0, 0) == "PIX"
    assert pcie_tier(gpu, ["pci0000:00", "00:02.0", "05:00.0"], 0, 0) == "PHB"
    assert pcie_tier(gpu, ["pci0000:40", "40:01.0", "41:00.0"], 0, 0) == "NODE"
    assert pcie_tier(gpu, ["pci0000:40", "40:01.0", "41:00.0"], 0, 1) == "SYS"
    assert pcie_tier(gpu, ["pci0000:40", "40:01.0", "41:00.0"], None, None) == "SYS"
