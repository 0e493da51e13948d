"""Discover a real node through NVML (`pynvml`, package `nvidia-ml-py`).

Without a driver or the library, `discover_node` raises `NvmlUnavailable`: a node we cannot see is never reported
with made-up GPUs. Optional calls that an older driver lacks (NUMA id, fabric info, row remapping) are skipped.
NICs and the sysfs NUMA fallback are read only when the caller names a sysfs root.
"""

from __future__ import annotations

import contextlib
import ctypes
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from oneplus_contracts import GpuInfo, GpuLink, MigInstance, NodeTopology

from .bandwidth import link_gbps
from .errors import NvmlUnavailable
from .fabric import nvlink_domain_of
from .gpu_models import canonical_model
from .mig import profile_of_device_name
from .smi import cpu_count, pcie_switch_ids
from .sysfs import discover_nics

T = TypeVar("T")
# nvmlGpuTopologyLevel_t -> the tier nvidia-smi prints (INTERNAL: two GPUs on one board).
TOPOLOGY_LEVELS: dict[int, str] = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# XIDs the NVIDIA k8s device plugin treats as the application's fault, not the GPU's.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_CPU_WORDS = 32  # 64-bit words of CPU affinity asked for: up to 2,048 CPUs


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable("the pynvml module (package nvidia-ml-py) is not installed") from e
    module: ModuleType = pynvml
    return module


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def normalise_bus_id(raw: str | bytes) -> str:
    """NVML's `00000000:07:00.0` and sysfs' `0000:07:00.0` to one form (lower case, 4-digit domain)."""
    text = _text(raw).strip().lower()
    domain, _, rest = text.partition(":")
    return f"{domain[-4:]:0>4}:{rest}" if rest else text


def cpu_list(words: Any) -> str | None:
    """An NVML CPU affinity bitmask (64-bit words, lowest CPUs first) as a list like `0-51,104-155`."""
    cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]
    if not cpus:
        return None
    ranges: list[str] = []
    start = prev = cpus[0]
    for c in [*cpus[1:], -1]:
        if c != prev + 1:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = c
        prev = c
    return ",".join(ranges)


class _Nvml:
    """Calls into one NVML module, turning 'not supported here' into None."""

    def __init__(self, lib: ModuleType) -> None:
        self.lib = lib
        self.error: type[Exception] = lib.NVMLError

    def optional(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self.error:
            return None


def discover_node(
    node: str,
    nvml: ModuleType | None = None,
    *,
    sysfs: Path | None = None,
    cpus: int | None = None,
    memory_mb: int | None = None,
    xid_wait_ms: int = 0,
) -> NodeTopology:
    """The topology of this machine as NVML sees it; `nvml` defaults to the real `pynvml`."""
    lib = nvml if nvml is not None else _import_pynvml()
    error = getattr(lib, "NVMLError", None)
    if error is None:
        raise NvmlUnavailable(f"{lib.__name__} is not an NVML binding (no NVMLError)")
    try:
        lib.nvmlInit()
    except (error, OSError) as e:
        raise NvmlUnavailable(f"NVML cannot start on {node}: {e}; is the NVIDIA driver installed and loaded?") from e
    try:
        return _discover(_Nvml(lib), node, sysfs, cpus, memory_mb, xid_wait_ms)
    finally:
        with contextlib.suppress(error):
            lib.nvmlShutdown()


def _discover(
    nv: _Nvml, node: str, sysfs: Path | None, cpus: int | None, memory_mb: int | None, xid_wait_ms: int
) -> NodeTopology:
    lib = nv.lib
    count = lib.nvmlDeviceGetCount()
    if count < 1:
        raise NvmlUnavailable(f"NVML on {node} reports no GPUs")
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    buses = [normalise_bus_id(lib.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    names = [_text(lib.nvmlDeviceGetName(h)) for h in handles]
    gpu_model = canonical_model(Counter(names).most_common(1)[0][0])
    nvlinks = [_nvlinks(nv, h, buses) for h in handles]
    xids = poll_xid_errors(lib, handles, xid_wait_ms) if xid_wait_ms > 0 else {}
    links, pcie_links = _links(nv, handles, nvlinks, gpu_model)
    gpus = [_gpu(nv, i, handles[i], buses[i], names[i], nvlinks[i], sysfs, xids.get(i, [])) for i in range(count)]
    nics = discover_nics(sysfs, buses, [g.numa_node for g in gpus]) if sysfs else []
    switches = pcie_switch_ids(count, pcie_links, nics)
    gpus = [g.model_copy(update={"pcie_switch": switches.get(g.index)}) for g in gpus]
    extra: dict[str, int] = {}
    total_cpus = cpus or cpu_count(sorted({g.cpu_affinity for g in gpus if g.cpu_affinity}))
    if total_cpus:
        extra["cpus"] = total_cpus
    if memory_mb:
        extra["memory_mb"] = memory_mb
    topo = NodeTopology(node=node, gpu_model=gpu_model, gpus=gpus, links=links, nics=nics, source="nvml", **extra)
    return topo.model_copy(update={"nvlink_domain": nvlink_domain_of(topo)})


class _GpuLinks:
    def __init__(self) -> None:
        self.total = 0
        self.active = 0
        self.to_gpu: Counter[int] = Counter()
        self.to_switch = 0


def _nvlinks(nv: _Nvml, handle: Any, buses: list[str]) -> _GpuLinks:
    lib = nv.lib
    out = _GpuLinks()
    for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
        state = nv.optional(lib.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            continue
        remote = nv.optional(lib.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        up = state == lib.NVML_FEATURE_ENABLED
        if remote is None:
            # An inactive link with no remote end is not wired (or disabled in this SKU), not a link that is down.
            out.total += up
            out.active += up
            continue
        out.total += 1
        out.active += up
        bus = normalise_bus_id(remote.busId)
        kind = nv.optional(getattr(lib, "nvmlDeviceGetNvLinkRemoteDeviceType", lambda *_: None), handle, link)
        if bus in buses and kind != getattr(lib, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
            out.to_gpu[buses.index(bus)] += 1
        else:
            out.to_switch += 1
    return out


def _links(
    nv: _Nvml, handles: list[Any], nvlinks: list[_GpuLinks], gpu_model: str
) -> tuple[list[GpuLink], list[GpuLink]]:
    """GPU pairs as nvidia-smi prints them, and the PCIe tier of every pair (for switch grouping)."""
    links: list[GpuLink] = []
    pcie: list[GpuLink] = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            level = nv.optional(nv.lib.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            tier = TOPOLOGY_LEVELS.get(int(level), "SYS") if level is not None else "SYS"
            pcie.append(GpuLink(a=a, b=b, kind=tier, gbps=0.0))
            direct = min(nvlinks[a].to_gpu[b], nvlinks[b].to_gpu[a])
            switched = min(nvlinks[a].to_switch, nvlinks[b].to_switch)
            count = direct + switched
            kind = f"NV{count}" if count else tier
            links.append(GpuLink(a=a, b=b, kind=kind, nvlinks=count, gbps=link_gbps(kind, gpu_model)))
    return links, pcie


def _gpu(
    nv: _Nvml,
    index: int,
    h: Any,
    bus: str,
    name: str,
    links: _GpuLinks,
    sysfs: Path | None,
    xids: list[int],
) -> GpuInfo:
    lib = nv.lib
    numa = nv.optional(getattr(lib, "nvmlDeviceGetNumaNodeId", _unsupported(lib)), h)
    if (numa is None or numa < 0) and sysfs is not None:
        numa = _sysfs_numa(sysfs, bus)
    mig = nv.optional(lib.nvmlDeviceGetMigMode, h)
    mig_on = bool(mig and mig[0] == getattr(lib, "NVML_DEVICE_MIG_ENABLE", 1))
    fabric = _fabric(nv, h)
    healthy, reason = _health(nv, h, xids)
    memory = nv.optional(lib.nvmlDeviceGetMemoryInfo, h)
    affinity = nv.optional(lib.nvmlDeviceGetCpuAffinity, h, _CPU_WORDS)
    return GpuInfo(
        index=index,
        uuid=_text(lib.nvmlDeviceGetUUID(h)),
        name=name,
        memory_mb=int(memory.total) // 2**20 if memory is not None else None,
        pci_bus_id=bus,
        numa_node=numa if numa is not None and numa >= 0 else None,
        cpu_affinity=cpu_list(affinity) if affinity is not None else None,
        nvlinks_total=links.total,
        nvlinks_active=links.active,
        mig_enabled=mig_on,
        mig_instances=_mig_instances(nv, h) if mig_on else [],
        clique_id=fabric[1] if fabric else None,
        cluster_uuid=fabric[0] if fabric else None,
        healthy=healthy,
        health_reason=reason,
    )


def _mig_instances(nv: _Nvml, h: Any) -> list[MigInstance]:
    """The MIG devices of a GPU in MIG mode, numbered as `nvidia-smi -L` numbers them (empty slots skipped)."""
    lib = nv.lib
    slots = nv.optional(getattr(lib, "nvmlDeviceGetMaxMigDeviceCount", _unsupported(lib)), h) or 0
    out: list[MigInstance] = []
    for slot in range(int(slots)):
        mh = nv.optional(lib.nvmlDeviceGetMigDeviceHandleByIndex, h, slot)
        if mh is None:
            continue
        profile = profile_of_device_name(_text(lib.nvmlDeviceGetName(mh)))
        if profile is None:  # a name without a profile cannot be matched to a request: not offered
            continue
        out.append(MigInstance(profile=profile, uuid=_text(lib.nvmlDeviceGetUUID(mh)), device=len(out)))
    return out


def _unsupported(lib: ModuleType) -> Callable[..., Any]:
    def call(*_: Any) -> Any:
        raise lib.NVMLError(getattr(lib, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))

    return call


def _sysfs_numa(sysfs: Path, bus: str) -> int | None:
    try:
        value = int((sysfs / "bus/pci/devices" / bus / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _fabric(nv: _Nvml, h: Any) -> tuple[str, int] | None:
    """Cluster UUID and clique id of a multi-node NVLink GPU (GB200 NVL72), when its fabric manager finished."""
    lib = nv.lib
    for struct, call in (
        ("c_nvmlGpuFabricInfoV_t", "nvmlDeviceGetGpuFabricInfoV"),
        ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"),
    ):
        if not hasattr(lib, struct) or not hasattr(lib, call):
            continue
        info = getattr(lib, struct)()
        try:
            getattr(lib, call)(h, ctypes.byref(info))
        except nv.error:
            continue
        if info.state != getattr(lib, "NVML_GPU_FABRIC_STATE_COMPLETED", 3) or info.status != 0:
            return None
        raw = bytes(info.clusterUuid)
        if not any(raw):
            return None
        return str(uuid.UUID(bytes=raw)), int(info.cliqueId)
    return None


def _health(nv: _Nvml, h: Any, xids: list[int]) -> tuple[bool, str | None]:
    lib = nv.lib
    problems: list[str] = []
    ecc = nv.optional(
        lib.nvmlDeviceGetTotalEccErrors,
        h,
        getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        getattr(lib, "NVML_VOLATILE_ECC", 0),
    )
    if ecc:
        problems.append(f"{ecc} uncorrected ECC errors since the last driver load")
    remap = nv.optional(getattr(lib, "nvmlDeviceGetRemappedRows", _unsupported(lib)), h)
    if remap is not None and remap[3]:
        problems.append("row remapping failed")
    elif remap is not None and remap[2]:
        problems.append("row remapping pending: the GPU needs a reset")
    critical = [x for x in xids if x not in APPLICATION_XIDS]
    if critical:
        problems.append(f"XID {', '.join(map(str, critical))}")
    return (not problems, "; ".join(problems) or None)


def poll_xid_errors(lib: ModuleType, handles: list[Any], wait_ms: int) -> dict[int, list[int]]:
    """XID errors raised within `wait_ms`, per GPU index (XIDs are events: only ones after registration arrive)."""
    error = lib.NVMLError
    try:
        events = lib.nvmlEventSetCreate()
    except error:
        return {}
    out: dict[int, list[int]] = {}
    try:
        for h in handles:
            try:
                lib.nvmlDeviceRegisterEvents(h, lib.nvmlEventTypeXidCriticalError, events)
            except error:
                continue
        while True:
            try:
                data = lib.nvmlEventSetWait_v2(events, wait_ms)
            except error:  # timeout: nothing more to read
                break
            index = next((i for i, h in enumerate(handles) if _same_handle(h, data.device)), None)
            if index is not None:
                out.setdefault(index, []).append(int(data.eventData))
    finally:
        lib.nvmlEventSetFree(events)
    return out


def _same_handle(a: Any, b: Any) -> bool:
    # Real handles are ctypes pointers (equal by address), test doubles compare by value.
    if a is b or a == b:
        return True
    try:
        return bool(ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value)
    except (TypeError, ctypes.ArgumentError):
        return False
