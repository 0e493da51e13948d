"""Issue 44: Slurm's `--nodes` (exactly N distinct nodes, ranks / N on each) and one GPU model per gang.

The demo cluster of `oneplus dev up`: two H100 boards under leaf-0, an A100 board and an L40S box under leaf-1.
"""

from __future__ import annotations

from typing import Any

import pytest
from oneplus_contracts import JobSpec
from oneplus_placement import ClusterSnapshot, PendingGang, place_batch, place_gang
from oneplus_topology.cluster import Cluster, Fabric
from placement_boards import DGX1, HGX_H100, L40S, board
from pydantic import ValidationError

A100 = "dgx_a100_8gpu_nv12_12nic"


DEMO = (
    ("h100-0", HGX_H100, "leaf-0"),
    ("h100-1", HGX_H100, "leaf-0"),
    ("a100-0", A100, "leaf-1"),
    ("l40s-0", L40S, "leaf-1"),
)


def demo(order: tuple[tuple[str, str, str], ...] = DEMO) -> ClusterSnapshot:
    """h100-0, h100-1 (leaf-0), a100-0, l40s-0 (leaf-1), as `oneplus dev up` starts them."""
    nodes = []
    for name, preset, leaf in order:
        nodes.append(board(preset).model_copy(update={"node": name, "leaf": leaf, "spine": "spine-0"}))
    cluster = Cluster(name="demo", fabric=Fabric(nodes_per_leaf=2, leaves_per_spine=2), nodes=nodes)  # type: ignore[arg-type]
    return ClusterSnapshot.from_cluster(cluster)


def job(name: str = "j", **fields: Any) -> JobSpec:
    return JobSpec.model_validate({"name": name, **fields})


def held(snap: ClusterSnapshot, *specs: JobSpec) -> ClusterSnapshot:
    for spec in specs:
        got = place_gang(snap, spec)
        assert got.allocation is not None, got.explanation
        snap = snap.with_allocation(got.allocation)
    return snap


def nodes_of(spec: JobSpec, snap: ClusterSnapshot) -> list[str]:
    got = place_gang(snap, spec)
    assert got.allocation is not None, got.explanation
    return [r.node for r in got.allocation.ranks]


# --- --nodes: distinct nodes -------------------------------------------------------------------------------------


def test_two_ranks_of_four_gpus_on_two_nodes_take_two_distinct_nodes() -> None:
    snap = demo()
    spec = job(ranks=2, resources={"gpus": 4}, topology={"nodes": 2})
    got = nodes_of(spec, snap)
    assert len(set(got)) == 2, f"both ranks on {got}: --nodes=2 means two nodes"
    # Without the constraint both ranks share one board (the old behaviour, still right for a job without --nodes).
    assert len(set(nodes_of(job(ranks=2, resources={"gpus": 4}), snap))) == 1


def test_ranks_per_node_are_laid_evenly_over_exactly_the_nodes_asked() -> None:
    snap = demo()
    spec = job(ranks=16, resources={"gpus": 1}, topology={"nodes": 2})
    got = nodes_of(spec, snap)
    assert sorted({n: got.count(n) for n in got}.values()) == [8, 8]
    spread = job(ranks=8, resources={"gpus": 1, "gpu_models": ["H100", "A100", "L40S"]}, topology={"nodes": 4})
    got = nodes_of(spread, snap)
    assert {n: got.count(n) for n in got} == {"h100-0": 2, "h100-1": 2, "a100-0": 2, "l40s-0": 2}


def test_nodes_waits_rather_than_doubling_up_when_too_few_nodes_have_room() -> None:
    snap = held(demo(), job("a", resources={"gpus": 6, "gpu_models": ["H100"]}))  # h100-0 keeps 2 free
    spec = job(ranks=2, resources={"gpus": 4, "gpu_models": ["H100"]}, topology={"nodes": 2})
    got = place_gang(snap, spec)
    assert got.allocation is None, "h100-1 could hold both ranks, but --nodes=2 asks for two nodes"
    assert got.explanation is not None
    assert "on 2 distinct nodes" in got.explanation.message


def test_gpu_shares_spread_over_distinct_nodes_too() -> None:
    snap = demo()
    spec = job(ranks=4, resources={"gpus": 0.001, "gpu_models": ["H100"]}, topology={"nodes": 2})
    got = nodes_of(spec, snap)
    assert sorted(got) == ["h100-0", "h100-0", "h100-1", "h100-1"]


def test_batch_placement_keeps_the_distinct_nodes() -> None:
    snap = demo()
    gangs = [
        PendingGang("a", job("a", ranks=2, resources={"gpus": 4, "gpu_models": ["H100"]}, topology={"nodes": 2})),
        PendingGang("b", job("b", ranks=2, resources={"gpus": 4, "gpu_models": ["H100"]}, topology={"nodes": 2})),
    ]
    result = place_batch(snap, gangs, time_limit_s=0.5)
    for job_id in ("a", "b"):
        alloc = result.decisions[job_id].allocation
        assert alloc is not None
        assert len({r.node for r in alloc.ranks}) == 2


@pytest.mark.parametrize(
    ("ranks", "nodes", "words"),
    [
        (2, 3, "topology.nodes=3 is more nodes than ranks (2)"),
        (3, 2, "topology.nodes=2 does not divide ranks=3"),
    ],
)
def test_a_node_count_the_ranks_cannot_fill_is_refused(ranks: int, nodes: int, words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        job(ranks=ranks, resources={"gpus": 1}, topology={"nodes": nodes})


# --- one GPU model per gang --------------------------------------------------------------------------------------


def test_a_gang_naming_no_model_waits_rather_than_mixing_an_a100_and_an_l40s() -> None:
    """The issue's case: H100s busy, A100 and L40S boards idle; before, the gang ran on both at 13.8 GB/s."""
    busy = job("busy", ranks=2, resources={"gpus": 8, "gpu_models": ["H100"]})
    snap = held(demo(), busy)
    got = place_gang(snap, job(ranks=2, resources={"gpus": 8}))
    assert got.allocation is None
    assert got.explanation is not None
    assert got.explanation.constraint == "gpu_kind"
    msg = got.explanation.message
    assert "waits for one GPU model" in msg and "gpu_models lists several" in msg
    assert "A100" in msg and "L40S" in msg and "H100" in msg


def test_a_gang_that_lists_several_models_may_mix_them() -> None:
    snap = held(demo(), job("busy", ranks=2, resources={"gpus": 8, "gpu_models": ["H100"]}))
    got = nodes_of(job(ranks=2, resources={"gpus": 8, "gpu_models": ["A100", "L40S"]}), snap)
    assert sorted(got) == ["a100-0", "l40s-0"]


def test_a_queue_that_allows_mixing_lets_the_gang_mix() -> None:
    snap = held(demo(), job("busy", ranks=2, resources={"gpus": 8, "gpu_models": ["H100"]}))
    got = place_gang(snap, job(ranks=2, resources={"gpus": 8}), mix_gpu_models=True)
    assert got.allocation is not None
    assert sorted(r.node for r in got.allocation.ranks) == ["a100-0", "l40s-0"]


def test_one_model_is_chosen_when_one_model_has_room() -> None:
    snap = demo()
    got = nodes_of(job(ranks=2, resources={"gpus": 8}), snap)
    assert sorted(got) == ["h100-0", "h100-1"]
    # One H100 board busy: the gang does not take the other H100 with the A100 (or the L40S).
    snap = held(snap, job("busy", resources={"gpus": 8, "gpu_models": ["H100"]}))
    assert place_gang(snap, job(ranks=2, resources={"gpus": 8})).allocation is None


def test_a_gang_too_big_for_any_one_model_says_it_never_fits_on_one_model() -> None:
    got = place_gang(demo(), job(ranks=3, resources={"gpus": 8}))
    assert got.explanation is not None
    assert got.explanation.constraint == "cluster_size"
    assert "no GPU model has enough nodes even when idle" in got.explanation.message


def test_a_cluster_of_one_model_is_unchanged() -> None:
    from oneplus_topology.cluster import synthetic_cluster

    snap = ClusterSnapshot.from_cluster(synthetic_cluster(4, preset=DGX1, nodes_per_leaf=2, leaves_per_spine=2))
    got = nodes_of(job(ranks=4, resources={"gpus": 8}), snap)
    assert len(set(got)) == 4


def test_batch_placement_keeps_one_model_per_gang() -> None:
    snap = held(demo(), job("busy", resources={"gpus": 8, "gpu_models": ["H100"]}))
    result = place_batch(snap, [PendingGang("g", job("g", ranks=2, resources={"gpus": 8}))], time_limit_s=0.5)
    assert result.decisions["g"].allocation is None


def test_the_best_domain_named_is_one_with_gpus_of_the_model_asked() -> None:
    """Both H100 boards busy: the leaf named is leaf-0 (the H100s), not leaf-1 where no H100 is (listed first here, as
    the live registry's node order may put it)."""
    snap = held(demo(DEMO[2:] + DEMO[:2]), job("busy", ranks=2, resources={"gpus": 8, "gpu_models": ["H100"]}))
    spec = job(ranks=2, resources={"gpus": 8, "gpu_models": ["H100"]}, topology={"domain": "leaf", "mode": "required"})
    got = place_gang(snap, spec)
    assert got.explanation is not None
    assert got.explanation.best_candidate == "leaf-0", got.explanation.message
