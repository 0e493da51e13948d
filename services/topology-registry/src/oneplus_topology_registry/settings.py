"""The topology-registry's settings: built once at bootstrap from the environment, one clear error for a bad value."""

from __future__ import annotations

from oneplus_bus.config import ServiceSettings
from pydantic import Field

DEFAULT_LOST_AFTER_S = 10.0  # ONEPLUS_NODE_LOST_AFTER_S
# ONEPLUS_REGISTRY_PERSIST_HEARTBEAT_S: 4,096 nodes every 30 s were 136 writes a second, 0.13 of a core at idle, for
# a time only a lost node's restart reads (a live node counts as seen at the restart; a loss writes its time).
DEFAULT_PERSIST_HEARTBEAT_S = 300.0


class RegistrySettings(ServiceSettings):
    # A node whose heartbeats stop this long is marked lost (its gangs are requeued).
    lost_after_s: float = Field(DEFAULT_LOST_AFTER_S, gt=0, alias="ONEPLUS_NODE_LOST_AFTER_S")
    # How often a node's last heartbeat time is written down, for the registry's own restart.
    persist_heartbeat_s: float = Field(DEFAULT_PERSIST_HEARTBEAT_S, gt=0, alias="ONEPLUS_REGISTRY_PERSIST_HEARTBEAT_S")

    @classmethod
    def from_env(cls) -> RegistrySettings:
        return cls.load()
