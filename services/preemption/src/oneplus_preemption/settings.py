"""The preemption service's settings: built once at bootstrap from the environment, one clear error for a bad value."""

from __future__ import annotations

from oneplus_bus.config import ReadableFile, ServiceSettings


class PreemptionSettings(ServiceSettings):
    # The queue tree when the `queues` bucket holds none, as the solver reads it (oneplus_stores.clusterview).
    queues_file: ReadableFile | None = None
