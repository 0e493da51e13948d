"""Pure rules for a node's status from its reports, heartbeats and the operator's requests."""

from __future__ import annotations

from oneplus_contracts import NodeHeartbeat, NodeRecord, NodeStatus


def status_of(rec: NodeRecord, now: float, lost_after_s: float) -> NodeStatus:
    if rec.last_heartbeat and now - rec.last_heartbeat > lost_after_s:
        return "lost"
    if rec.cordoned:
        return "cordoned"
    if rec.draining:
        return "draining"
    if not rec.engine_ok or (rec.topology.gpus and len(rec.unhealthy_gpus) == len(rec.topology.gpus)):
        return "unhealthy"
    return "ready"


def apply_heartbeat(rec: NodeRecord, hb: NodeHeartbeat) -> NodeRecord:
    """Fold a heartbeat in: GPU health, engine health and NVLink degradation (fewer active links)."""
    by_index = {g.index: g for g in hb.gpus}
    gpus = []
    unhealthy: list[int] = []
    changed = False
    for g in rec.topology.gpus:
        h = by_index.get(g.index)
        if h is None:
            gpus.append(g)
            continue
        active = h.nvlinks_active if h.nvlinks_active is not None else g.nvlinks_active
        if (g.healthy, g.health_reason, g.nvlinks_active) != (h.healthy, h.reason, active):
            g = g.model_copy(update={"healthy": h.healthy, "health_reason": h.reason, "nvlinks_active": active})
            changed = True
        gpus.append(g)
        if not h.healthy:
            unhealthy.append(g.index)
    # The same board when no GPU changed: most heartbeats, which then cost no copy and compare by identity.
    topo = rec.topology.model_copy(update={"gpus": gpus}) if changed else rec.topology
    return rec.model_copy(
        update={
            "topology": topo,
            # A report folded after a newer lease (two subjects, two subscriptions) must not set the clock back.
            "last_heartbeat": max(rec.last_heartbeat, hb.ts),
            "unhealthy_gpus": unhealthy,
            "engine_ok": hb.engine_ok,
            "reason": hb.engine_reason if not hb.engine_ok else None,
        }
    )


def summary_changed(a: NodeRecord, b: NodeRecord) -> bool:
    """Whether placement must hear about it (heartbeat timestamps alone are not news)."""
    return (
        a.status != b.status
        or a.unhealthy_gpus != b.unhealthy_gpus
        or a.engine_ok != b.engine_ok
        or (
            a.topology is not b.topology
            and [g.nvlinks_active for g in a.topology.gpus] != [g.nvlinks_active for g in b.topology.gpus]
        )
        or a.cordoned != b.cordoned
        or a.draining != b.draining
    )


def record_changed(a: NodeRecord, b: NodeRecord) -> bool:
    """Whether the stored record must be rewritten: anything but the heartbeat's time (status, health, flags,
    topology). A heartbeat that changes nothing else updates the registry's memory only."""
    # Field by field, the same object first: a heartbeat keeps the board it found, so the deep compare of every
    # GPU and link (4,096 nodes' heartbeats, the registry's largest cost) runs only when the board was replaced.
    other = b.__dict__
    return any(
        name != "last_heartbeat" and value is not other[name] and value != other[name]
        for name, value in a.__dict__.items()
    )


def heartbeat_due(stored: float, last_heartbeat: float, every_s: float) -> bool:
    """Whether a node's last heartbeat is old enough in the store (`stored`) to persist again (so a restarted
    registry, which counts every node as seen at its start, is never far behind)."""
    return last_heartbeat - stored >= every_s
