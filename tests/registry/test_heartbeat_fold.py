"""The registry's pure rules for folding a heartbeat: what is news, what must be stored, what costs a copy."""

from __future__ import annotations

from oneplus_contracts import GpuHealth, NodeHeartbeat, NodeRecord
from oneplus_topology.presets import load_preset
from oneplus_topology_registry.health import apply_heartbeat, record_changed, summary_changed


def record() -> NodeRecord:
    return NodeRecord(topology=load_preset(BOARD, "h0"), last_heartbeat=100.0)


BOARD = "h100_sxm_8gpu_nvswitch_nv18"


def beat(ts: float, *gpus: GpuHealth, engine_ok: bool = True) -> NodeHeartbeat:
    every = list(gpus) or [GpuHealth(index=i) for i in range(8)]
    return NodeHeartbeat(node="h0", ts=ts, gpus=every, engine_ok=engine_ok)


def test_a_heartbeat_that_changes_nothing_but_the_time_keeps_the_board_and_is_not_stored() -> None:
    rec = record()
    after = apply_heartbeat(rec, beat(105.0))
    assert after.last_heartbeat == 105.0
    assert after.topology is rec.topology  # no copy of 8 GPUs and their links
    assert not record_changed(rec, after)
    assert not summary_changed(rec, after)


def test_an_unhealthy_gpu_or_fewer_nvlinks_copy_the_board_and_are_news() -> None:
    rec = record()
    sick = apply_heartbeat(rec, beat(105.0, GpuHealth(index=3, healthy=False, reason="Xid 79")))
    assert sick.topology is not rec.topology
    assert sick.unhealthy_gpus == [3]
    assert sick.topology.gpus[3].health_reason == "Xid 79"
    assert rec.topology.gpus[3].healthy  # the record it came from is untouched
    assert record_changed(rec, sick) and summary_changed(rec, sick)

    links = rec.topology.gpus[0].nvlinks_active
    assert links is not None and links > 1
    degraded = apply_heartbeat(rec, beat(106.0, GpuHealth(index=0, nvlinks_active=links - 1)))
    assert degraded.unhealthy_gpus == []
    assert record_changed(rec, degraded) and summary_changed(rec, degraded)
    # The same degraded report again: no new copy, nothing to store.
    again = apply_heartbeat(degraded, beat(107.0, GpuHealth(index=0, nvlinks_active=links - 1)))
    assert again.topology is degraded.topology
    assert not record_changed(degraded, again)


def test_record_changed_sees_every_field_but_the_heartbeat_time() -> None:
    rec = record()
    assert not record_changed(rec, rec.model_copy(update={"last_heartbeat": 200.0}))
    assert record_changed(rec, rec.model_copy(update={"cordoned": True}))
    assert record_changed(rec, apply_heartbeat(rec, beat(101.0, engine_ok=False)))
    # A board replaced by an equal one (a topology report again) is no change.
    assert not record_changed(rec, rec.model_copy(update={"topology": load_preset(BOARD, "h0")}))
    other = load_preset(BOARD, "h0").model_copy(update={"leaf": "leaf-9"})
    assert record_changed(rec, rec.model_copy(update={"topology": other}))


def test_a_report_folded_after_a_newer_lease_brings_its_news_and_keeps_the_clock() -> None:
    """Reports and leases come on two subscriptions: a report taken at 104 can be folded after a lease of 106."""
    rec = record().model_copy(update={"last_heartbeat": 106.0})
    after = apply_heartbeat(rec, beat(104.0, GpuHealth(index=3, healthy=False, reason="Xid 79")))
    assert after.unhealthy_gpus == [3] and after.last_heartbeat == 106.0
