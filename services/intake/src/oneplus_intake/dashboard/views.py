"""What the dashboard shows, built from what the platform answers: pure functions, no I/O.

`cluster_view`: leaves → nodes → NVLink domains → GPUs, each GPU with the jobs holding it and its health, and per
domain, node, leaf and cluster the counts of free, held, unhealthy and fragmented GPUs. A node's NVLink domains are
the connected components of its healthy NVLink graph (`oneplus_topology.nvlink_domains`, what the solver places
into); the GPUs outside every domain (a PCIe-only node, a GPU with a link down) form one "pcie" group of the node.

Fragmented: a free GPU in a domain that a job already uses part of. A gang that wants the whole domain cannot have
it, and what is left is smaller than the domain: the free capacity the scheduler cannot hand out whole.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from oneplus_contracts import JobRecord, NodeRecord
from oneplus_contracts.jobindex import HOLDING_STATES
from oneplus_placement.tree import Level, build_levels, node_levels
from oneplus_queueing.advance import live_rows
from oneplus_topology import nvlink_domains, nvlink_groups

NO_LEAF = "(no leaf)"
EVENT_LIMIT = 500


HUES = 16  # colour slots: hues 22.5 degrees apart
SLOT_ORDER = (0, 8, 4, 12, 2, 6, 10, 14, 1, 3, 5, 7, 9, 11, 13, 15)  # from a job's own slot, the farthest first


def _slot_of(job_id: str) -> int:
    return int.from_bytes(hashlib.blake2s(job_id.encode(), digest_size=4).digest()[:2], "big") % HUES


def _colour(slot: int) -> str:
    return f"hsl({slot * 360 // HUES}, 70%, {45 if slot % 2 == 0 else 55}%)"


def colour_of(job_id: str) -> str:
    """A job's own colour, from its id: what it is shown in when it shares no node with a job holding GPUs."""
    return _colour(_slot_of(job_id))


def _apart(a: int, b: int) -> int:
    d = abs(a - b) % HUES
    return min(d, HUES - d)


def job_colours(jobs: Iterable[JobRecord]) -> dict[str, str]:
    """One colour per job holding GPUs, distinct from those of the jobs on its nodes (a hash alone gave two jobs on
    one node nearly the same hue). Jobs are served oldest placement first, each keeping its own colour unless a job
    already coloured on one of its nodes is within 45 degrees of it; then the farthest free slot. A job keeps its
    colour while the older jobs beside it run, and it is the same on every page."""
    holders = [r for r in jobs if r.state in HOLDING_STATES and r.allocation is not None]
    holders.sort(key=lambda r: (r.placed_ts or r.submitted_ts, r.job_id))
    slots: dict[str, int] = {}
    on_node: dict[str, list[str]] = {}
    for rec in holders:
        assert rec.allocation is not None
        nodes = rec.allocation.nodes
        near = {slots[j] for n in nodes for j in on_node.get(n, [])}
        own = _slot_of(rec.job_id)
        chosen = own
        for gap in (3, 2, 1):  # 67.5, 45, 22.5 degrees from every neighbour, the widest that can be had
            fits = [
                (own + step) % HUES for step in SLOT_ORDER if all(_apart((own + step) % HUES, s) >= gap for s in near)
            ]
            if fits:
                chosen = fits[0]
                break
        slots[rec.job_id] = chosen
        for n in nodes:
            on_node.setdefault(n, []).append(rec.job_id)
    return {job_id: _colour(slot) for job_id, slot in slots.items()}


# total = free + held + unhealthy + unavailable + mig; fragmented is a part of free, shared a part of held.
COUNTS = ("total", "free", "held", "unhealthy", "unavailable", "mig", "fragmented", "shared")


def _counts() -> dict[str, int]:
    return dict.fromkeys(COUNTS, 0)


def _add(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    for key in COUNTS:
        into[key] += part.get(key, 0)


def _frag_pct(c: Mapping[str, Any]) -> float:
    return round(100.0 * c["fragmented"] / c["free"], 1) if c["free"] else 0.0


def holdings(jobs: Iterable[JobRecord]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(node, gpu) → the jobs holding that GPU (several when they share it by `gpu_milli`)."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rec in jobs:
        if rec.state not in HOLDING_STATES or rec.allocation is None:
            continue
        for rank in rec.allocation.ranks:
            for gpu in rank.gpus:
                holder = {
                    "job_id": rec.job_id,
                    "token": rec.token,
                    "state": rec.state,
                    "rank": rank.rank,
                    "milli": rank.gpu_milli or 1000,
                }
                out.setdefault((rank.node, gpu), []).append(holder)
    return out


def mig_holdings(jobs: Iterable[JobRecord]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(node, MIG instance UUID) → the jobs holding that instance (a rank's `mig` in its allocation)."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in jobs:
        if rec.state not in HOLDING_STATES or rec.allocation is None:
            continue
        for rank in rec.allocation.ranks:
            for uuid in rank.mig:
                holder = {"job_id": rec.job_id, "token": rec.token, "state": rec.state, "rank": rank.rank, "mig": uuid}
                out.setdefault((rank.node, uuid), []).append(holder)
    return out


_SLICES = re.compile(r"^(\d+)g\.")


def _slices(profile: str) -> int:
    """Compute slices of a MIG profile (`3g.40gb` → 3): what a held instance fills of its GPU's tile."""
    m = _SLICES.match(profile)
    return int(m.group(1)) if m else 1


def mig_layout(node: NodeRecord, mig_held: Mapping[tuple[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each GPU of the node: its MIG mode and instances (device, profile, UUID, the jobs holding it), as `oneplus
    nodes show` lists them; GPUs not in MIG mode have `mig_enabled` false and no instances."""
    name = node.topology.node
    rows: list[dict[str, Any]] = []
    for g in sorted(node.topology.gpus, key=lambda g: g.index):
        instances = []
        for inst in sorted(g.mig_instances, key=lambda i: i.device):
            holders = mig_held.get((name, inst.uuid), [])
            instances.append(
                {
                    "device": inst.device,
                    "profile": inst.profile,
                    "uuid": inst.uuid,
                    "job_id": holders[0]["job_id"] if holders else None,
                    "holders": holders,
                }
            )
        rows.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "mig_enabled": g.mig_enabled or bool(instances),
                "instances": instances,
                "held": sum(1 for i in instances if i["holders"]),
                "free": sum(1 for i in instances if not i["holders"]),
            }
        )
    return rows


def _gpu_health(node: NodeRecord, index: int) -> tuple[str, str | None]:
    """("ok" | "unhealthy" | "degraded", why)."""
    info = next((g for g in node.topology.gpus if g.index == index), None)
    if index in node.unhealthy_gpus or (info is not None and not info.healthy):
        return "unhealthy", (info.health_reason if info is not None else None) or "reported unhealthy"
    if info is not None and info.nvlinks_active < info.nvlinks_total:
        return "degraded", f"NVLink {info.nvlinks_active}/{info.nvlinks_total} links up"
    return "ok", None


def _domain(
    node: NodeRecord,
    domain_id: str,
    kind: str,
    gpus: Sequence[int],
    held: Mapping[tuple[str, int], list[dict[str, Any]]],
    groups: Sequence[Sequence[int]],
    mig: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    name = node.topology.node
    counts = _counts()
    gpu_rows: list[dict[str, Any]] = []
    free: set[int] = set()
    whole_held = 0
    for index in gpus:
        layout = (mig or {}).get(index)
        instances: list[Mapping[str, Any]] = list(layout["instances"]) if layout else []
        slices = sum(_slices(i["profile"]) for i in instances)
        # A GPU split into MIG instances is held through them (placement never hands it out whole), each holder
        # holding its instance's compute slices of it.
        holders = held.get((name, index), []) + [
            {**h, "milli": 1000 * _slices(i["profile"]) // slices} for i in instances for h in i["holders"]
        ]
        health, why = _gpu_health(node, index)
        if holders:
            state = "held"
        elif health == "unhealthy":
            state = "unhealthy"
        elif not node.schedulable:
            state = "unavailable"
        elif instances:
            state = "mig"  # its instances are free for MIG jobs; the GPU is never handed out whole (snapshot)
        else:
            state = "free"
            free.add(index)
        counts["total"] += 1
        counts[state] += 1
        whole_held += bool(holders) and not instances
        share = sum(int(h["milli"]) for h in holders)
        if holders and share < 1000:
            counts["shared"] += 1  # held, by shares (or MIG instances) that leave room for a job asking a part
        gpu_rows.append(
            {
                "index": index,
                "state": state,
                "health": health,
                "health_reason": why,
                "job_id": holders[0]["job_id"] if holders else None,
                "holders": holders,
                "held_milli": min(1000, share),  # how much of it is held, in 1/1000 (MIG: its held compute slices)
                "mig_enabled": bool(layout and layout["mig_enabled"]),
                "mig_instances": len(instances),
            }
        )
    # Only a job on whole GPUs (or shares of them) breaks the domain: a MIG GPU never was part of a whole-GPU gang.
    if whole_held and counts["free"]:
        counts["fragmented"] = counts["free"]
    if counts["free"] + counts["mig"] == counts["total"]:
        state = "idle"
    elif not counts["free"] and not counts["mig"]:
        state = "full" if counts["held"] else "down"
    elif counts["fragmented"]:
        state = "fragmented"
    else:
        state = "partial"  # free GPUs beside unhealthy, unavailable or MIG-held ones, no whole-GPU job among them
    # The biggest all-to-all NVLink set still free here: what a gang packed into one NVLink group could get.
    largest = max((len(free.intersection(g)) for g in groups), default=0) if kind == "nvlink" else 0
    return {
        "id": domain_id,
        "kind": kind,
        "state": state,
        "gpus": gpu_rows,
        "largest_free_nvlink_group": largest,
        "jobs": sorted({str(h["job_id"]) for g in gpu_rows for h in g["holders"]}),
        **counts,
    }


def node_view(
    node: NodeRecord,
    held: Mapping[tuple[str, int], list[dict[str, Any]]],
    mig_held: Mapping[tuple[str, str], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    topo = node.topology
    domains = nvlink_domains(topo)
    groups = nvlink_groups(topo)
    inside = {g for d in domains for g in d}
    layout = mig_layout(node, mig_held or {})
    mig = {g["index"]: g for g in layout if g["mig_enabled"]}
    rows = [_domain(node, f"{topo.node}/nv{i}", "nvlink", d, held, groups, mig) for i, d in enumerate(domains)]
    rest = [g.index for g in topo.gpus if g.index not in inside]
    if rest:
        rows.append(_domain(node, f"{topo.node}/pcie", "pcie", rest, held, groups, mig))
    counts = _counts()
    for d in rows:
        _add(counts, d)
    return {
        "name": topo.node,
        "leaf": topo.leaf or NO_LEAF,
        "spine": topo.spine,
        "gpu_model": topo.gpu_model,
        "nvlink_domain": topo.nvlink_domain,
        # The node's domain at each level of the site, bottom-up, as placement reads them (docs/topology.md).
        "levels": {name: value for name, value in node_levels(topo) if value},
        "status": node.status,
        "schedulable": node.schedulable,
        "cordoned": node.cordoned,
        "draining": node.draining,
        "reason": node.reason,
        "last_heartbeat": node.last_heartbeat,
        "domains": rows,
        # Every GPU's MIG mode and instances, each with the jobs holding it; empty when no GPU is in MIG mode.
        "mig_layout": layout if mig else [],
        "frag_pct": _frag_pct(counts),
        **counts,
    }


def job_legend(jobs: Sequence[JobRecord], colours: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    colours = job_colours(jobs) if colours is None else colours
    return {
        rec.job_id: {
            "job_id": rec.job_id,
            "name": rec.spec.name,
            "team": rec.spec.team,
            "user": rec.spec.user,
            "state": rec.state,
            "token": rec.token,
            "gpus": rec.spec.total_gpus,
            "colour": colours.get(rec.job_id) or colour_of(rec.job_id),
        }
        for rec in jobs
        if rec.state in HOLDING_STATES and rec.allocation is not None
    }


def level_tree(
    nodes: Sequence[NodeRecord], rows: Sequence[Mapping[str, Any]], levels: Sequence[Level] | None = None
) -> list[dict[str, Any]]:
    """The site's level tree (`oneplus_placement.tree.build_levels`, what placement searches), top level first: each
    domain with its level, name, node and GPU counts and GPUs in use (`gpus_in_use`: held), its domains one level
    down (`children`) and the nodes directly under it (`nodes`, names). `rows[i]` is node i's `node_view`.

    A domain the site does not name (a level a node has no value for, e.g. the `nvlink` level of an H100 board in a
    cluster with NVL72 racks) that holds a single node is that node: it is left out and the node hangs from the
    domain above, so a board is not drawn as a one-tray NVLink domain."""
    levels = build_levels([n.topology for n in nodes]) if levels is None else levels
    named = [{lv for lv, value in node_levels(n.topology) if value} for n in nodes]

    def group(k: int, g: int) -> list[dict[str, Any]]:
        lv = levels[k]
        members = lv.members[g]
        below = [x for c in lv.children[g] for x in group(k - 1, c)] if k else []
        if len(members) == 1 and lv.name not in named[members[0]]:
            return below or [{"node": members[0]}]
        counts = _counts()
        for i in members:
            _add(counts, rows[i])
        groups = sorted((x for x in below if "node" not in x), key=lambda x: str(x["name"]))
        direct = list(members) if k == 0 else [int(x["node"]) for x in below if "node" in x]
        return [
            {
                "id": f"{lv.name}:{lv.names[g]}",
                "level": lv.name,
                "name": lv.names[g],
                "node_count": len(members),
                "gpus": counts["total"],
                "gpus_in_use": counts["held"],
                "children": groups,
                "nodes": sorted(str(rows[i]["name"]) for i in direct),
                "frag_pct": _frag_pct(counts),
                **counts,
            }
        ]

    if not levels:
        return []
    top = len(levels) - 1
    out = [x for g in range(len(levels[top].names)) for x in group(top, g)]
    loose = sorted(str(rows[int(x["node"])]["name"]) for x in out if "node" in x)
    tree = sorted((x for x in out if "node" not in x), key=lambda x: str(x["name"]))
    if loose:  # nodes no named domain holds (a lone node of a site that names none): one group of the cluster
        counts = _counts()
        for r in rows:
            if r["name"] in loose:
                _add(counts, r)
        tree.append(
            {
                "id": "cluster:",
                "level": "cluster",
                "name": "cluster",
                "node_count": len(loose),
                "gpus": counts["total"],
                "gpus_in_use": counts["held"],
                "children": [],
                "nodes": loose,
                "frag_pct": _frag_pct(counts),
                **counts,
            }
        )
    return tree


def cluster_view(nodes: Iterable[NodeRecord], jobs: Sequence[JobRecord], now: float) -> dict[str, Any]:
    """The whole picture: the site's level tree (`tree`, any depth, down to the nodes), leaves (sorted) → nodes
    (sorted) → domains → GPUs, counts at every level, and the jobs holding GPUs with their colours."""
    held = holdings(jobs)
    mig_held = mig_holdings(jobs)
    leaves: dict[str, dict[str, Any]] = {}
    ordered = sorted(nodes, key=lambda n: n.topology.node)
    rows: list[dict[str, Any]] = []
    for node in ordered:
        view = node_view(node, held, mig_held)
        rows.append(view)
        leaf = leaves.setdefault(view["leaf"], {"name": view["leaf"], "spine": view["spine"], "nodes": [], **_counts()})
        leaf["nodes"].append(view)
        _add(leaf, view)
    site = build_levels([n.topology for n in ordered])
    total = _counts()
    domain_states: dict[str, int] = {}
    for leaf in leaves.values():
        leaf["frag_pct"] = _frag_pct(leaf)
        _add(total, leaf)
        for node_row in leaf["nodes"]:
            for d in node_row["domains"]:
                domain_states[d["state"]] = domain_states.get(d["state"], 0) + 1
    return {
        "ts": now,
        "summary": {
            **total,
            "nodes": sum(len(leaf["nodes"]) for leaf in leaves.values()),
            "leaves": len(leaves),
            "frag_pct": _frag_pct(total),
            "domains": domain_states,
        },
        "leaves": [leaves[k] for k in sorted(leaves)],
        # The site's levels bottom-up (`nvlink`, `rack`, `leaf`, `spine`, `zone`, ...) and their tree, top first.
        "levels": [lv.name for lv in site],
        "tree": level_tree(ordered, rows, site),
        "jobs": job_legend(jobs),
    }


def node_detail(cluster: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """One node's page from the cluster picture: its row (domains, GPUs, MIG layout), its domains from the top of the
    level tree down (`path`: level, name, GPUs, GPUs in use) and the legend of the jobs on it; None: no such node."""
    row = next((n for leaf in cluster["leaves"] for n in leaf["nodes"] if n["name"] == name), None)
    if row is None:
        return None

    def walk(groups: Sequence[Mapping[str, Any]], above: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        for g in groups:
            here = [*above, {k: g[k] for k in ("id", "level", "name", "node_count", "gpus", "gpus_in_use")}]
            if name in g["nodes"]:
                return here
            found = walk(g["children"], here)
            if found is not None:
                return found
        return None

    on_it = {str(h["job_id"]) for d in row["domains"] for gpu in d["gpus"] for h in gpu["holders"]}
    return {
        "ts": cluster["ts"],
        "node": row,
        "path": walk(cluster.get("tree", []), []) or [],
        "jobs": {k: v for k, v in cluster["jobs"].items() if k in on_it},
    }


def queue_view(
    rows: Sequence[Mapping[str, Any]],
    now: float,
    colours: Mapping[str, str] | None = None,
    reservations: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The solver's squeue rows split into pending (serving order, with reason) and holding jobs (`colours`: the
    cluster picture's, `job_colours`), and the advance reservations active or to come with their waiting jobs. A
    pending row's `time` is how long it has waited since submission."""
    colours = colours or {}
    pending = [dict(r) for r in rows if r.get("st") == "PD"]
    holding = [
        dict(r) | {"colour": colours.get(str(r.get("job_id"))) or colour_of(str(r.get("job_id")))}
        for r in rows
        if r.get("st") != "PD"
    ]
    return {"ts": now, "pending": pending, "holding": holding, "reservations": live_rows(reservations, rows)}


def _event_summary(ev: Mapping[str, Any]) -> str:
    kind = ev.get("type")
    parts: list[str] = []
    if kind == "placed":
        alloc = ev.get("allocation") or {}
        where = ", ".join(f"{r.get('node')}:{','.join(map(str, r.get('gpus', [])))}" for r in alloc.get("ranks", []))
        parts.append(f"on {alloc.get('domain', '?')} {where}; token {ev.get('token')}, attempt {ev.get('attempt')}")
    for key in ("node", "state", "exit_code", "reason", "by", "preemptor", "fault", "source"):
        value = ev.get(key)
        if value is not None and value != "":
            parts.append(f"{key} {value}")
    if ev.get("warnings"):
        parts.append("warnings: " + "; ".join(ev["warnings"]))
    return "; ".join(parts)


def timeline(rec: JobRecord) -> list[dict[str, Any]]:
    """The record's milestones with their times (the latest attempt's), each with seconds since submission."""
    marks = [
        ("submitted", rec.submitted_ts),
        ("placed", rec.placed_ts),
        ("started", rec.started_ts),
        ("checkpointed", rec.checkpoint_ts),
        ("finished", rec.finished_ts),
    ]
    out = [{"step": step, "ts": ts, "after_s": round(ts - rec.submitted_ts, 3)} for step, ts in marks if ts]
    return sorted(out, key=lambda m: m["ts"])


PENDING_STATES = frozenset({"SUBMITTED", "ACCEPTED"})


def pending_view(rec: JobRecord, explain: Mapping[str, Any] | None, now: float) -> dict[str, Any] | None:
    """Why a pending job waits, for its page: the solver's reason code and message (`jobs explain`), the whole
    explanation, and how long it has waited since submission; None for a job that is not pending."""
    if rec.state not in PENDING_STATES:
        return None
    ex = dict(explain or {})
    error = ex.pop("error", None)
    return {
        "reason": ex.get("reason"),
        "message": ex.get("message") or rec.reason or "",
        "waiting_s": round(max(0.0, now - rec.submitted_ts), 1),
        "explain": ex or None,
        "error": error,
    }


def job_view(
    rec: JobRecord,
    events: Sequence[Mapping[str, Any]],
    now: float,
    *,
    colour: str | None = None,
    explain: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One job: its record, where its ranks are, its milestones and its events in stream order; for a pending job,
    why it waits (`explain`: the solver's answer, or {"error": ...} when it gave none)."""
    ranks = []
    if rec.allocation is not None:
        ranks = [r.model_dump(mode="json") for r in rec.allocation.ranks]
    first = rec.submitted_ts
    rows = [
        {
            "seq": ev.get("seq"),
            "type": ev.get("type"),
            "ts": ev.get("ts"),
            "after_s": round(float(ev["ts"]) - first, 3) if isinstance(ev.get("ts"), int | float) else None,
            "summary": _event_summary(ev),
            "event": dict(ev),
        }
        for ev in events[:EVENT_LIMIT]
    ]
    return {
        "ts": now,
        "job": rec.model_dump(mode="json"),
        "colour": colour or colour_of(rec.job_id),
        "holding": rec.state in HOLDING_STATES and rec.allocation is not None,
        "pending": pending_view(rec, explain, now),
        "placement": {
            "domain": rec.allocation.domain if rec.allocation else None,
            "ring_gbps": rec.allocation.ring_gbps if rec.allocation else None,
            "solver": rec.allocation.solver if rec.allocation else None,
            "nodes": rec.allocation.nodes if rec.allocation else [],
            "ranks": ranks,
        },
        "timeline": timeline(rec),
        "events": rows,
        "events_truncated": len(events) > EVENT_LIMIT,
    }
