"""deploy/k8s/base: every manifest valid against the Kubernetes OpenAPI schema (kubernetes-validate, offline), and
the shape the issue asks for: NATS as a three-replica StatefulSet with storage, Redis with Sentinel, services with
real probes and PodDisruptionBudgets, the executor a DaemonSet on GPU nodes that is no simulation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s" / "base"
K8S_VERSION = "1.30"


def kustomization() -> dict[str, Any]:
    data = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert isinstance(data, dict)
    return data


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((BASE / name).read_text()) if d]
    return docs


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in of_kind(kind) if d["metadata"]["name"] == name)


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_every_file_is_a_resource_of_the_kustomization() -> None:
    listed = set(kustomization()["resources"])
    present = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_every_manifest_is_valid_against_the_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate.utils import SchemaNotFoundError

    try:
        kv.validate({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "probe"}}, K8S_VERSION, strict=True)
    except (SchemaNotFoundError, OSError) as exc:
        pytest.skip(f"kubernetes-validate cannot load its schemas offline: {exc}")
    for doc in documents():
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            where = f"{doc['kind']}/{doc['metadata']['name']}"
            raise AssertionError(f"{where}: {exc.message} at {list(exc.path)}") from None


def test_an_invalid_manifest_is_caught() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    bad = named("Deployment", "oneplus-intake")
    bad = {**bad, "spec": {**bad["spec"], "replicas": "two"}}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def test_nats_is_a_three_server_jetstream_cluster_on_volumes() -> None:
    sts = named("StatefulSet", "oneplus-nats")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["volumeClaimTemplates"]
    env = env_of(sts["spec"]["template"]["spec"]["containers"][0])
    routes = {f"nats://oneplus-nats-{i}.oneplus-nats:6222" for i in range(3)}
    assert {env[f"NATS_ROUTE_{i}"] for i in range(3)} == routes
    # The ConfigMap carries the tested files unchanged (tests/deploy/test_nats_cluster.py runs them).
    data = named("ConfigMap", "oneplus-nats-config")["data"]
    assert data["nats-server.conf"] == (ROOT / "deploy/nats/cluster/nats-server.conf").read_text()
    assert data["accounts.conf"] == (ROOT / "deploy/nats/accounts.conf").read_text()


def test_redis_runs_with_sentinels() -> None:
    sts = named("StatefulSet", "oneplus-redis")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["volumeClaimTemplates"]
    names = [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]]
    assert names == ["redis", "sentinel"]
    conf = named("ConfigMap", "oneplus-redis-config")["data"]
    assert "sentinel monitor oneplus" in conf["sentinel.conf"] and "appendonly yes" in conf["redis.conf"]


def test_every_workload_has_requests_probes_and_a_disruption_budget() -> None:
    budgets = [d["spec"]["selector"]["matchLabels"] for d in of_kind("PodDisruptionBudget")]
    for kind in ("Deployment", "StatefulSet", "DaemonSet"):
        for w in of_kind(kind):
            name = w["metadata"]["name"]
            labels = w["spec"]["template"]["metadata"]["labels"]
            if kind != "DaemonSet":  # a DaemonSet's pods go with their node
                assert any(b.items() <= labels.items() for b in budgets), f"{name} has no PodDisruptionBudget"
            for c in containers(w):
                assert c.get("resources", {}).get("requests"), f"{name}/{c['name']} requests nothing"
            for c in w["spec"]["template"]["spec"]["containers"]:
                assert "readinessProbe" in c and "livenessProbe" in c, f"{name}/{c['name']} has no probes"


def test_the_services_probe_the_process_itself_and_use_the_whole_cluster() -> None:
    for w in [*of_kind("Deployment"), *of_kind("DaemonSet")]:
        c = w["spec"]["template"]["spec"]["containers"][0]
        service = w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        probe = " ".join(c["livenessProbe"]["exec"]["command"])
        assert f"python -m oneplus_bus.health {service}" in probe, w["metadata"]["name"]
        env = env_of(c)
        assert env["ONEPLUS_STREAM_REPLICAS"] == "3"
        url = env.get("NATS_URL") or c["args"][0]
        assert all(f"oneplus-nats-{i}.oneplus-nats:4222" in url for i in range(3)), w["metadata"]["name"]
    assert (
        named("Deployment", "oneplus-intake")["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"][
            "path"
        ]
        == "/healthz"
    )


def test_the_executor_is_a_real_gpu_node_and_not_a_simulation() -> None:
    ds = named("DaemonSet", "oneplus-node-executor")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = env_of(spec["containers"][0])
    assert env["ONEPLUS_TOPOLOGY"] == "nvml" and env["ONEPLUS_RUNTIME"] == "docker"
    assert "ONEPLUS_SIMULATION" not in env
    assert not any("--simulate" in a for a in spec["containers"][0].get("args", []))
