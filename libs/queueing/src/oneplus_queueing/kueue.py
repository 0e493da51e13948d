"""Kueue's queue objects as a OnePlus queue config: pure, no I/O (`oneplus queues apply -f`, `oneplus dev up --queues`).

What maps to what:

- `ClusterQueue` → a queue. Its GPU quota (`nominalQuota` of `nvidia.com/gpu`, or any `*/gpu` resource, summed over
  its flavors) is the queue's `guarantee_gpus`; `borrowingLimit` is `borrow_limit_gpus` (no limit when a flavor in a
  cohort gives none, as in Kueue; 0 outside a cohort, where Kueue cannot borrow); `queueingStrategy` is `queueing`
  (StrictFIFO → strict-fifo); `fairSharing.weight` is `weight`; its flavors' GPU models are `gpu_models`.
- `Cohort` (or a cohort a ClusterQueue names without defining it) → the parent queue of its ClusterQueues (and
  `parentName` its own parent). Its guarantee is its own quota plus its members', so borrowing stays inside it.
  (Its own flavors set no models: each ClusterQueue's flavors decide its jobs'.)
- `LocalQueue` → a leaf queue under its ClusterQueue, named as the LocalQueue: a Kueue job's
  `kueue.x-k8s.io/queue-name: user-queue` finds the queue `user-queue`. Its guarantee is 0: the LocalQueues of one
  ClusterQueue share its quota, as in Kueue, and it keeps the ClusterQueue's queueing strategy.
- `ResourceFlavor` → GPU models: a flavor's node labels (`nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3`,
  `cloud.google.com/gke-accelerator: nvidia-tesla-a100`...) or, failing that, its name, read for a known model.
- `WorkloadPriorityClass` → a priority class with its value.

Fields Kueue has and OnePlus does not use (cpu and memory quotas, lendingLimit, preemption policies, namespace
selectors...) come back as notes, one line each; a field Kueue does not have, or a value of the wrong kind, is an
error, one line each, naming the document and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from .config import DEFAULT_QUEUE, QueueConfig, QueueConfigError, load_queue_config

KUEUE_GROUP = "kueue.x-k8s.io/"
KINDS = ("ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass")
GPU_RESOURCE = re.compile(r"(^|/)gpu$")
# Longest first: "L40S" before "L40" before "L4", "A100" before "A10".
KNOWN_MODELS: tuple[str, ...] = ("GB200", "B200", "H200", "H100", "H800", "A100", "A800", "L40S", "L40", "A10G")
KNOWN_MODELS += ("A10", "V100", "T4", "RTX4090", "L4")
_MODEL_RE = re.compile("|".join(re.escape(m) for m in sorted(KNOWN_MODELS, key=len, reverse=True)), re.IGNORECASE)

# Per kind: the spec fields read, and those Kueue has that OnePlus leaves unused (a note each when present).
_CQ_READ = {"resourceGroups", "cohort", "cohortName", "queueingStrategy", "fairSharing"}
_CQ_UNUSED = {"namespaceSelector", "preemption", "flavorFungibility", "admissionChecks", "admissionChecksStrategy"}
_CQ_UNUSED |= {"stopPolicy", "admissionScope"}
_SPEC_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "ClusterQueue": (_CQ_READ, _CQ_UNUSED),
    "Cohort": ({"parentName", "resourceGroups", "fairSharing"}, set()),
    "LocalQueue": ({"clusterQueue"}, {"stopPolicy", "fairSharing"}),
    "ResourceFlavor": ({"nodeLabels"}, {"nodeTaints", "tolerations", "topologyName"}),
}
_META_FIELDS = {"name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation"}
_META_FIELDS |= {"creationTimestamp", "managedFields", "finalizers", "ownerReferences"}
_TOP_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}


@dataclass
class KueueImport:
    """The OnePlus queue config made of Kueue objects, its YAML (what is stored), and a note per field not used."""

    config: QueueConfig
    yaml_text: str
    notes: list[str] = field(default_factory=list)
    local_queues: dict[str, str] = field(default_factory=dict)  # LocalQueue → its ClusterQueue


def is_kueue(docs: list[Any]) -> bool:
    """Some document is a Kueue object (its apiVersion is in the kueue.x-k8s.io group)."""
    return any(isinstance(d, dict) and str(d.get("apiVersion", "")).startswith(KUEUE_GROUP) for d in docs)


def model_of(flavor: str, labels: Mapping[str, Any]) -> str | None:
    """The GPU model a flavor stands for: from its node labels' values, else its name; None when none is known."""
    for text in [*(str(v) for v in labels.values()), flavor]:
        found = _MODEL_RE.search(text.replace("-", "").replace("_", "")) or _MODEL_RE.search(text)
        if found:
            return found.group(0).upper()
    return None


class _Reader:
    """Collects every problem (an error line each) and every unused field (a note line each) of the documents."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.errors: list[str] = []
        self.notes: list[str] = []

    def where(self, i: int, doc: Mapping[str, Any]) -> str:
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        return f"{self.filename}: document {i} ({doc.get('kind')} {name or '?'})"

    def error(self, where: str, problem: str) -> None:
        self.errors.append(f"{where}: {problem}")

    def note(self, where: str, remark: str) -> None:
        self.notes.append(f"{where}: {remark}")

    def number(self, where: str, path: str, value: Any) -> float | None:
        """A Kubernetes quantity of GPUs: an integer, or a string of one ("8")."""
        if isinstance(value, bool):
            self.error(where, f"{path}: {value!r} is not a number of GPUs")
            return None
        if isinstance(value, int | float):
            if value < 0:
                self.error(where, f"{path}: {value!r} must not be negative")
                return None
            return float(value)
        text = str(value).strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return float(text)
        self.error(where, f"{path}: {value!r} is not a number of GPUs")
        return None


@dataclass
class _Quota:
    guarantee: float = 0.0
    borrow: float | None = 0.0  # None: no limit
    gave_borrow: bool = True  # every GPU flavor gave a borrowingLimit
    covers_gpus: bool = False  # some flavor gives a GPU resource a quota
    models: list[str] = field(default_factory=list)


def _quota(r: _Reader, where: str, spec: Mapping[str, Any], flavors: Mapping[str, str | None]) -> _Quota:
    """The GPU quota of a ClusterQueue's or Cohort's resourceGroups; other resources are noted as unused."""
    q = _Quota()
    groups = spec.get("resourceGroups") or []
    if not isinstance(groups, list):
        r.error(where, "spec.resourceGroups: must be a list")
        return q
    unused: set[str] = set()
    for gi, group in enumerate(groups):
        gpath = f"spec.resourceGroups[{gi}]"
        if not isinstance(group, dict):
            r.error(where, f"{gpath}: must be a mapping")
            continue
        for key in group:
            if key not in ("coveredResources", "flavors"):
                r.error(where, f"{gpath}.{key}: unknown field (a resource group has coveredResources and flavors)")
        for fi, flavor in enumerate(group.get("flavors") or []):
            fpath = f"{gpath}.flavors[{fi}]"
            if not isinstance(flavor, dict) or not isinstance(flavor.get("name"), str):
                r.error(where, f"{fpath}: must be a mapping with a name")
                continue
            fname = flavor["name"]
            for key in flavor:
                if key not in ("name", "resources"):
                    r.error(where, f"{fpath}.{key}: unknown field (a flavor has name and resources)")
            for ri, res in enumerate(flavor.get("resources") or []):
                rpath = f"{fpath}.resources[{ri}]"
                if not isinstance(res, dict) or not isinstance(res.get("name"), str):
                    r.error(where, f"{rpath}: must be a mapping with a name")
                    continue
                for key in res:
                    if key not in ("name", "nominalQuota", "borrowingLimit", "lendingLimit"):
                        r.error(where, f"{rpath}.{key}: unknown field")
                if not GPU_RESOURCE.search(res["name"]):
                    unused.add(res["name"])
                    continue
                q.covers_gpus = True
                nominal = r.number(where, f"{rpath}.nominalQuota", res.get("nominalQuota", 0))
                q.guarantee += nominal or 0.0
                if "borrowingLimit" in res:
                    limit = r.number(where, f"{rpath}.borrowingLimit", res["borrowingLimit"])
                    if q.borrow is not None:
                        q.borrow += limit or 0.0
                else:
                    q.gave_borrow = False
                if "lendingLimit" in res:
                    r.note(where, f"{rpath}.lendingLimit: not used by OnePlus (a queue lends all it does not use)")
                if fname not in flavors:
                    r.error(where, f"{fpath}.name: flavor {fname!r} is not a ResourceFlavor of this file")
                    continue
                model = flavors[fname]
                if model is None:
                    r.note(where, f"{fpath}: flavor {fname!r} names no GPU model OnePlus knows: any model")
                elif model not in q.models:
                    q.models.append(model)
    if unused:
        r.note(where, f"quotas of {', '.join(sorted(unused))}: not used by OnePlus (its queues count GPUs)")
    return q


def _check_fields(r: _Reader, where: str, doc: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Unknown top-level, metadata and spec fields are errors; known ones OnePlus does not use are notes."""
    top = _TOP_FIELDS | ({"value", "description", "preemptionPolicy"} if kind == "WorkloadPriorityClass" else set())
    for key in doc:
        if key not in top:
            r.error(where, f"{key}: unknown field (a {kind} has {', '.join(sorted(top))})")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        r.error(where, "metadata.name: missing")
    else:
        for key in meta:
            if key not in _META_FIELDS:
                r.error(where, f"metadata.{key}: unknown field")
    spec = doc.get("spec", {}) if kind != "WorkloadPriorityClass" else {}
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        r.error(where, "spec: must be a mapping")
        return {}
    read, unused = _SPEC_FIELDS.get(kind, (set(), set()))
    for key in spec:
        if key in unused:
            r.note(where, f"spec.{key}: not used by OnePlus")
        elif key not in read:
            r.error(where, f"spec.{key}: unknown field (a {kind}'s spec has {', '.join(sorted(read | unused))})")
    return spec


def kueue_config(docs: list[Any], *, filename: str = "<queues>") -> KueueImport:
    """The OnePlus queue config of a file of Kueue objects. Raises `QueueConfigError` with one line per problem."""
    r = _Reader(filename)
    by_kind: dict[str, list[tuple[str, dict[str, Any], dict[str, Any]]]] = {k: [] for k in KINDS}
    for i, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            r.error(f"{filename}: document {i}", f"expected a Kubernetes object (a mapping), got {type(doc).__name__}")
            continue
        where = r.where(i, doc)
        api, kind = str(doc.get("apiVersion", "")), doc.get("kind")
        if not api.startswith(KUEUE_GROUP):
            r.error(where, f"apiVersion {api or '(none)'!r}: not a Kueue object; a queue file holds Kueue objects only")
            continue
        if kind not in KINDS:
            r.error(where, f"kind {kind!r}: not one OnePlus imports ({', '.join(KINDS)})")
            continue
        spec = _check_fields(r, where, doc, str(kind))
        by_kind[str(kind)].append((where, doc, spec))

    flavors: dict[str, str | None] = {}
    for where, doc, spec in by_kind["ResourceFlavor"]:
        name = str(doc["metadata"]["name"])
        labels = spec.get("nodeLabels") or {}
        if not isinstance(labels, dict):
            r.error(where, "spec.nodeLabels: must be a mapping")
            labels = {}
        flavors[name] = model_of(name, labels)

    queues: dict[str, dict[str, Any]] = {}
    order: list[str] = []

    def add(where: str, name: str, entry: dict[str, Any]) -> None:
        if name in queues:
            r.error(where, f"metadata.name: {name!r} is already a queue of this file (names are one namespace here)")
            return
        queues[name] = entry
        order.append(name)

    members: dict[str, list[str]] = {}  # cohort → its ClusterQueues and child cohorts
    cohort_own: dict[str, float] = {}
    for where, doc, spec in by_kind["Cohort"]:
        name = str(doc["metadata"]["name"])
        q = _quota(r, where, spec, flavors)
        cohort_own[name] = q.guarantee
        entry: dict[str, Any] = {"name": name, "description": "Kueue Cohort"}
        parent = spec.get("parentName")
        if parent:
            entry["parent"] = str(parent)
            members.setdefault(str(parent), []).append(name)
        weight = _weight(r, where, spec)
        if weight is not None:
            entry["weight"] = weight
        add(where, name, entry)  # its flavors' models are not its members': each ClusterQueue names its own

    guarantees: dict[str, float] = {}
    for where, doc, spec in by_kind["ClusterQueue"]:
        name = str(doc["metadata"]["name"])
        q = _quota(r, where, spec, flavors)
        cohort = spec.get("cohortName", spec.get("cohort"))
        entry = {"name": name, "guarantee_gpus": q.guarantee, "description": "Kueue ClusterQueue"}
        if cohort:
            entry["parent"] = str(cohort)
            members.setdefault(str(cohort), []).append(name)
        if not q.covers_gpus:
            # Kueue's samples often cover cpu and memory only; such a queue does not limit GPUs here.
            r.note(where, "covers no GPU resource (nvidia.com/gpu): its jobs may use any number of GPUs")
            entry["borrow_limit_gpus"] = None
        elif cohort:
            entry["borrow_limit_gpus"] = q.borrow if q.gave_borrow else None
        else:
            entry["borrow_limit_gpus"] = 0.0  # Kueue borrows only inside a cohort
        strategy = spec.get("queueingStrategy")
        if strategy is not None:
            mapped = {"StrictFIFO": "strict-fifo", "BestEffortFIFO": "best-effort-fifo"}.get(str(strategy))
            if mapped is None:
                r.error(where, f"spec.queueingStrategy: {strategy!r} is not StrictFIFO or BestEffortFIFO")
            else:
                entry["queueing"] = mapped
        weight = _weight(r, where, spec)
        if weight is not None:
            entry["weight"] = weight
        if q.models:
            entry["gpu_models"] = q.models
        guarantees[name] = q.guarantee
        add(where, name, entry)

    # A cohort named by ClusterQueues but not defined: an organisation queue holding exactly their quota.
    for cohort in members:
        if cohort not in queues:
            queues[cohort] = {"name": cohort, "description": "Kueue cohort"}
            order.insert(0, cohort)

    def cohort_guarantee(name: str, seen: tuple[str, ...] = ()) -> float:
        if name in seen:
            return 0.0  # a cycle: the config's own check names it
        own = cohort_own.get(name, 0.0)
        return own + sum(
            guarantees[m] if m in guarantees else cohort_guarantee(m, (*seen, name)) for m in members.get(name, [])
        )

    for cohort in members:
        queues[cohort]["guarantee_gpus"] = cohort_guarantee(cohort)
    for name in cohort_own:
        if name not in members:
            queues[name]["guarantee_gpus"] = cohort_own[name]

    local: dict[str, str] = {}
    for where, doc, spec in by_kind["LocalQueue"]:
        name = str(doc["metadata"]["name"])
        cq = spec.get("clusterQueue")
        if not isinstance(cq, str) or not cq:
            r.error(where, "spec.clusterQueue: missing")
            continue
        if cq not in guarantees:
            known = ", ".join(sorted(guarantees)) or "none"
            r.error(where, f"spec.clusterQueue: {cq!r} is not a ClusterQueue of this file (it has {known})")
            continue
        ns = doc["metadata"].get("namespace")
        entry = {"name": name, "parent": cq, "description": f"Kueue LocalQueue {ns or 'default'}/{name}"}
        if "queueing" in queues[cq]:
            entry["queueing"] = queues[cq]["queueing"]  # jobs queue on the leaf: it keeps its ClusterQueue's order
        add(where, name, entry)
        local[name] = cq

    classes: dict[str, dict[str, Any]] = {}
    for where, doc, _ in by_kind["WorkloadPriorityClass"]:
        value = doc.get("value")
        if isinstance(value, bool) or not isinstance(value, int):
            r.error(where, f"value: {value!r} is not an integer")
            continue
        classes[str(doc["metadata"]["name"])] = {"value": value}

    if not queues and not r.errors:
        r.error(filename, "no ClusterQueue, LocalQueue or Cohort: nothing to make queues of")
    if r.errors:
        raise QueueConfigError("\n".join(r.errors))
    if DEFAULT_QUEUE not in queues:
        queues[DEFAULT_QUEUE] = {"name": DEFAULT_QUEUE, "description": "kept: jobs that name no queue"}
        order.append(DEFAULT_QUEUE)
    data: dict[str, Any] = {"queues": [queues[n] for n in order]}
    if classes:
        data["priority_classes"] = classes
    text = "# Imported from Kueue objects (" + filename + ")\n" + yaml.safe_dump(data, sort_keys=False)
    try:
        config = load_queue_config(text)
    except QueueConfigError as exc:
        raise QueueConfigError(f"{filename}: {exc}") from None
    return KueueImport(config, text, r.notes, local)


def _weight(r: _Reader, where: str, spec: Mapping[str, Any]) -> float | None:
    fair = spec.get("fairSharing")
    if fair is None:
        return None
    if not isinstance(fair, dict):
        r.error(where, "spec.fairSharing: must be a mapping")
        return None
    for key in fair:
        if key != "weight":
            r.error(where, f"spec.fairSharing.{key}: unknown field (fairSharing has weight)")
    if "weight" not in fair:
        return None
    weight = r.number(where, "spec.fairSharing.weight", fair["weight"])
    if weight is not None and weight <= 0:
        r.error(where, f"spec.fairSharing.weight: {fair['weight']!r} must be above 0")
        return None
    return weight
