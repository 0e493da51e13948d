"""The FGD artifact's other pod lists (GPU-model, sharing and CPU-heavy): the columns they use, read and honoured."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_placement.greedy import place_gang
from oneplus_sim import fgd_live
from oneplus_sim.fgd import PodRes, load_nodes, load_pods, run_fgd

OPENB = Path(__file__).resolve().parents[2] / "data" / "traces" / "openb"
NODES = "sn,cpu_milli,memory_mib,gpu,model\n"
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def write(tmp: Path, name: str, header: str, rows: list[str]) -> Path:
    p = tmp / name
    p.write_text(header + "\n".join(rows) + "\n")
    return p


def test_the_gpu_model_column_is_read_from_a_gpuspec_list_and_becomes_the_jobs_gpu_models() -> None:
    pods = {p.name: p for p in load_pods(OPENB / "openb_pod_list_gpuspec10.csv")}
    # Rows of the file as published: a model-free pod, a one-model pod, and a pod that takes either V100.
    assert pods["openb-pod-0000"].res == PodRes(12000, 1000, 1, "")
    with_spec = [p for p in pods.values() if p.res.models == "V100M16|V100M32"]
    assert with_spec, "gpuspec10 lists pods that accept either V100"
    spec = fgd_live.pod_spec(with_spec[0])
    assert spec.resources.gpu_models == ["V100M16", "V100M32"]
    assert fgd_live.pod_spec(pods["openb-pod-0000"]).resources.gpu_models is None


def test_a_share_of_a_gpusharing_list_becomes_a_fraction_of_one_gpu() -> None:
    pods = load_pods(OPENB / "openb_pod_list_gpushare100.csv")
    shares = [p for p in pods if p.res.is_share]
    assert shares and all(0 < p.res.milli < 1000 and p.res.n_gpu == 1 for p in shares)
    spec = fgd_live.pod_spec(shares[0])
    assert spec.resources.gpus == pytest.approx(shares[0].res.milli / 1000)


@pytest.mark.parametrize("policy", ["oneplus", "fgd", "bestfit", "random"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_policy_places_gpu_model_pods_only_on_nodes_of_that_model(tmp_path: Path, policy: str, seed: int) -> None:
    # Three idle T4 nodes and one V100M32 node of two GPUs. Of three pods taking either V100 only two fit (on v0),
    # and a pod asking a model the cluster lacks fits nowhere: two fail. A policy blind to the column fails none.
    rows = ["t0,32000,65536,2,T4", "t1,32000,65536,2,T4", "t2,32000,65536,2,T4", "v0,32000,65536,2,V100M32"]
    nodes = load_nodes(write(tmp_path, "n.csv", NODES, rows))
    pods = [f"w{i},1000,1024,1,1000,V100M16|V100M32,LS,Running,0,1,0" for i in range(3)]
    pods.append("x,1000,1024,1,1000,A100,LS,Running,0,1,0")
    run = run_fgd(nodes, load_pods(write(tmp_path, "p.csv", PODS, pods)), policy, seed, demand=0.5)
    assert run.pods == 4 and run.failed == 2
    assert run.alloc_pct[-1] == pytest.approx(25)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_live_code_puts_a_gpu_model_share_on_that_models_node(tmp_path: Path, seed: int) -> None:
    rows = ["t0,32000,65536,2,T4", "v0,32000,65536,2,V100M16", "v1,32000,65536,2,V100M32"]
    nodes = load_nodes(write(tmp_path, "n.csv", NODES, rows))
    share = load_pods(write(tmp_path, "p.csv", PODS, ["s,1000,1024,1,400,V100M32,LS,Running,0,1,0"]))[0]
    live = fgd_live.OpenbState(nodes, fgd_live.live_meter([share]))
    got = place_gang(live.state, fgd_live.pod_spec(share), seed=seed, fgd=live.meter).allocation
    assert got is not None and got.nodes == ["v1"]
