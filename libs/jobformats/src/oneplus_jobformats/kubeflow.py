"""Kubeflow manifests to a JobSpec: PyTorchJob (kubeflow.org/v1), MPIJob (kubeflow.org/v2beta1 and the v1
Training Operator form) and TrainJob (trainer.kubeflow.org/v1alpha1), with Kueue's queue and priority labels.

Every field that is read is marked; the rest come back as warnings naming each field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import JobFormatError, Translation, spec_from_fields
from .fields import FieldReader, child
from .gang import ReplicaGroup, gang_fields
from .pods import PodShape, read_command, read_env, read_pod_template, read_resources
from .priorities import priority_of
from .simulate import SIMULATE_ANNOTATION, parse_simulate_s
from .site import SiteMapError, apply_default_share, site_from_env

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
RUNTIME_LABEL = "trainer.kubeflow.org/runtime"

MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")  # mpi-operator's: the hostfile's form and the launcher's env

Translator = Callable[[dict[str, Any], str], Translation]


def _metadata(r: FieldReader, doc: dict[str, Any], fields: dict[str, Any], origin: dict[str, str]) -> None:
    """Name, team (the namespace), labels, and Kueue's queue and priority labels."""
    meta = r.mapping(doc, "metadata", "", required=True)
    name = r.string(meta, "name", "metadata")
    if name is None:
        name = r.string(meta, "generateName", "metadata")
        if name is None:
            raise r.error("metadata.name", "missing required field")
        origin["name"] = "metadata.generateName"
    else:
        origin["name"] = "metadata.name"
    fields["name"] = name
    namespace = r.string(meta, "namespace", "metadata")
    if namespace:
        fields["team"] = namespace
        origin["team"] = "metadata.namespace"
    labels = r.mapping(meta, "labels", "metadata")
    if labels:
        r.use("metadata.labels")
        fields["labels"] = {k: "" if v is None else str(v) for k, v in labels.items()}
    queue = labels.get(QUEUE_LABEL)
    if queue is not None:
        fields["queue"] = str(queue)
        origin["queue"] = child("metadata.labels", QUEUE_LABEL)
    pclass = labels.get(PRIORITY_LABEL)
    if pclass is not None:
        _set_priority(r, str(pclass), child("metadata.labels", PRIORITY_LABEL), fields, origin)
    annotations = r.mapping(meta, "annotations", "metadata")
    if SIMULATE_ANNOTATION in annotations:
        path = child(child("metadata", "annotations"), SIMULATE_ANNOTATION)
        try:
            seconds = parse_simulate_s(annotations[SIMULATE_ANNOTATION], source=SIMULATE_ANNOTATION)
        except JobFormatError as exc:
            raise r.error(path, exc.problem) from None
        r.use(path)
        fields["simulate"] = {"duration_s": seconds}
        origin["simulate"] = path


def _set_priority(r: FieldReader, name: str, path: str, fields: dict[str, Any], origin: dict[str, str]) -> None:
    try:
        fields["priority"] = priority_of(name)
    except ValueError as exc:
        raise r.error(path, str(exc)) from None
    fields["priority_class"] = name
    origin["priority"] = path


def _run_policy(
    r: FieldReader, spec: dict[str, Any], path: str, fields: dict[str, Any], origin: dict[str, str]
) -> None:
    """runPolicy: activeDeadlineSeconds and the gang-scheduling policy (queue, priorityClass, minAvailable)."""
    policy = r.mapping(spec, "runPolicy", path)
    pp = child(path, "runPolicy")
    deadline = r.integer(policy, "activeDeadlineSeconds", pp, minimum=1)
    if deadline is not None:
        fields["time_limit_s"] = deadline
        origin["time_limit_s"] = child(pp, "activeDeadlineSeconds")
    sched = r.mapping(policy, "schedulingPolicy", pp)
    sp = child(pp, "schedulingPolicy")
    queue = r.string(sched, "queue", sp)
    if queue is not None:
        if "queue" in fields and fields["queue"] != queue:
            r.warn(child(sp, "queue"), f"differs from the Kueue label ({fields['queue']!r}), which wins")
        else:
            fields["queue"] = queue
            origin["queue"] = child(sp, "queue")
    pclass = r.string(sched, "priorityClass", sp)
    if pclass is not None:
        if "priority_class" in fields and fields["priority_class"] != pclass:
            r.warn(
                child(sp, "priorityClass"), f"differs from the Kueue label ({fields['priority_class']!r}), which wins"
            )
        elif "priority_class" not in fields:
            _set_priority(r, pclass, child(sp, "priorityClass"), fields, origin)
    min_available = r.integer(sched, "minAvailable", sp, minimum=0)
    if min_available is not None:
        ranks = int(fields["ranks"])
        if min_available > ranks:
            raise r.error(child(sp, "minAvailable"), f"{min_available} is more than the job's {ranks} ranks")
        if min_available < ranks:
            r.warn(
                child(sp, "minAvailable"),
                f"OnePlus places all {ranks} ranks at once or none; minAvailable={min_available} is not used",
            )


def _replica_group(
    r: FieldReader, specs: dict[str, Any], role: str, path: str, *, main_container: str | None
) -> ReplicaGroup | None:
    if role not in specs:
        return None
    rp = child(path, role)
    replica = r.mapping(specs, role, path)
    replicas = r.integer(replica, "replicas", rp, minimum=0)
    restart = r.string(replica, "restartPolicy", rp)
    template = r.mapping(replica, "template", rp, required=True)
    shape = read_pod_template(r, template, child(rp, "template"), main_container=main_container)
    return ReplicaGroup(
        role=role, replicas=1 if replicas is None else replicas, shape=shape, path=rp, restart_policy=restart
    )


def _finish(r: FieldReader, fields: dict[str, Any], origin: dict[str, str], kind: str) -> Translation:
    try:
        notes = apply_default_share(fields, site_from_env())
    except SiteMapError as exc:
        raise JobFormatError(str(exc), filename=r.filename) from None
    spec = spec_from_fields(fields, filename=r.filename, origin=origin)
    return Translation(spec=spec, warnings=[*r.report_unused(), *notes], kind=kind)


def _start(doc: dict[str, Any], filename: str) -> tuple[FieldReader, dict[str, Any], dict[str, str], dict[str, Any]]:
    r = FieldReader(doc, filename=filename)
    r.use("apiVersion")
    r.use("kind")
    fields: dict[str, Any] = {}
    origin: dict[str, str] = {}
    _metadata(r, doc, fields, origin)
    spec = r.mapping(doc, "spec", "", required=True)
    return r, fields, origin, spec


def _unknown_roles(r: FieldReader, specs: dict[str, Any], path: str, known: tuple[str, ...]) -> None:
    for role in specs:
        if role not in known:
            raise r.error(child(path, role), f"unknown replica type; use {' and '.join(known)}")


# The rendezvous backends torch.distributed.run knows (the operator's RDZVBackend enum: c10d, etcd, etcd-v2).
_RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")


def _elastic_policy(r: FieldReader, spec: dict[str, Any], specs: dict[str, Any], fields: dict[str, Any]) -> None:
    """Training Operator v1.9 elasticPolicy (`pytorch/elastic.go`): torchrun's elastic options as PET_* variables,
    kept in the job's env; the executor adds PET_RDZV_ENDPOINT (rank 0's node and port, where the operator names
    worker 0) for a job whose env has PET_RDZV_BACKEND. min/maxReplicas default to each other, then to the Worker
    replicas, and PET_NNODES is `min:max`. With min < max the job is an elastic gang (JobSpec.elastic, counted in
    ranks: the Master, if any, stays): it starts at the most replicas that fit and grows or shrinks by a rendezvous
    restart from its checkpoint."""
    path = "spec.elasticPolicy"
    policy = r.mapping(spec, "elasticPolicy", "spec")
    if "elasticPolicy" not in spec:
        return
    r.use(path)
    env = fields.setdefault("env", {})
    backend = r.string(policy, "rdzvBackend", path) or "c10d"
    if backend not in _RDZV_BACKENDS:
        raise r.error(f"{path}.rdzvBackend", f"must be one of {', '.join(_RDZV_BACKENDS)} (got {backend!r})")
    env["PET_RDZV_BACKEND"] = backend
    low = r.integer(policy, "minReplicas", path, minimum=1)
    high = r.integer(policy, "maxReplicas", path, minimum=1)
    worker = specs.get("Worker")
    count = worker.get("replicas", 1) if isinstance(worker, dict) else 1
    replicas = count if isinstance(count, int) and not isinstance(count, bool) else 1
    low, high = low or high or replicas, high or low or replicas
    if low > high:
        raise r.error(
            f"{path}.minReplicas", f"must not be more than maxReplicas (minReplicas={low} > maxReplicas={high})"
        )
    env["PET_NNODES"] = f"{low}:{high}"
    if low != high:
        others = int(fields.get("ranks", replicas)) - replicas  # the Master's replica is a rank beyond the range
        fields["elastic"] = {"min_ranks": low + others, "max_ranks": high + others}
        fields["ranks"] = high + others
        r.warn(
            path,
            f"elastic: OnePlus starts the most Worker replicas from {low} to {high} that fit (not replicas={replicas}),"
            f" grows when GPUs free up and shrinks toward {low} before being preempted, each change a restart from "
            f"the checkpoint with PET_NNODES={low}:{high}",
        )
    restarts = r.integer(policy, "maxRestarts", path)
    if restarts is not None:
        env["PET_MAX_RESTARTS"] = str(restarts)
    rdzv_id = r.string(policy, "rdzvId", path)
    if rdzv_id is not None:
        env["PET_RDZV_ID"] = rdzv_id
    conf = r.sequence(policy, "rdzvConf", path)
    if conf:
        r.use(f"{path}.rdzvConf")
        pairs = []
        for i, item in enumerate(conf):
            if not isinstance(item, dict) or not isinstance(item.get("key"), str):
                raise r.error(f"{path}.rdzvConf[{i}]", "must be a mapping with key and value")
            pairs.append(f"{item['key']}={item.get('value', '')}")
        env["PET_RDZV_CONF"] = ",".join(pairs)
    if r.boolean(policy, "standalone", path):
        env["PET_STANDALONE"] = ""
    nproc = r.integer(policy, "nProcPerNode", path, minimum=1)
    if nproc is not None:
        env.setdefault("PET_NPROC_PER_NODE", str(nproc))
    for key in ("rdzvHost", "rdzvPort"):
        if r.opt(policy, key, path) is not None:
            r.warn(f"{path}.{key}", "not used: the rendezvous is rank 0's node and the port OnePlus gives it "
                   "(PET_RDZV_ENDPOINT)")  # fmt: skip
    if r.opt(policy, "metrics", path) is not None:
        r.warn(f"{path}.metrics", "not used: OnePlus does not scale a job's replicas by its metrics")


def translate_pytorchjob(doc: dict[str, Any], filename: str) -> Translation:
    r, fields, origin, spec = _start(doc, filename)
    path = "spec.pytorchReplicaSpecs"
    specs = r.mapping(spec, "pytorchReplicaSpecs", "spec", required=True)
    _unknown_roles(r, specs, path, ("Master", "Worker"))
    groups = [
        g for role in ("Master", "Worker") if (g := _replica_group(r, specs, role, path, main_container="pytorch"))
    ]
    gang_fields(r, groups, fields, origin)
    # Training Operator v1: spec.nprocPerNode (auto, cpu, gpu or a number; default auto) is torchrun's
    # --nproc-per-node, given to every replica as PET_NPROC_PER_NODE.
    nproc = r.string(spec, "nprocPerNode", "spec")
    if nproc is not None:
        if nproc not in ("auto", "cpu", "gpu") and not (nproc.isascii() and nproc.isdigit() and int(nproc) > 0):
            raise r.error("spec.nprocPerNode", f"must be auto, cpu, gpu or a positive number (got {nproc!r})")
        fields.setdefault("env", {})["PET_NPROC_PER_NODE"] = nproc
    _elastic_policy(r, spec, specs, fields)
    fields["framework"] = "pytorchjob"
    _run_policy(r, spec, "spec", fields, origin)
    return _finish(r, fields, origin, "PyTorchJob")


def translate_mpijob(doc: dict[str, Any], filename: str) -> Translation:
    """mpi-operator v2: the Worker replicas are the ranks; the Launcher runs beside the first rank once every worker
    runs, with the workers in /etc/mpi/hostfile (`<node> slots=<slotsPerWorker>`), and the job ends with it."""
    r, fields, origin, spec = _start(doc, filename)
    path = "spec.mpiReplicaSpecs"
    specs = r.mapping(spec, "mpiReplicaSpecs", "spec", required=True)
    _unknown_roles(r, specs, path, ("Launcher", "Worker"))
    main = r.string(spec, "mainContainer", "spec")  # Training Operator v1 form
    launcher_is_rank = bool(r.boolean(spec, "runLauncherAsWorker", "spec"))
    worker = _replica_group(r, specs, "Worker", path, main_container=main)
    if worker is None:
        raise r.error(child(path, "Worker"), "an MPIJob needs a Worker replica type")
    groups = [worker]
    launcher = _replica_group(r, specs, "Launcher", path, main_container=main)
    if launcher is not None and launcher_is_rank:
        groups = [launcher, worker]  # the launcher's pod is also a worker: one more rank, listed in the hostfile
    gang_fields(r, groups, fields, origin)
    fields["framework"] = "mpijob"
    slots = r.integer(spec, "slotsPerWorker", "spec", minimum=1)
    impl = r.string(spec, "mpiImplementation", "spec")
    if impl is not None and impl not in MPI_IMPLEMENTATIONS:
        raise r.error("spec.mpiImplementation", f"must be one of {', '.join(MPI_IMPLEMENTATIONS)} (got {impl!r})")
    if launcher is not None:
        _launcher_fields(r, launcher, 1 if slots is None else slots, fields, origin)
        fields["launcher"]["implementation"] = impl or "OpenMPI"
    else:
        r.warn(path, "no Launcher: the workers run by themselves and the job ends when they all end")
    _run_policy(r, spec, "spec", fields, origin)
    legacy_clean = r.opt(spec, "cleanPodPolicy", "spec")
    if legacy_clean is not None:
        r.warn("spec.cleanPodPolicy", "not used by OnePlus (ranks are removed when the job ends)")
    return _finish(r, fields, origin, "MPIJob")


def _launcher_fields(
    r: FieldReader, launcher: ReplicaGroup, slots: int, fields: dict[str, Any], origin: dict[str, str]
) -> None:
    if launcher.replicas != 1:
        raise r.error(child(launcher.path, "replicas"), f"an MPIJob has exactly one launcher (got {launcher.replicas})")
    shape = launcher.shape
    if shape.gpus:
        r.warn(
            shape.resources_path,
            f"the launcher asks for {shape.gpus} GPU(s); OnePlus runs it beside the first worker without GPUs",
        )
    elif shape.cpus or shape.memory_mb:
        r.warn(shape.resources_path, "the launcher's CPU and memory are not reserved: it runs beside the first worker")
    spec: dict[str, Any] = {"slots_per_worker": slots, "command": shape.command, "env": shape.env}
    if shape.image:
        spec["image"] = shape.image
    if shape.entrypoint is not None:
        spec["entrypoint"] = shape.entrypoint
    fields["launcher"] = spec
    origin["launcher"] = launcher.path


def translate_trainjob(
    doc: dict[str, Any], filename: str, runtimes: dict[str, RuntimeDefaults] | None = None
) -> Translation:
    """A TrainJob; `runtimes` are training runtimes given in the same file (by name), whose defaults it takes."""
    r, fields, origin, spec = _start(doc, filename)
    ref = r.mapping(spec, "runtimeRef", "spec", required=True)
    runtime = r.string(ref, "name", "spec.runtimeRef", required=True)
    r.string(ref, "kind", "spec.runtimeRef")
    r.string(ref, "apiGroup", "spec.runtimeRef")
    fields.setdefault("labels", {})[RUNTIME_LABEL] = str(runtime)
    base = (runtimes or {}).get(str(runtime))
    trainer = r.mapping(spec, "trainer", "spec")
    tp = "spec.trainer"
    nodes = r.integer(trainer, "numNodes", tp, minimum=1)
    if nodes is None and base is not None and base.num_nodes is not None:
        nodes = base.num_nodes
    elif nodes is None:
        r.warn(tp, f"numNodes is not set and runtime {runtime!r} is not in this file; the job has 1 node")
    shape = PodShape(resources_path=child(tp, "resourcesPerNode"))
    shape.image = r.string(trainer, "image", tp) or (base.shape.image if base else None)
    if shape.image is None:
        r.warn(tp, f"no image: the runtime {runtime!r} chooses it and is not in this file; the default image is used")
    read_command(r, trainer, tp, shape)
    if base is not None:
        if "command" not in trainer:
            shape.entrypoint = base.shape.entrypoint
        if "args" not in trainer:
            shape.command = base.shape.command
        shape.env = dict(base.shape.env)
        for attr in ("gpus", "cpus", "memory_mb", "cpu_limit", "memory_limit_mb"):
            setattr(shape, attr, getattr(base.shape, attr))
    shape.env.update(read_env(r, trainer, tp))
    nproc = r.opt(trainer, "numProcPerNode", tp)
    if nproc is None and base is not None:
        nproc = base.num_proc_per_node
    # Trainer's torch plugin gives torchrun PET_NPROC_PER_NODE (default auto) with PET_NNODES, PET_NODE_RANK,
    # PET_MASTER_ADDR and PET_MASTER_PORT; OnePlus's executor adds the last four for each rank.
    shape.env["PET_NPROC_PER_NODE"] = "auto" if nproc is None else str(nproc)
    if "resourcesPerNode" in trainer:
        shape.gpus, shape.cpus, shape.memory_mb, shape.cpu_limit, shape.memory_limit_mb = 0, None, None, None, None
        read_resources(r, r.mapping(trainer, "resourcesPerNode", tp), child(tp, "resourcesPerNode"), shape)
    if base is not None and base.elastic is not None:
        low, high = base.elastic
        # Trainer's torch plugin: torchrun meets by c10d rendezvous with PET_NNODES=min:max (the executor adds the
        # endpoint, rank 0's node and port); OnePlus starts the most nodes that fit.
        shape.env.update({"PET_NNODES": f"{low}:{high}", "PET_RDZV_BACKEND": "c10d"})
        if base.max_restarts is not None:
            shape.env["PET_MAX_RESTARTS"] = str(base.max_restarts)
        if nodes is not None and nodes != high:
            r.warn(f"{tp}.numNodes", f"elastic ({low} to {high} nodes): OnePlus starts the most that fit, not {nodes}")
        nodes = high
        fields["elastic"] = {"min_ranks": low, "max_ranks": high}
    group = ReplicaGroup(role="node", replicas=1 if nodes is None else nodes, shape=shape, path=tp)
    gang_fields(r, [group], fields, origin)
    fields["framework"] = "trainjob"
    deadline = r.integer(spec, "activeDeadlineSeconds", "spec", minimum=1)
    if deadline is not None:
        fields["time_limit_s"] = deadline
    return _finish(r, fields, origin, "TrainJob")


@dataclass
class RuntimeDefaults:
    """What a TrainJob takes from a (Cluster)TrainingRuntime given in the same file."""

    name: str
    num_nodes: int | None
    num_proc_per_node: str | None
    shape: PodShape
    warnings: list[str]
    elastic: tuple[int, int] | None = None  # mlPolicy.torch.elasticPolicy (minNodes, maxNodes) when min < max
    max_restarts: int | None = None


RUNTIME_KINDS = frozenset({"ClusterTrainingRuntime", "TrainingRuntime"})


def read_runtime(doc: dict[str, Any], filename: str) -> RuntimeDefaults:
    """spec.mlPolicy (numNodes, torch.numProcPerNode) and the `node` replicated job's trainer container."""
    r = FieldReader(doc, filename=filename)
    r.use("apiVersion")
    r.use("kind")
    meta = r.mapping(doc, "metadata", "", required=True)
    name = r.string(meta, "name", "metadata", required=True)
    assert name is not None
    spec = r.mapping(doc, "spec", "", required=True)
    ml = r.mapping(spec, "mlPolicy", "spec")
    nodes = r.integer(ml, "numNodes", "spec.mlPolicy", minimum=1)
    torch = r.mapping(ml, "torch", "spec.mlPolicy")
    nproc = r.string(torch, "numProcPerNode", "spec.mlPolicy.torch")
    elastic, restarts = _torch_elastic_policy(r, torch, nodes)
    shape = PodShape()
    template = r.mapping(spec, "template", "spec")
    tspec = r.mapping(template, "spec", "spec.template")
    jobs = r.sequence(tspec, "replicatedJobs", "spec.template.spec")
    for i, job in enumerate(jobs):
        jp = f"spec.template.spec.replicatedJobs[{i}]"
        if not isinstance(job, dict) or job.get("name") != "node":
            continue
        r.use(child(jp, "name"))
        try:
            pod = job["template"]["spec"]["template"]
        except (KeyError, TypeError):
            raise r.error(jp, "the node job has no template.spec.template (a pod template)") from None
        pod_path = child(child(child(jp, "template"), "spec"), "template")
        shape = read_pod_template(r, pod, pod_path, main_container="node")
    return RuntimeDefaults(
        name=name,
        num_nodes=nodes,
        num_proc_per_node=nproc,
        shape=shape,
        warnings=r.report_unused(),
        elastic=elastic,
        max_restarts=restarts,
    )


def _torch_elastic_policy(
    r: FieldReader, torch: dict[str, Any], nodes: int | None
) -> tuple[tuple[int, int] | None, int | None]:
    """Trainer v2's mlPolicy.torch.elasticPolicy: minNodes and maxNodes (each defaulting to the other, then to
    numNodes), maxRestarts; a range of one size is no elasticity."""
    path = "spec.mlPolicy.torch.elasticPolicy"
    policy = r.mapping(torch, "elasticPolicy", "spec.mlPolicy.torch")
    if "elasticPolicy" not in torch:
        return None, None
    r.use(path)
    low = r.integer(policy, "minNodes", path, minimum=1)
    high = r.integer(policy, "maxNodes", path, minimum=1)
    restarts = r.integer(policy, "maxRestarts", path, minimum=0)
    if r.opt(policy, "metrics", path) is not None:
        r.warn(f"{path}.metrics", "not used: OnePlus does not scale a job's nodes by its metrics")
    fallback = nodes or 1
    low, high = low or high or fallback, high or low or fallback
    if low > high:
        raise r.error(f"{path}.minNodes", f"must not be more than maxNodes (minNodes={low} > maxNodes={high})")
    return ((low, high) if low < high else None), restarts


KINDS: dict[tuple[str, str], Translator] = {
    ("kubeflow.org/v1", "PyTorchJob"): translate_pytorchjob,
    ("kubeflow.org/v2beta1", "MPIJob"): translate_mpijob,
    ("kubeflow.org/v1", "MPIJob"): translate_mpijob,
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): translate_trainjob,
}


def translate_manifest(doc: dict[str, Any], filename: str) -> Translation:
    api, kind = doc.get("apiVersion"), doc.get("kind")
    translator = KINDS.get((str(api), str(kind)))
    if translator is None:
        known = ", ".join(f"{k} ({a})" for a, k in KINDS)
        raise JobFormatError(
            f"unsupported manifest kind {kind!r} apiVersion {api!r}; OnePlus reads {known}", filename=filename
        )
    return translator(doc, filename)
