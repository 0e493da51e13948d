"""ONEPLUS_OWNER_FENCE: the owner's server-checked write preconditions are on by default, on one server and on a
replicated cluster alike (docs/architecture.md#owner-fence); `off` leaves the lease's clock guard alone."""

from __future__ import annotations

import pytest
from oneplus_bus.fencing import EXPECTED_SEQ, FENCED_STREAMS, OwnerFence, fence_enabled


def test_auto_fences_one_replica_and_replicated_streams() -> None:
    assert fence_enabled({}) is True
    assert fence_enabled({"ONEPLUS_STREAM_REPLICAS": "1"}) is True
    assert fence_enabled({"ONEPLUS_STREAM_REPLICAS": "3"}) is True
    assert fence_enabled({"ONEPLUS_STREAM_REPLICAS": "3", "ONEPLUS_OWNER_FENCE": "on"}) is True
    assert fence_enabled({"ONEPLUS_OWNER_FENCE": "off"}) is False


def test_a_bad_fence_mode_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="ONEPLUS_OWNER_FENCE='sometimes': on, off or auto"):
        fence_enabled({"ONEPLUS_OWNER_FENCE": "sometimes"})


async def test_an_unfenced_owner_writes_no_precondition_and_publishes_no_fence(nc) -> None:  # type: ignore[no-untyped-def]
    fence = OwnerFence(nc.jetstream(), nc, "solver-a", enabled=False)
    assert await fence.establish(7) == 7
    assert set(fence.seqs) == set(FENCED_STREAMS)
    for stream in FENCED_STREAMS:
        assert EXPECTED_SEQ not in fence.headers(stream, {"Nats-Msg-Id": "x"})
        assert await fence.last(stream) == (0, 0)  # nothing was written to the streams
