"""NICs and their PCIe distance to each GPU, read from a sysfs tree the caller names (normally `/sys`).

NVML knows GPUs only; the rail of each GPU (the NIC under the same PCIe switch) comes from the PCI paths sysfs
gives every device: `/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/...`.
"""

from __future__ import annotations

from pathlib import Path

from oneplus_contracts import NicInfo

from .smi import NEAR_TIERS


def pci_path(sysfs: Path, bus: str) -> list[str]:
    """The chain of PCI components from the root complex (`pci0000:00`) down to the device."""
    real = (sysfs / "bus/pci/devices" / bus).resolve()
    parts = list(real.parts)
    roots = [i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p]
    return parts[roots[0] :] if roots else [bus]


def pcie_tier(a: list[str], b: list[str], numa_a: int | None, numa_b: int | None) -> str:
    """The `nvidia-smi topo -m` tier between two devices from their PCI paths.

    Different root complexes: NODE on one NUMA node, SYS otherwise. Same root complex: PHB when they part at the
    host bridge, PIX when each sits at most one switch level below their common bridge, PXB when deeper.
    """
    if a[0] != b[0]:
        return "NODE" if numa_a is not None and numa_a == numa_b else "SYS"
    common = 0
    for x, y in zip(a[1:], b[1:], strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB"
    below_a, below_b = len(a) - 1 - common, len(b) - 1 - common
    return "PIX" if below_a <= 2 and below_b <= 2 else "PXB"


def _numa(device_dir: Path) -> int | None:
    try:
        value = int((device_dir / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def discover_nics(sysfs: Path, gpu_buses: list[str], gpu_numa: list[int | None]) -> list[NicInfo]:
    """One `NicInfo` per RDMA device under `<sysfs>/class/infiniband`, with its tier to every GPU."""
    ib = sysfs / "class/infiniband"
    if not ib.is_dir():
        return []
    gpu_paths = [pci_path(sysfs, bus) for bus in gpu_buses]
    nics: list[NicInfo] = []
    for dev in sorted(ib.iterdir(), key=lambda p: (len(p.name), p.name)):
        device = (dev / "device").resolve()
        bus = device.name
        numa = _numa(device)
        path = pci_path(sysfs, bus)
        tiers = {g: pcie_tier(path, gp, numa, gpu_numa[g]) for g, gp in enumerate(gpu_paths)}
        near = [g for g, t in tiers.items() if t in NEAR_TIERS]
        nics.append(NicInfo(name=dev.name, numa_node=numa, near_gpus=near, gpu_tiers=tiers))
    return nics
