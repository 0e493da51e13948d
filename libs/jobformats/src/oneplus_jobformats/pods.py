"""What one Kubernetes pod template asks for: the main container's image, command and resources.

Shared by PyTorchJob, MPIJob and TrainJob: a replica type's template becomes a `PodShape`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import FieldReader, child, type_name
from .quantities import k8s_cpus, k8s_memory_mb, k8s_whole

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU feature discovery
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"


@dataclass
class PodShape:
    """One replica type's pod, reduced to what a OnePlus rank needs."""

    gpus: int = 0
    cpus: float | None = None
    memory_mb: int | None = None
    cpu_limit: float | None = None
    memory_limit_mb: int | None = None
    entrypoint: list[str] | None = None
    gpu_models: list[str] | None = None
    image: str | None = None
    command: list[str] = field(default_factory=list)
    pull_policy: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    domain: str | None = None
    domain_mode: str | None = None
    resources_path: str = ""


def read_resources(r: FieldReader, resources: dict[str, Any], path: str, shape: PodShape) -> None:
    """Limits and requests of one container, added to `shape` (a request is what a scheduler reserves)."""
    limits = r.mapping(resources, "limits", path)
    requests = r.mapping(resources, "requests", path)
    lp, rp = child(path, "limits"), child(path, "requests")

    def quantity(name: str, parse: Any) -> Any:
        lv, rv = r.opt(limits, name, lp), r.opt(requests, name, rp)
        try:
            lq = parse(lv) if lv is not None else None
        except ValueError as exc:
            raise r.error(child(lp, name), str(exc)) from None
        try:
            rq = parse(rv) if rv is not None else None
        except ValueError as exc:
            raise r.error(child(rp, name), str(exc)) from None
        return lq, rq

    gl, gr = quantity(GPU_RESOURCE, k8s_whole)
    if gr is not None and gl is None:
        # The API server's words: extended resources cannot be overcommitted, so they must be limits.
        raise r.error(
            child(rp, GPU_RESOURCE),
            f"a GPU count only in requests is refused by Kubernetes (Limit must be set for non overcommitable "
            f"resources); put {GPU_RESOURCE}: {gr} in limits",
        )
    if gl is not None and gr is not None and gl != gr:
        raise r.error(
            child(rp, GPU_RESOURCE), f"request {gr} differs from limit {gl}; Kubernetes needs them equal for GPUs"
        )
    shape.gpus += gl or 0
    # A request reserves, a limit caps; a limit alone is also the request (the API server's defaulting).
    cl, cr = quantity("cpu", k8s_cpus)
    if cl is not None and cr is not None and cr > cl:
        raise r.error(child(rp, "cpu"), f"request {cr:g} is more than the limit {cl:g}; Kubernetes refuses it")
    cpus = cr if cr is not None else cl
    if cpus:
        shape.cpus = (shape.cpus or 0.0) + cpus
    if cl:
        shape.cpu_limit = (shape.cpu_limit or 0.0) + cl
    ml, mr = quantity("memory", k8s_memory_mb)
    if ml is not None and mr is not None and mr > ml:
        raise r.error(child(rp, "memory"), f"request {mr} MiB is more than the limit {ml} MiB; Kubernetes refuses it")
    mem = mr if mr is not None else ml
    if mem:
        shape.memory_mb = (shape.memory_mb or 0) + mem
    if ml:
        shape.memory_limit_mb = (shape.memory_limit_mb or 0) + ml


def read_command(r: FieldReader, container: dict[str, Any], path: str, shape: PodShape) -> None:
    """Kubernetes `command` replaces the image's ENTRYPOINT (and drops its CMD); `args` replace its CMD."""
    if container.get("command") is not None:
        shape.entrypoint = r.string_list(container, "command", path)
    else:
        r.opt(container, "command", path)  # `command:` with no value is unset, as Kubernetes reads it
    shape.command = r.string_list(container, "args", path)


def read_env(r: FieldReader, container: dict[str, Any], path: str) -> dict[str, str]:
    env: dict[str, str] = {}
    p = child(path, "env")
    for i, item in enumerate(r.sequence(container, "env", path)):
        ip = child(p, i)
        if not isinstance(item, dict):
            raise r.error(ip, f"must be a mapping with name and value (got {type_name(item)})")
        name = r.string(item, "name", ip, required=True)
        assert name is not None
        if "valueFrom" in item:
            continue  # left unread: reported as an unused field by name
        value = r.opt(item, "value", ip)
        env[name] = "" if value is None else str(value)
    return env


def _pick_main(containers: list[Any], main_name: str | None) -> int:
    names = [c.get("name") if isinstance(c, dict) else None for c in containers]
    if main_name and main_name in names:
        return names.index(main_name)
    return 0


def read_pod_template(
    r: FieldReader, template: dict[str, Any], path: str, *, main_container: str | None = None
) -> PodShape:
    """The main container of a PodTemplateSpec; other containers are left unread and so reported by name."""
    shape = PodShape()
    meta = r.mapping(template, "metadata", path)
    _read_topology_annotations(r, meta, child(path, "metadata"), shape)
    pod = r.mapping(template, "spec", path, required=True)
    pod_path = child(path, "spec")
    selector = r.mapping(pod, "nodeSelector", pod_path)
    product = r.string(selector, GPU_PRODUCT_LABEL, child(pod_path, "nodeSelector"))
    if product:
        shape.gpu_models = [product.replace("-", " ")]
    containers = r.sequence(pod, "containers", pod_path)
    cpath = child(pod_path, "containers")
    if not containers:
        raise r.error(cpath, "a pod template needs at least one container")
    index = _pick_main(containers, main_container)
    container = containers[index]
    mp = child(cpath, index)
    if not isinstance(container, dict):
        raise r.error(mp, f"must be a mapping (got {type_name(container)})")
    r.string(container, "name", mp)
    shape.image = r.string(container, "image", mp)
    read_command(r, container, mp, shape)
    shape.pull_policy = r.string(container, "imagePullPolicy", mp)
    shape.env = read_env(r, container, mp)
    shape.resources_path = child(mp, "resources")
    read_resources(r, r.mapping(container, "resources", mp), shape.resources_path, shape)
    return shape


def _read_topology_annotations(r: FieldReader, meta: dict[str, Any], path: str, shape: PodShape) -> None:
    annotations = r.mapping(meta, "annotations", path)
    ap = child(path, "annotations")
    for key, mode in ((REQUIRED_TOPOLOGY, "required"), (PREFERRED_TOPOLOGY, "preferred")):
        label = r.string(annotations, key, ap)
        if label is None:
            continue
        domain = topology_domain(label)
        if domain is None:
            r.warn(
                child(ap, key), f"topology level {label!r} is not one OnePlus knows (hostname, rack/leaf, block/spine)"
            )
            continue
        shape.domain, shape.domain_mode = domain, mode


def topology_domain(node_label: str) -> str | None:
    """Kueue names a topology level by a node label; OnePlus by node, leaf or spine."""
    lowered = node_label.lower()
    if lowered.endswith("hostname"):
        return "node"
    if any(w in lowered for w in ("rack", "leaf", "switch")):
        return "leaf"
    if any(w in lowered for w in ("block", "spine", "superpod")):
        return "spine"
    return None
