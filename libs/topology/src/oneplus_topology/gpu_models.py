"""What the topology model needs to know about a GPU model: its NVLink generation, link count and PCIe generation.

Names are matched in free text (a device name such as "NVIDIA H100 80GB HBM3", or the comment of a topology file),
so a model is recognised whichever tool printed it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModelSpec:
    name: str
    pattern: re.Pattern[str]
    nvlink_gen: int | None
    nvlinks_max: int
    pcie_gen: int


def _spec(name: str, regex: str, nvlink_gen: int | None, nvlinks_max: int, pcie_gen: int) -> GpuModelSpec:
    return GpuModelSpec(name, re.compile(regex, re.IGNORECASE), nvlink_gen, nvlinks_max, pcie_gen)


# Order matters only for names that contain one another (GB200 before B200, GH200 before H200, L40S before L40).
GPU_MODELS: tuple[GpuModelSpec, ...] = (
    _spec("GB200", r"\bGB200\b", 5, 18, 5),
    _spec("B200", r"\bB200\b", 5, 18, 5),
    _spec("GH200", r"\bGH200\b", 4, 18, 5),
    _spec("H200", r"\bH200\b", 4, 18, 5),
    _spec("H800", r"\bH800\b", 4, 8, 5),
    _spec("H100", r"\bH100\b", 4, 18, 5),
    _spec("H20", r"\bH20\b", 4, 18, 5),
    _spec("A800", r"\bA800\b", 3, 8, 4),
    _spec("A100", r"\bA100\b", 3, 12, 4),
    _spec("A40", r"\bA40\b", 3, 4, 4),
    _spec("V100", r"\bV100\b", 2, 6, 3),
    _spec("L40S", r"\bL40S\b", None, 0, 4),
    _spec("L40", r"\bL40\b", None, 0, 4),
    _spec("L4", r"\bL4\b", None, 0, 4),
    _spec("A10", r"\bA10\b", None, 0, 4),
    _spec("RTX 5090", r"\bRTX\s*5090\b", None, 0, 5),
    _spec("RTX 4090", r"\bRTX\s*4090\b", None, 0, 4),
    _spec("RTX 6000 Ada", r"\bRTX\s*6000\s*Ada\b", None, 0, 4),
)
_BY_NAME = {m.name: m for m in GPU_MODELS}


def find_model(text: str) -> GpuModelSpec | None:
    """The model named earliest in `text` ("8x A800 (an A100 variant)" is an A800), or None."""
    best: tuple[int, int, GpuModelSpec] | None = None
    for order, spec in enumerate(GPU_MODELS):
        m = spec.pattern.search(text)
        if m and (best is None or (m.start(), order) < (best[0], best[1])):
            best = (m.start(), order, spec)
    return best[2] if best else None


def model_spec(gpu_model: str) -> GpuModelSpec | None:
    """The spec of a canonical model name, or of a model named inside a longer device name."""
    return _BY_NAME.get(gpu_model) or find_model(gpu_model)


def canonical_model(text: str) -> str:
    spec = find_model(text)
    return spec.name if spec else "unknown"
