"""A stand-in for the `pynvml` module, answering from a parsed `NodeTopology` (tests only).

It speaks the slice of the NVML API that `oneplus_topology.nvml` uses, with the same names, constants and error
type, so discovery can be checked against the real `nvidia-smi topo -m` captures on a machine without GPUs.
NVSwitch layouts (a GPU's per-peer NVLink counts add up to more than its own links) are wired to four switches;
meshes are wired GPU to GPU.
"""

from __future__ import annotations

import ctypes
import types
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oneplus_contracts import NodeTopology

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_NOT_FOUND = 6
_LEVEL = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {12: "NVML Shared Library Not Found", 3: "Not Supported", 10: "Timeout"}.get(self.value, "Error")


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]


@dataclass
class _Handle:
    index: int


@dataclass
class _MigHandle:
    parent: int
    slot: int


@dataclass
class _Pci:
    busId: bytes


@dataclass
class _Memory:
    total: int


@dataclass
class _Event:
    device: _Handle
    eventData: int
    eventType: int


def bus_id(i: int) -> str:
    return f"00000000:{0x18 + 0x10 * i:02X}:00.0"


def _words(cpu_list: str | None) -> list[int]:
    words = [0] * 32
    for part in (cpu_list or "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        for c in range(int(lo), int(hi or lo) + 1):
            words[c // 64] |= 1 << (c % 64)
    return words


def _wiring(topo: NodeTopology) -> dict[int, list[tuple[str, int]]]:
    """Per GPU, one (remote bus, remote device type) per NVLink."""
    n = len(topo.gpus)
    peers: dict[int, dict[int, int]] = {i: {} for i in range(n)}
    for lk in topo.links:
        if lk.nvlinks:
            peers[lk.a][lk.b] = peers[lk.b][lk.a] = lk.nvlinks
    wiring: dict[int, list[tuple[str, int]]] = {}
    for i, g in enumerate(topo.gpus):
        if sum(peers[i].values()) > g.nvlinks_total:
            wiring[i] = [(f"00000000:{0xF0 + k % 4:02X}:00.0", 2) for k in range(g.nvlinks_total)]
        else:
            wiring[i] = [(bus_id(j), 0) for j, count in sorted(peers[i].items()) for _ in range(count)]
    return wiring


def make_fake_pynvml(
    topo: NodeTopology,
    *,
    driver: bool = True,
    numa_api: bool = True,
    down_links: Mapping[int, int] | None = None,
    fabric: tuple[str, int] | None = None,
    ecc_uncorrected: Mapping[int, int] | None = None,
    remap_pending: frozenset[int] = frozenset(),
    mig: frozenset[int] = frozenset(),
    xids: list[tuple[int, int]] | None = None,
    name: str | None = None,
    mig_listing: list[Any] | None = None,
) -> types.ModuleType:
    """A `pynvml`-shaped module for the node `topo` describes.

    `mig_listing` (parsed `nvidia-smi -L`, `oneplus_topology.mig.parse_gpu_listing`) puts the listed GPUs in MIG mode
    with those devices, in NVML's 7 slots per GPU with the listed ones first and empty slots after (NOT_FOUND).
    """
    m = types.ModuleType("pynvml")
    n = len(topo.gpus)
    wiring = _wiring(topo)
    down = dict(down_links or {})
    kinds = {(lk.a, lk.b): lk.kind for lk in topo.links}
    pending_events = list(xids or [])
    named = {g.index: g for g in (mig_listing or [])}
    listed = {i: g for i, g in named.items() if g.instances}
    mig = mig | frozenset(listed)
    state: dict[str, Any] = {"init": 0}

    consts = {
        "NVMLError": NVMLError,
        "NVML_SUCCESS": NVML_SUCCESS,
        "NVML_FEATURE_DISABLED": 0,
        "NVML_FEATURE_ENABLED": 1,
        "NVML_NVLINK_MAX_LINKS": 18,
        "NVML_NVLINK_DEVICE_TYPE_GPU": 0,
        "NVML_NVLINK_DEVICE_TYPE_SWITCH": 2,
        "NVML_DEVICE_MIG_ENABLE": 1,
        "NVML_GPU_FABRIC_STATE_COMPLETED": 3,
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
        "NVML_VOLATILE_ECC": 0,
        "nvmlEventTypeXidCriticalError": 8,
        "c_nvmlGpuFabricInfoV_t": c_nvmlGpuFabricInfoV_t,
    }
    for key, value in consts.items():
        setattr(m, key, value)

    def need_init() -> bool:
        if not state["init"]:
            raise NVMLError(1)
        return True

    def nvmlInit() -> None:
        if not driver:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        state["init"] += 1

    def nvmlShutdown() -> None:
        state["init"] -= 1

    def handle_of(h: _Handle) -> int:
        need_init()
        return h.index

    def link_of(h: _Handle, link: int) -> tuple[str, int]:
        i = handle_of(h)
        if not 0 <= link < len(wiring[i]):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return wiring[i][link]

    def nvmlDeviceGetNvLinkState(h: _Handle, link: int) -> int:
        link_of(h, link)
        return 0 if link >= len(wiring[h.index]) - down.get(h.index, 0) else 1

    def nvmlDeviceGetTopologyCommonAncestor(a: _Handle, b: _Handle) -> int:
        i, j = sorted((handle_of(a), handle_of(b)))
        kind = kinds[(i, j)]
        if kind in _LEVEL:
            return _LEVEL[kind]
        ga, gb = topo.gpus[i], topo.gpus[j]
        if ga.pcie_switch is not None and ga.pcie_switch == gb.pcie_switch:
            return _LEVEL["PXB"]
        return _LEVEL["NODE"] if ga.numa_node is not None and ga.numa_node == gb.numa_node else _LEVEL["SYS"]

    def nvmlDeviceGetNumaNodeId(h: _Handle) -> int:
        numa = topo.gpus[handle_of(h)].numa_node
        if numa is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return numa

    def nvmlDeviceGetGpuFabricInfoV(h: _Handle, ref: Any) -> int:
        handle_of(h)
        if fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = ref._obj
        info.clusterUuid[:] = list(uuidlib.UUID(fabric[0]).bytes)
        info.cliqueId, info.state, info.status = fabric[1], 3, 0
        return NVML_SUCCESS

    def mig_handle(h: _Handle, slot: int) -> _MigHandle:
        i = handle_of(h)
        if i not in listed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if slot >= len(listed[i].instances):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _MigHandle(i, slot)

    def device_uuid(h: _Handle | _MigHandle) -> str:
        if isinstance(h, _MigHandle):
            return str(listed[h.parent].instances[h.slot].uuid)
        return str(named[h.index].uuid) if h.index in named else f"GPU-{uuidlib.UUID(int=handle_of(h) + 1)}"

    def device_name(h: _Handle | _MigHandle) -> str:
        if isinstance(h, _MigHandle):  # NVML names a MIG device `<GPU name> MIG <profile>`
            return f"{listed[h.parent].name} MIG {listed[h.parent].instances[h.slot].profile}"
        return name or (named[h.index].name if h.index in named else f"NVIDIA {topo.gpu_model}")

    def nvmlEventSetWait_v2(events: object, timeout_ms: int) -> _Event:
        if not pending_events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        gpu, xid = pending_events.pop(0)
        return _Event(_Handle(gpu), xid, 8)

    funcs: dict[str, Any] = {
        "nvmlInit": nvmlInit,
        "nvmlShutdown": nvmlShutdown,
        "nvmlDeviceGetCount": lambda: need_init() and n,
        "nvmlDeviceGetHandleByIndex": lambda i: need_init() and _Handle(i),
        "nvmlDeviceGetUUID": device_uuid,
        "nvmlDeviceGetName": device_name,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7 if handle_of(h) in mig else 0,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetMemoryInfo": lambda h: (handle_of(h), _Memory(80 * 2**30))[1],
        "nvmlDeviceGetPciInfo": lambda h: _Pci(bus_id(handle_of(h)).encode()),
        "nvmlDeviceGetNvLinkState": nvmlDeviceGetNvLinkState,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: _Pci(link_of(h, link)[0].encode()),
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, link: link_of(h, link)[1],
        "nvmlDeviceGetTopologyCommonAncestor": nvmlDeviceGetTopologyCommonAncestor,
        "nvmlDeviceGetCpuAffinity": lambda h, size: _words(topo.gpus[handle_of(h)].cpu_affinity)[:size],
        "nvmlDeviceGetMigMode": lambda h: [int(handle_of(h) in mig)] * 2,
        "nvmlDeviceGetGpuFabricInfoV": nvmlDeviceGetGpuFabricInfoV,
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: (ecc_uncorrected or {}).get(handle_of(h), 0),
        "nvmlDeviceGetRemappedRows": lambda h: (0, 0, int(handle_of(h) in remap_pending), 0),
        "nvmlEventSetCreate": lambda: object(),
        "nvmlDeviceRegisterEvents": lambda h, kind, events: handle_of(h),
        "nvmlEventSetWait_v2": nvmlEventSetWait_v2,
        "nvmlEventSetFree": lambda events: None,
    }
    if numa_api:
        funcs["nvmlDeviceGetNumaNodeId"] = nvmlDeviceGetNumaNodeId
    for key, fn in funcs.items():
        setattr(m, key, fn)
    m.init_count = lambda: state["init"]  # type: ignore[attr-defined]
    return m
