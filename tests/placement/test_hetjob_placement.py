"""A heterogeneous job (Slurm hetjob) is placed as one gang: every component or none, each by its own constraint."""

from __future__ import annotations

import pytest
from oneplus_contracts import Allocation, JobSpec, NodeRecord, RankPlacement
from oneplus_intake.admission import EmptyCluster, Inadmissible, admit
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_placement import place_gang
from oneplus_placement.explain import explain_pending
from oneplus_placement.request import GangRequest
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.capacity import whole_gpus
from oneplus_queueing.config import default_config
from placement_boards import preset_cluster

H100 = "h100_sxm_8gpu_nvswitch_nv18"

# Component 0: one CPU-only rank (the batch script, a driver); component 1: 2 nodes x 8 GPUs inside one leaf.
SCRIPT = """#!/bin/sh
#SBATCH --job-name=rl --ntasks=1
#SBATCH hetjob
#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 --switches=1
srun --het-group=1 hostname
"""


def het_spec(script: str = SCRIPT) -> JobSpec:
    return parse_sbatch(script, filename="het.sh", submit_dir="").spec


def state(nodes: int = 8, per_leaf: int = 4) -> ClusterState:
    return ClusterState.from_cluster(preset_cluster(H100, nodes, nodes_per_leaf=per_leaf))  # node-00.., 4 per leaf


def fill(st: ClusterState, node: str, gpus: list[int]) -> None:
    st.apply(Allocation(ranks=[RankPlacement(rank=0, node=node, gpus=gpus, cpus=1, memory_mb=1)]))


def leaf_of(st: ClusterState, node: str) -> int:
    return st.layout.slots[st.layout.index(node)].leaf


def test_components_are_placed_together_each_by_its_own_shape() -> None:
    st = state()
    got = place_gang(st, het_spec())
    alloc = got.allocation
    assert alloc is not None, got.explanation
    assert [r.rank for r in alloc.ranks] == [0, 1, 2]
    driver, *trainers = alloc.ranks
    assert driver.gpus == [] or driver.gpu_milli > 0  # the CPU-only rank holds a share, no whole GPU
    assert [len(r.gpus) for r in trainers] == [8, 8]
    assert len({r.node for r in trainers}) == 2 and len({leaf_of(st, r.node) for r in trainers}) == 1
    assert driver.node not in {r.node for r in trainers}  # each component on nodes of its own
    assert alloc.score["components"] == 2 and alloc.score["placed_gpus"] == 16.001  # 16 GPUs and the share


def test_the_large_component_gets_the_only_leaf_it_fits_in() -> None:
    st = state()
    # Leaf 0 (node-00..03) keeps two whole nodes free, leaf 1 keeps one: the GPU component fits only in leaf 0,
    # and the one-rank component must not take a node there first.
    for node in ("node-00", "node-01", "node-04", "node-05", "node-06"):
        fill(st, node, [0])
    got = place_gang(st, het_spec())
    assert got.allocation is not None, got.explanation
    trainers = got.allocation.ranks[1:]
    assert sorted(r.node for r in trainers) == ["node-02", "node-03"]


def native_het(leaf: str = "required") -> JobSpec:
    """The same job as a native JobSpec, its GPU component required inside one leaf (--switches only prefers)."""
    driver = {"ranks": 1, "resources": {"gpus": 0.001}}
    trainers = {"ranks": 2, "resources": {"gpus": 8}, "topology": {"domain": "leaf", "mode": leaf, "nodes": 2}}
    return JobSpec.model_validate(
        {"name": "rl", "ranks": 3, "resources": driver["resources"], "components": [driver, trainers]}
    )


def test_nothing_is_placed_when_one_component_cannot_fit() -> None:
    st = state()
    for node in ("node-00", "node-01", "node-02", "node-04", "node-05", "node-06"):
        fill(st, node, [0])  # no leaf keeps two whole nodes free
    before = list(st.free_count)
    assert place_gang(st, native_het("preferred")).allocation is not None  # across leaves it would fit
    got = place_gang(st, native_het())
    assert got.allocation is None and got.explanation is not None
    assert got.explanation.message.startswith("component 1 (2 rank(s)): ")
    assert list(st.free_count) == before  # the snapshot is untouched: nothing held for component 0 either


def test_a_component_keeps_to_its_own_nodelist() -> None:
    script = SCRIPT.replace("--ntasks=1\n", "--ntasks=1 --nodelist=node-07\n")
    got = place_gang(state(), het_spec(script))
    assert got.allocation is not None, got.explanation
    assert got.allocation.ranks[0].node == "node-07"
    assert "node-07" not in {r.node for r in got.allocation.ranks[1:]}


def test_counting_sees_every_component() -> None:
    spec = het_spec()
    assert whole_gpus(spec) == 16
    assert GangRequest.of(spec).ranks == 2  # as one request: the largest component, never more than the job needs
    single = parse_sbatch("#!/bin/sh\n#SBATCH -N2 --gpus-per-node=8\nsrun x\n", filename="s.sh", submit_dir="").spec
    assert single.components is None and "components" not in single.model_dump(mode="json")


def test_explain_names_the_component_that_does_not_fit() -> None:
    st = state()
    for node in ("node-00", "node-01", "node-02", "node-04", "node-05", "node-06"):
        fill(st, node, [0])
    why = explain_pending(st, native_het(), ahead=["j-ahead"])
    assert why.message.startswith("component 1 (2 rank(s)): ") and why.message.endswith("(j-ahead)")
    fits = explain_pending(state(), native_het())
    assert fits.fits_now and fits.message.startswith("fits now: 2 components, 16.001 GPUs on ")


def test_admission_checks_each_component_and_the_whole_gang() -> None:
    nodes = [NodeRecord(topology=t) for t in preset_cluster(H100, 3).nodes]  # type: ignore[arg-type]
    admit(het_spec(), default_config(), nodes, EmptyCluster())  # a node for the driver, two for the trainers
    with pytest.raises(Inadmissible, match=r"components ask 16.001 GPUs in all, more than the cluster has \(16"):
        admit(het_spec(), default_config(), nodes[:2], EmptyCluster())  # each component needs nodes of its own
    too_wide = het_spec(SCRIPT.replace("--nodes=2 --ntasks-per-node=1 --gpus-per-node=8", "--gpus-per-node=16"))
    with pytest.raises(Inadmissible, match=r"^component 1: a rank asks for 16 GPUs but the largest node has 8"):
        admit(too_wide, default_config(), nodes, EmptyCluster())
    with pytest.raises(Inadmissible, match=r"^component 0: --nodelist names node 'gpu9'"):
        admit(het_spec(SCRIPT.replace("--ntasks=1\n", "--ntasks=1 -w gpu9\n")), default_config(), nodes)
