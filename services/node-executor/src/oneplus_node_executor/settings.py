"""The node-executor's settings: built once at bootstrap from the environment, one clear error for a bad value.

Each is also a command-line flag (the flag wins); `parse_args` takes its defaults from here."""

from __future__ import annotations

from oneplus_bus.config import ServiceSettings
from pydantic import Field, field_validator

from .node import KEEP_FINISHED, REPORT_EVERY_S


class ExecutorSettings(ServiceSettings):
    """`ONEPLUS_<FIELD>` sets each field (docs/configuration.md); the aliased ones read the names shown."""

    node: str | None = None
    topology: str | None = None  # nvml, an `nvidia-smi topo -m` file or a preset name
    gpu_list: str | None = None  # an `nvidia-smi -L` file
    mps_pipe_directory: str | None = None
    mps_log_directory: str | None = None
    leaf: str | None = None
    spine: str | None = None
    node_features: str = ""  # comma-separated
    runtime: str | None = None  # docker or simulated
    simulation: bool = False
    node_address: str | None = None
    heartbeat_s: float = Field(2.0, gt=0)
    # An unchanged full report (GPU health, ranks) is repeated this often; the heartbeats in between are leases.
    report_every_s: float = Field(REPORT_EVERY_S, gt=0)
    keep_finished: int = Field(KEEP_FINISHED, ge=0)
    state_dir: str | None = None
    time_scale: float = Field(1.0, gt=0)  # a simulated rank's run time is divided by this
    docker_url: str = "unix:///var/run/docker.sock"
    gpu_node: bool = False  # GPU device requests though GPUs were not discovered by NVML
    # The IMEX channel for jobs over the trays of one NVLink domain: a number, or "none".
    imex_channel: str = "0"

    @field_validator("imex_channel")
    @classmethod
    def _channel(cls, value: str) -> str:
        value = value.strip().lower()
        if value != "none" and not value.isdigit():
            raise ValueError("give a channel number (0 is the default) or 'none'")
        return value

    @property
    def imex(self) -> int | None:
        return None if self.imex_channel == "none" else int(self.imex_channel)
