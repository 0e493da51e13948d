"""A site's Slurm names mapped onto OnePlus': QOS -> priority class, partition -> queue, account -> team.

Sites name their QOS (`regular`, `qos_gpu-gc`), partitions and accounts (`six@a100`) in their own ways; scripts
carry those names. `ONEPLUS_SITE_FILE` (or `oneplus sbatch --site FILE`) names a YAML file:

    qos: {regular: normal, qos_gpu-gc: high, qos_gpu-t3: 250}
    partitions: {gpu_p5: default, gpu_p13: research}
    accounts: {six@a100: bigscience}

A QOS maps to a priority class name or a number; a partition to a queue; an account to a team. A name the file
does not list is used as it is (a QOS must then be a known priority class).

    default_share: {cpus_per_gpu: 12, memory_mb_per_gpu: 120000}

is the node's share a rank gets when its job sets no CPU (or no memory): that much per GPU of the rank, reserved and
capped (Slurm's DefCpuPerGPU / DefMemPerGPU). Without it, unset CPU and memory mean no limit (as Kubernetes).

    max_array_size: 10001

is Slurm's MaxArraySize: a job array's task ids must be below it (default 1001, Slurm's: ids 0-1000).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from oneplus_contracts.arrays import DEFAULT_MAX_ARRAY_SIZE, MAX_ARRAY_SIZE_CEILING
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .priorities import priority_of

SITE_FILE_ENV = "ONEPLUS_SITE_FILE"


class SiteMapError(ValueError):
    """The site file cannot be used; the message names the file and the entry."""


class NodeShare(BaseModel):
    """Per GPU of a rank: what a job that sets no CPU (no memory) gets, as a request and as a limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus_per_gpu: float | None = Field(default=None, gt=0, le=1024)
    memory_mb_per_gpu: int | None = Field(default=None, gt=0, le=16 * 1024 * 1024)


class SiteMap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default_share: NodeShare | None = Field(
        default=None, description="CPU and memory per GPU for jobs that set none (else: no limit)"
    )

    max_array_size: int = Field(
        default=DEFAULT_MAX_ARRAY_SIZE,
        ge=1,
        le=MAX_ARRAY_SIZE_CEILING,
        description="Slurm's MaxArraySize: an array's task ids must be below it (default 1001: ids 0-1000)",
    )
    qos: dict[str, str] = Field(default_factory=dict, description="Slurm QOS -> priority class name or number")
    partitions: dict[str, str] = Field(default_factory=dict, description="Slurm partition -> OnePlus queue")
    accounts: dict[str, str] = Field(default_factory=dict, description="Slurm account -> OnePlus team")

    @field_validator("qos", mode="before")
    @classmethod
    def _priority_classes(cls, v: object) -> object:
        if isinstance(v, dict):
            out = {}
            for name, target in v.items():
                priority_of(str(target))  # raises with the known names
                out[str(name)] = str(target)
            return out
        return v

    @field_validator("partitions", "accounts", mode="before")
    @classmethod
    def _names(cls, v: object) -> object:
        if isinstance(v, dict):
            return {str(k): str(t) for k, t in v.items()}
        return v

    def queue_of(self, partition: str) -> str:
        return self.partitions.get(partition, partition)

    def priority_class_of(self, qos: str) -> str:
        return self.qos.get(qos, qos)

    def team_of(self, account: str) -> str | None:
        return self.accounts.get(account)

    def partition_of(self, queue: str) -> str:
        """The site's name for a queue (the first partition mapped to it), else the queue's own name."""
        return next((p for p, q in self.partitions.items() if q == queue), queue)


EMPTY = SiteMap()


def load_site(path: str | Path) -> SiteMap:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SiteMapError(f"site file {p}: cannot be read: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SiteMapError(f"site file {p}: not YAML: {exc}") from None
    if raw is None:
        return EMPTY
    if not isinstance(raw, dict):
        raise SiteMapError(f"site file {p}: must be a mapping with qos, partitions and accounts")
    try:
        return SiteMap.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise SiteMapError(f"site file {p}: {where}: {first['msg']}") from None


@lru_cache(maxsize=8)
def _cached(path: str, mtime_ns: int) -> SiteMap:
    return load_site(path)


def site_from_env() -> SiteMap:
    """The map named by ONEPLUS_SITE_FILE (re-read when the file changes); empty when unset."""
    path = os.environ.get(SITE_FILE_ENV, "").strip()
    if not path:
        return EMPTY
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise SiteMapError(f"{SITE_FILE_ENV}={path}: cannot be read: {exc.strerror or exc}") from None
    return _cached(path, mtime)


MIN_SHARE_CPUS = 0.1  # a GPU-share rank still gets this much CPU from a per-GPU default
MIN_SHARE_MB = 64


def apply_default_share(fields: dict[str, Any], site: SiteMap) -> list[str]:
    """Give `fields["resources"]` the site's per-GPU share where the job set no CPU or no memory (neither request nor
    limit); returns what was done, in words for the dry run."""
    share = site.default_share
    resources = fields.get("resources")
    if share is None or not isinstance(resources, dict):
        return []
    gpus = float(resources.get("gpus") or 0)
    notes: list[str] = []
    if share.cpus_per_gpu is not None and "cpus" not in resources and "cpu_limit" not in resources:
        cpus = max(round(share.cpus_per_gpu * gpus, 3), MIN_SHARE_CPUS)
        resources["cpus"] = resources["cpu_limit"] = cpus
        notes.append(
            f"resources: no CPU set; the site's default share ({share.cpus_per_gpu:g} CPU per GPU, {SITE_FILE_ENV}) "
            f"gives each rank {cpus:g} CPU(s), reserved and capped"
        )
    if share.memory_mb_per_gpu is not None and "memory_mb" not in resources and "memory_limit_mb" not in resources:
        mem = max(round(share.memory_mb_per_gpu * gpus), MIN_SHARE_MB)
        resources["memory_mb"] = resources["memory_limit_mb"] = mem
        notes.append(
            f"resources: no memory set; the site's default share ({share.memory_mb_per_gpu} MiB per GPU, "
            f"{SITE_FILE_ENV}) gives each rank {mem} MiB, reserved and capped"
        )
    return notes
