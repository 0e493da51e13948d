"""Sizes and durations as Kubernetes and Slurm write them.

Each parser raises ValueError with a sentence naming the accepted forms; callers add the field or line.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from oneplus_contracts.slurm import digits

_K8S_QUANTITY = re.compile(
    r"([+-]?(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40}))(?:([eE][+-]?\d{1,4})|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?",
    re.ASCII,
)
_K8S_SUFFIX = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
MIB = 1024 * 1024


def k8s_quantity(value: object) -> Decimal:
    """A Kubernetes resource.Quantity (`500m`, `1.5`, `8Gi`, `1e9`) as a plain number."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite quantity")
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    m = _K8S_QUANTITY.fullmatch(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 8Gi, 1e9)")
    try:
        number = Decimal(m.group(1))
        if m.group(2):
            exponent = int(m.group(2)[1:])
            if abs(exponent) > 30:
                raise ValueError(f"{value!r}: exponent out of range")
            number *= Decimal(10) ** exponent
        elif m.group(3):
            number *= _K8S_SUFFIX[m.group(3)]
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None
    if number < 0:
        raise ValueError(f"{value!r} is negative")
    return number


def k8s_cpus(value: object) -> float:
    return float(k8s_quantity(value))


def k8s_memory_mb(value: object) -> int:
    """Bytes as Kubernetes writes them, rounded up to whole MiB."""
    n = k8s_quantity(value)
    return max(1, math.ceil(n / MIB)) if n > 0 else 0


def k8s_whole(value: object) -> int:
    """An extended resource such as nvidia.com/gpu: Kubernetes allows only whole numbers."""
    n = k8s_quantity(value)
    if n != n.to_integral_value():
        raise ValueError(f"{value!r} must be a whole number (extended resources cannot be split)")
    return int(n)


_SLURM_MEM = re.compile(r"(\d{1,15})([KMGTkmgt])?[Bb]?", re.ASCII)
_SLURM_MEM_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def slurm_memory_mb(text: str) -> int:
    """`--mem` sizes: an integer with an optional K, M, G or T suffix; megabytes when there is none."""
    m = _SLURM_MEM.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a size (use an integer with an optional K, M, G or T suffix, e.g. 64G)")
    n = int(m.group(1))
    unit = (m.group(2) or "M").upper()
    return math.ceil(n * _SLURM_MEM_MB[unit])


_UNLIMITED = {"unlimited", "infinite", "-1"}


def slurm_time_s(text: str) -> int | None:
    """Slurm's time formats (`--time`, `--switches=N@time`): seconds, or None for no limit.

    minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds;
    0, UNLIMITED and INFINITE mean no limit.
    """
    raw = text.strip()
    if raw.lower() in _UNLIMITED:
        return None
    days = 0
    rest = raw
    has_days = "-" in raw
    if has_days:
        d, _, rest = raw.partition("-")
        if not digits(d):
            raise ValueError(_time_help(text))
        days = int(d)
    parts = rest.split(":")
    if not rest or len(parts) > 3 or not all(digits(p) for p in parts):
        raise ValueError(_time_help(text))
    nums = [int(p) for p in parts]
    if has_days:
        # days-hours[:minutes[:seconds]]
        nums += [0] * (3 - len(nums))
        hours, minutes, seconds = nums
    elif len(nums) == 1:
        hours, minutes, seconds = 0, nums[0], 0
    elif len(nums) == 2:
        hours, minutes, seconds = 0, nums[0], nums[1]
    else:
        hours, minutes, seconds = nums
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total > 10 * 365 * 86400:
        raise ValueError(f"{text!r} is more than ten years")
    return total or None


def _time_help(text: str) -> str:
    return (
        f"{text!r} is not a Slurm time (use minutes, minutes:seconds, hours:minutes:seconds, days-hours, "
        "days-hours:minutes or days-hours:minutes:seconds)"
    )
