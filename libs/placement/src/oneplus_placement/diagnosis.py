"""Why a gang cannot be placed, in terms a person can act on: which constraint blocks at which level."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .fitters import adapt, static_eligible, static_units
from .layout import Layout, NodeSlot
from .levels import DomainSearch
from .request import GangRequest
from .snapshot import Holdings


def _where(level: str) -> str:
    if level == "node":
        return "on one node"
    if level == "cluster":
        return "in the cluster"
    if level == "nvlink":
        return "inside one NVLink domain"
    return f"under one {level}"


@dataclass(frozen=True)
class Explanation:
    """`level` is where the gang stops fitting ("request" when no node could ever host it)."""

    level: str
    constraint: str
    needed_gpus: float
    message: str
    best_candidate: str | None = None
    best_free_gpus: float = 0.0
    best_usable_gpus: float = 0.0
    ahead: tuple[str, ...] = ()
    preempt_to_fit: tuple[str, ...] = ()
    fits_now: bool = False
    details: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["ahead"] = list(self.ahead)
        d["preempt_to_fit"] = list(self.preempt_to_fit)
        return d


def _never(req: GangRequest, constraint: str, message: str) -> Explanation:
    return Explanation(level="request", constraint=constraint, needed_gpus=req.total_gpus, message=message)


def unknown_level(layout: Layout, req: GangRequest) -> Explanation | None:
    """A level the request names that this cluster does not define, with the levels it has."""
    names = layout.level_names
    for what, level in (("topology.domain", req.domain), ("topology.group_domain", req.group_domain)):
        if level is not None and level not in names:
            return _never(
                req,
                "level",
                f"{what} {level!r} is not a level of this cluster; its levels are {', '.join(names)}",
            )
    return None


def _segment_reason(layout: Layout, req: GangRequest, by_model: Sequence[NodeSlot]) -> Explanation | None:
    """A tensor-parallel group that spans ranks and no domain of its level can hold."""
    level = layout.level(req.segment_level or "")
    if level is None:
        return None
    ok = {s.index for s in by_model}
    best_gpus, best_name = 0, ""
    for g, members in enumerate(level.members):
        gpus = sum(
            static_units(layout, req, layout.slots[i]) * req.gpus_per_rank
            if not level.solo(i)
            else layout.slots[i].shape.largest_domain
            for i in members
            if i in ok
        )
        if gpus > best_gpus:
            best_gpus, best_name = gpus, level.names[g]
    if best_gpus >= req.segment_gpus:
        return None
    return _never(
        req,
        "group_domain",
        f"each tensor-parallel group of {req.segment_gpus} GPUs ({req.segment} ranks x {req.gpus_per_rank}) must sit "
        f"inside one {level.name} domain; the largest {level.name} domain here ({best_name}) holds {best_gpus} GPUs",
    )


def static_reason(snap: Holdings, req: GangRequest) -> Explanation | None:
    """A reason no node of this cluster could host one unit even when empty, or None."""
    slots = snap.layout.slots
    unknown = unknown_level(snap.layout, req)
    if unknown is not None:
        return unknown
    req = adapt(snap.layout, req)
    if any(static_eligible(snap.layout, req)):
        return None
    if req.hosts is not None:
        allowed = [s for s in slots if req.hosts.allows(s.name)]
        if not allowed:
            return _never(req, "nodelist", f"--nodelist/--exclude leave no node of this cluster ({req.hosts.text})")
        slots = tuple(allowed)
    by_model = [s for s in slots if s.matches_model(req.models)]
    if not by_model:
        have = sorted({s.gpu_model for s in slots})
        return _never(req, "gpu_model", f"needs GPU model {' or '.join(req.models or ())}; this cluster has {have}")
    by_model = [s for s in by_model if s.matches_features(req.features)]
    if not by_model:
        have = sorted({f for s in slots for f in s.features})
        text = req.features.text if req.features else ""
        return _never(
            req, "constraint", f"no node has the features {text!r} asks for; this cluster's features are {have}"
        )
    if not req.shared and req.segment > 1:
        seg = _segment_reason(snap.layout, req, by_model)
        if seg is not None:
            return seg
    if not req.shared and req.segment <= 1:
        biggest = max(by_model, key=lambda s: s.shape.n)
        if biggest.shape.n < req.unit_gpus:
            unit = "rank" if req.ranks_per_unit == 1 else f"tensor-parallel group of {req.ranks_per_unit} ranks"
            return _never(
                req,
                "rank_size",
                f"a {unit} needs {req.unit_gpus} GPUs on one node; the largest node ({biggest.name}) has "
                f"{biggest.shape.n}",
            )
        if req.group > 1:
            widest = max(by_model, key=lambda s: s.shape.largest_domain)
            return _never(
                req,
                "nvlink_domain",
                f"each tensor-parallel group of {req.group} GPUs must sit inside one NVLink domain; the largest "
                f"NVLink domain here has {widest.shape.largest_domain} GPUs ({widest.name})",
            )
    if req.shared and req.gpu_memory_mb:
        known = [g.memory_mb for s in by_model for g in s.topology.gpus if g.memory_mb is not None]
        if known and max(known) < req.gpu_memory_mb:
            return _never(
                req,
                "gpu_memory",
                f"a share pins {req.gpu_memory_mb} MiB of GPU memory; the largest GPU here has {max(known)} MiB",
            )
    most_cpu = max(s.cpus for s in by_model)
    if most_cpu + 1e-9 < req.unit_cpus:
        return _never(req, "cpu", f"a rank needs {req.unit_cpus:g} CPUs; the largest node has {most_cpu:g}")
    most_mem = max(s.memory_mb for s in by_model)
    return _never(req, "memory", f"a rank needs {req.unit_memory_mb} MB; the largest node has {most_mem} MB")


def _amount(req: GangRequest, units: float) -> str:
    if req.shared:
        return f"room for {units:g} share{'s' if units != 1 else ''}"
    return f"{units * req.unit_gpus:g} free"


def diagnose(snap: Holdings, req: GangRequest, search: DomainSearch) -> Explanation:
    """The widest allowed level, its best domain and what it lacks."""
    static = static_reason(snap, req)
    if static is not None:
        return static
    req = search.req
    level = search.levels()[-1]
    name, usable, raw = _best_domain(snap, search, level)
    need = req.units
    what = req.describe()
    where = _where(level)
    qualifiers: list[str] = []
    if req.models:
        qualifiers.append(f"on {' or '.join(req.models)} GPUs")
    if req.features:
        qualifiers.append(f"on nodes with {req.features.text}")
    if req.hosts is not None:
        qualifiers.append(req.hosts.text)
    if req.exclusive:
        qualifiers.append("on idle nodes")
    if req.segment > 1:
        qualifiers.append(f"in tensor-parallel groups of {req.segment_gpus} inside one {req.segment_level} domain")
    elif req.group > 1:
        qualifiers.append(f"in NVLink groups of {req.group}")
    qual = (" " + " ".join(qualifiers)) if qualifiers else ""
    limit = req.max_leaves if req.required else None
    above_leaf = level == "cluster" or (
        level in snap.layout.level_names
        and snap.layout.level_names.index(level) > snap.layout.level_names.index("leaf")
    )
    if limit is not None and above_leaf and search.plans(level, limit=1) == []:
        best_leaves = sorted(search.leaf_caps, reverse=True)[:limit]
        got = sum(best_leaves)
        if sum(search.leaf_caps) >= need:
            return Explanation(
                level=level,
                constraint="max_leaves",
                needed_gpus=req.total_gpus,
                best_usable_gpus=got * max(req.unit_gpus, 1),
                message=f"needs {what}{qual} across at most {limit} leaves; the best {limit} have {_amount(req, got)}",
            )
    if search.kind_searches():
        kind = _kind_reason(snap, req, search, level, f"needs {what}{qual} of one GPU model {where}")
        if kind is not None:
            return kind
    message = f"needs {what}{qual} {where}; "
    if name is None:
        message += "no node has room"
    else:
        if level == "cluster":
            message += f"the cluster has {_amount(req, usable)}"
        else:
            message += f"best {level} {name} has {_amount(req, usable)}"
        if not req.shared and raw > usable * req.unit_gpus:
            message += f" ({raw} free GPUs in all, but only {usable * req.unit_gpus} in usable sets)"
    constraint = "capacity" if level == "cluster" else "domain"
    ceiling = _static_ceiling(snap, req, level)
    if ceiling < need:
        room = _amount(req, ceiling).replace(" free", "")
        message += f"; even an empty {level} holds only {room}, so it can never fit"
        constraint = "domain_size" if level != "cluster" else "cluster_size"
    return Explanation(
        level=level,
        constraint=constraint,
        needed_gpus=req.total_gpus,
        message=message,
        best_candidate=name,
        best_free_gpus=float(raw),
        best_usable_gpus=float(usable * (req.unit_gpus or req.milli / 1000)),
        details={"units_needed": float(need), "units_best": float(usable)},
    )


MIX_HINT = "a gang keeps to one GPU model unless its gpu_models lists several or its queue sets mix_gpu_models"


def _kind_reason(snap: Holdings, req: GangRequest, search: DomainSearch, level: str, needs: str) -> Explanation | None:
    """Why a gang that must keep to one GPU model waits when nodes of several models would hold it together; None
    when even mixing them would not (the usual reasons then apply)."""
    if not any(search.mixed_plans(lvl, limit=1) for lvl in search.levels()):
        return None
    kinds = search.kind_searches()
    usable = {k.req.kind: _best_domain(snap, k, level)[1] for k in kinds}
    told = ", ".join(f"{kind} {_amount(req, units)}" for kind, units in usable.items())
    best = max(usable, key=lambda kind: usable[kind])
    ceilings = {k.req.kind: _static_ceiling(snap, k.req, level) for k in kinds}
    message = f"{needs}; waits for one GPU model: {told}; {MIX_HINT}"
    constraint = "gpu_kind"
    if max(ceilings.values()) < req.units:
        message = f"{needs}; no GPU model has enough nodes even when idle ({told}); {MIX_HINT}"
        constraint = "cluster_size"
    return Explanation(
        level=level,
        constraint=constraint,
        needed_gpus=req.total_gpus,
        message=message,
        best_candidate=best,
        best_free_gpus=float(usable[best] * max(req.unit_gpus, 1)),
        best_usable_gpus=float(usable[best] * (req.unit_gpus or req.milli / 1000)),
        details={"units_needed": float(req.units), "units_best": float(usable[best])},
    )


def _best_domain(snap: Holdings, search: DomainSearch, level: str) -> tuple[str | None, int, int]:
    """(name, usable units, raw free GPUs) of the domain of `level` with the most usable units."""
    layout = snap.layout
    eligible = search.fitter.eligible
    fc = snap.free_count
    if level == "node":
        if not search.caps:
            return None, 0, 0
        i = max(search.caps, key=lambda n: (search.caps[n], fc[n], -n))
        return layout.slots[i].name, search.caps[i], fc[i]
    k = next((k for k, lv in enumerate(layout.levels) if lv.name == level), None)
    if k is None:
        raw = sum(fc[i] for i in range(len(fc)) if eligible[i])
        return layout.name, sum(search.leaf_caps), raw
    caps = search.level_caps(k)
    lv = layout.levels[k]
    # Among domains with no room, one with nodes the gang may use (its models), not a domain of another kind.
    best = max(range(len(caps)), key=lambda g: (caps[g], any(eligible[i] for i in lv.members[g]), -g))
    raw = sum(fc[i] for i in lv.members[best] if eligible[i])
    return lv.names[best], caps[best], raw


def _static_ceiling(snap: Holdings, req: GangRequest, level: str) -> int:
    """Units the largest domain of `level` holds when empty."""
    layout = snap.layout
    req = adapt(layout, req)
    key = (
        "ceiling",
        level,
        req.segment,
        req.segment_level,
        req.models,
        req.kind,
        req.spread,
        req.ranks_per_unit,
        req.features,
        req.hosts,
        req.unit_gpus,
        req.group,
        req.milli,
        req.unit_cpus,
        req.unit_memory_mb,
    )
    got = layout.cache.get(key)
    if isinstance(got, int):
        return got
    eligible = static_eligible(layout, req)
    per_node = [0] * len(layout.slots)
    for s in layout.slots:
        if not eligible[s.index]:
            continue
        gpu = s.shape.n * (1000 // req.milli) // req.ranks_per_unit if req.shared else static_units(layout, req, s)
        units = min(gpu, int(s.cpus // req.unit_cpus), s.memory_mb // req.unit_memory_mb)
        per_node[s.index] = min(units, 1) if req.spread else units
    groups: Sequence[Sequence[int]]
    site = layout.level(level)
    if level == "node":
        groups = [[i] for i in range(len(per_node))]
    elif site is not None:
        groups = site.members
    else:
        groups = [list(range(len(per_node)))]
    ceiling = max(sum(per_node[i] for i in g) for g in groups)
    layout.cache[key] = ceiling
    return ceiling
