"""A started service moves its long-lived objects out of the cyclic collector's reach (`freeze_heap`), so a full
collection walks only what came after: the 70-250 ms pauses that were the scale benchmark's slowest paced jobs."""

from __future__ import annotations

import gc

from oneplus_bus.service import FREEZE_AFTER_S, freeze_heap


async def test_the_heap_is_frozen_after_each_settle_and_frozen_objects_are_still_freed_by_reference() -> None:
    assert FREEZE_AFTER_S[0] == 0.0  # the first freeze comes as soon as the service has started
    gc.unfreeze()
    try:
        kept = [[i] for i in range(1000)]  # lists: objects the cycle collector tracks
        await freeze_heap((0.0, 0.01))
        frozen = gc.get_freeze_count()
        assert frozen >= 1000
        del kept  # freed by reference counting: freezing only hides objects from the cycle collector
        assert gc.get_freeze_count() < frozen
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
