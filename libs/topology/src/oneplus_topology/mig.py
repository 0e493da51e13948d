"""A node's MIG layout: read from an `nvidia-smi -L` listing and laid onto its topology.

`nvidia-smi -L` prints one `GPU <i>: <name> (UUID: GPU-...)` line per GPU and, under a GPU in MIG mode, one
`  MIG <profile> Device <n>: (UUID: MIG-...)` line per MIG device. Prompt and `#` lines are skipped; any other line
is an error naming its line number. Changing a layout is out of scope: OnePlus schedules the instances it finds.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from oneplus_contracts import MigInstance, NodeTopology
from oneplus_contracts.jobspec import MIG_PROFILE_RE as PROFILE_RE

from .errors import TopologyParseError

_GPU_LINE = re.compile(r"^GPU\s+(\d+):\s*(.+?)\s*\(UUID:\s*(GPU-[0-9A-Za-z-]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[0-9A-Za-z/-]+)\)\s*$")


@dataclass
class ListedGpu:
    """One GPU of a listing: its index, marketing name, UUID and MIG devices (in listed order)."""

    index: int
    name: str
    uuid: str
    instances: list[MigInstance] = field(default_factory=list)


def parse_gpu_listing(text: str) -> list[ListedGpu]:
    """The GPUs of an `nvidia-smi -L` listing; raises `TopologyParseError` naming the line it cannot read."""
    gpus: list[ListedGpu] = []
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith(("#", "$")):
            continue
        if m := _GPU_LINE.match(line):
            index = int(m.group(1))
            if any(g.index == index for g in gpus):
                raise TopologyParseError(number, f"GPU {index} is listed twice")
            gpus.append(ListedGpu(index=index, name=m.group(2), uuid=m.group(3)))
        elif m := _MIG_LINE.match(line):
            if not gpus:
                raise TopologyParseError(number, "a MIG device before any GPU line")
            profile, device, uuid = m.group(1), int(m.group(2)), m.group(3)
            if not PROFILE_RE.match(profile):
                raise TopologyParseError(number, f"{profile!r} is not a MIG profile name such as 3g.40gb")
            gpu = gpus[-1]
            if any(i.device == device for i in gpu.instances):
                raise TopologyParseError(number, f"MIG device {device} of GPU {gpu.index} is listed twice")
            gpu.instances.append(MigInstance(profile=profile, uuid=uuid, device=device))
        else:
            raise TopologyParseError(
                number,
                f"not an `nvidia-smi -L` line (GPU <i>: ... or MIG <profile> Device <n>: ...): {line.strip()!r}",
            )
    if not gpus:
        raise TopologyParseError(1, "no `GPU <i>: <name> (UUID: GPU-...)` line: not an `nvidia-smi -L` listing")
    return gpus


def apply_gpu_listing(topo: NodeTopology, listing: list[ListedGpu]) -> NodeTopology:
    """`topo` with each GPU's UUID and MIG devices from the listing; the GPU indices must be the same."""
    mine = sorted(g.index for g in topo.gpus)
    theirs = sorted(g.index for g in listing)
    if mine != theirs:
        raise ValueError(f"the listing names GPUs {theirs} but node {topo.node} has GPUs {mine}")
    by_index = {g.index: g for g in listing}
    gpus = [
        g.model_copy(
            update={
                "uuid": by_index[g.index].uuid,
                "mig_enabled": bool(by_index[g.index].instances) or g.mig_enabled,
                "mig_instances": list(by_index[g.index].instances),
            }
        )
        for g in topo.gpus
    ]
    return topo.model_copy(update={"gpus": gpus})


def mig_profiles(topo: NodeTopology) -> Counter[str]:
    """How many MIG instances of each profile the node has (free or not)."""
    return Counter(i.profile for g in topo.gpus for i in g.mig_instances)


def profile_of_device_name(name: str) -> str | None:
    """The profile in an NVML MIG device name (`NVIDIA A100-SXM4-80GB MIG 3g.40gb` -> `3g.40gb`)."""
    words = name.split()
    if "MIG" in words and words.index("MIG") + 1 < len(words):
        candidate = words[words.index("MIG") + 1]
        return candidate if PROFILE_RE.match(candidate) else None
    return None


def layout_rows(topo: NodeTopology) -> list[tuple[int, str, str, str]]:
    """(GPU, device, profile, UUID) per MIG instance, for `nodes show`."""
    return [(g.index, str(i.device), i.profile, i.uuid) for g in topo.gpus for i in g.mig_instances]
