"""The preemption service's settings: built once at bootstrap from the environment, one clear error for a bad value."""

from __future__ import annotations

from oneplus_bus.config import ServiceSettings


class PreemptionSettings(ServiceSettings):
    """No variables of its own: the forwarder of manual requests reads only the bus scaffold's (checked at start).
    The queue tree it once read is the owner's alone since preemption became the owner's reaction."""
