"""Levels of any depth and multi-node NVLink domains (GB200 NVL72 racks) as the tightest level above the node.

The cluster is issue 41's: two NVL72 racks (36 trays of 4 GB200, 18 trays to a domain) plus eight H100 boards, from
`bench/clusters/nvl72_2rack_h100.yaml` and the real tray capture behind the `gb200_nvl72_compute_tray_4gpu` preset.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_placement import ClusterSnapshot, allocation_ring_gbps, place_batch, place_gang
from oneplus_placement.batch import PendingGang
from oneplus_topology.cluster import Cluster, Fabric, load_cluster
from oneplus_topology.presets import shared_preset

ROOT = Path(__file__).resolve().parents[2]
NVL72 = ROOT / "bench" / "clusters" / "nvl72_2rack_h100.yaml"


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return load_cluster(NVL72)


def spec(ranks: int, gpus: int, **topology: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "ranks": ranks, "resources": {"gpus": gpus}, "topology": topology})


def domains_of(cluster: Cluster, alloc: Allocation, ranks: range) -> set[str | None]:
    return {cluster.node(alloc.ranks[r].node).nvlink_domain for r in ranks}


def test_the_levels_of_the_nvl72_cluster_are_node_nvlink_leaf_spine_cluster(cluster: Cluster) -> None:
    snap = ClusterSnapshot.from_cluster(cluster)
    assert snap.layout.level_names == ("node", "nvlink", "leaf", "spine", "cluster")
    nvlink = snap.layout.level("nvlink")
    assert nvlink is not None
    # Two domains of 18 trays; every H100 board is an NVLink domain of its own.
    assert sorted(len(m) for m in nvlink.members) == [1] * 8 + [18, 18]


def test_a_tp16_group_spans_four_trays_of_one_domain_at_nvlink_speed(cluster: Cluster) -> None:
    result = place_gang(ClusterSnapshot.from_cluster(cluster), spec(4, 4, group_gpus=16))
    alloc = result.allocation
    assert alloc is not None, result.explanation
    assert alloc.domain == "nvlink"
    assert len(domains_of(cluster, alloc, range(4))) == 1
    assert all(cluster.node(r.node).gpu_model == "GB200" and len(r.gpus) == 4 for r in alloc.ranks)
    # Ring over NV18 through the NVSwitch trays (18 x 50 GB/s), not the NIC's 50 GB/s.
    assert alloc.ring_gbps == 900.0
    assert allocation_ring_gbps(cluster, alloc) == 900.0


def test_a_72_gpu_gang_takes_exactly_one_whole_domain(cluster: Cluster) -> None:
    alloc = place_gang(ClusterSnapshot.from_cluster(cluster), spec(18, 4)).allocation
    assert alloc is not None
    assert alloc.domain == "nvlink"
    (domain,) = domains_of(cluster, alloc, range(18))
    assert {r.node for r in alloc.ranks} == {n.node for n in cluster.nodes_by_nvlink_domain()[domain]}
    assert alloc.ring_gbps == 900.0


def test_dp2_tp32_keeps_each_tp_group_inside_one_domain(cluster: Cluster) -> None:
    alloc = place_gang(ClusterSnapshot.from_cluster(cluster), spec(16, 4, group_gpus=32)).allocation
    assert alloc is not None
    assert len(domains_of(cluster, alloc, range(8))) == 1
    assert len(domains_of(cluster, alloc, range(8, 16))) == 1


def test_four_tp32_groups_fill_two_domains_and_no_group_straddles_them(cluster: Cluster) -> None:
    alloc = place_gang(ClusterSnapshot.from_cluster(cluster), spec(32, 4, group_gpus=32)).allocation
    assert alloc is not None
    assert alloc.domain == "leaf" or alloc.domain == "spine"
    per_group = [domains_of(cluster, alloc, range(g * 8, g * 8 + 8)) for g in range(4)]
    assert all(len(d) == 1 for d in per_group)
    # 64 of 72 GPUs a domain: two groups in each rack, none split over the racks' NICs.
    assert sorted(next(iter(d)) or "" for d in per_group) == ["gb200-nvl0", "gb200-nvl0", "gb200-nvl1", "gb200-nvl1"]


def test_a_tp_group_never_leaves_its_domain_even_when_the_gpus_exist_across_two(cluster: Cluster) -> None:
    """Each rack has 28 free GPUs: 56 in all, but no domain holds a TP-32 group, so the job waits."""
    snap = ClusterSnapshot.from_cluster(cluster)
    trays = [n.node for n in cluster.nodes if n.node.startswith("gb200")]
    busy = [t for k, t in enumerate(trays) if k % 18 >= 7]  # 11 trays held in each rack, 7 free (28 GPUs)
    snap = snap.with_allocation(
        Allocation(ranks=[RankPlacement(rank=r, node=t, gpus=[0, 1, 2, 3]) for r, t in enumerate(busy)])
    )
    result = place_gang(snap, spec(8, 4, group_gpus=32))
    assert result.allocation is None
    assert result.explanation is not None
    assert "tensor-parallel groups of 32 inside one nvlink domain" in result.explanation.message
    # A TP-16 group fits in either rack's 28 free GPUs.
    assert place_gang(snap, spec(4, 4, group_gpus=16)).placed


def test_small_gangs_go_to_the_fuller_domain_and_keep_the_other_whole(cluster: Cluster) -> None:
    snap = ClusterSnapshot.from_cluster(cluster)
    snap = snap.with_allocation(Allocation(ranks=[RankPlacement(rank=0, node="gb200-20", gpus=[0, 1, 2, 3])]))
    # On GB200 only (an H100 board would hold the group on one node, the tightest level).
    gb200_tp8 = JobSpec.model_validate(
        {"name": "j", "ranks": 2, "resources": {"gpus": 4, "gpu_models": ["GB200"]}, "topology": {"group_gpus": 8}}
    )
    tp8 = place_gang(snap, gb200_tp8).allocation
    assert tp8 is not None
    assert domains_of(cluster, tp8, range(2)) == {"gb200-nvl1"}
    snap = snap.with_allocation(tp8)
    # Domain 0 is still whole: the next 72-GPU gang takes all of it.
    rack = place_gang(snap, spec(18, 4)).allocation
    assert rack is not None and domains_of(cluster, rack, range(18)) == {"gb200-nvl0"}


def test_an_eight_gpu_tp_group_of_4gpu_ranks_may_sit_on_an_h100_board_whole_or_in_a_domain(cluster: Cluster) -> None:
    snap = ClusterSnapshot.from_cluster(cluster)
    alloc = place_gang(snap, spec(2, 4, group_gpus=8, domain="node", mode="required")).allocation
    assert alloc is not None
    # On one node, the group is one H100 board's 8 GPUs.
    assert {r.node for r in alloc.ranks} == {"h100-00"} or len({r.node for r in alloc.ranks}) == 1
    assert sorted(g for r in alloc.ranks for g in r.gpus) == list(range(8))


def test_a_level_the_cluster_does_not_define_is_refused_with_the_levels_it_has(cluster: Cluster) -> None:
    result = place_gang(ClusterSnapshot.from_cluster(cluster), spec(2, 4, domain="rack", mode="required"))
    assert result.explanation is not None
    assert result.explanation.constraint == "level"
    assert result.explanation.message == (
        "topology.domain 'rack' is not a level of this cluster; its levels are node, nvlink, leaf, spine, cluster"
    )
    bad = place_gang(ClusterSnapshot.from_cluster(cluster), spec(4, 4, group_gpus=16, group_domain="block"))
    assert bad.explanation is not None and "topology.group_domain 'block'" in bad.explanation.message


def test_a_tp_group_larger_than_every_domain_of_its_level_is_refused(cluster: Cluster) -> None:
    result = place_gang(ClusterSnapshot.from_cluster(cluster), spec(32, 4, group_gpus=128))
    assert result.explanation is not None
    assert result.explanation.constraint == "group_domain"
    assert result.explanation.message == (
        "each tensor-parallel group of 128 GPUs (32 ranks x 4) must sit inside one nvlink domain; the largest nvlink "
        "domain here (gb200-nvl0) holds 72 GPUs"
    )


def test_a_cluster_without_multi_node_domains_has_no_nvlink_level() -> None:
    c = Cluster(
        name="h100",
        fabric=Fabric(),
        nodes=[
            shared_preset("h100_sxm_8gpu_nvswitch_nv18").model_copy(update={"node": f"h{i}", "leaf": "l0"})
            for i in range(2)
        ],
    )
    snap = ClusterSnapshot.from_cluster(c)
    assert snap.layout.level_names == ("node", "leaf", "spine", "cluster")
    result = place_gang(snap, spec(2, 8, domain="nvlink"))
    assert result.explanation is not None
    assert "its levels are node, leaf, spine, cluster" in result.explanation.message
    # As before: a TP-16 group of 8-GPU ranks needs one node, and none has 16 GPUs.
    tp16 = place_gang(snap, spec(2, 8, group_gpus=16))
    assert tp16.explanation is not None and "needs 16 GPUs on one node" in tp16.explanation.message


def test_a_site_names_its_own_levels_and_a_job_asks_for_one() -> None:
    """Racks inside zones, named in each node's levels: a required rack keeps the gang in one rack."""
    base = shared_preset("h100_sxm_8gpu_nvswitch_nv18")
    nodes = []
    for i in range(8):
        levels = {"rack": f"r{i // 2}", "leaf": f"leaf{i // 4}", "spine": "s0", "zone": "z0"}
        nodes.append(base.model_copy(update={"node": f"n{i}", "levels": levels, "leaf": levels["leaf"]}))
    c = Cluster(name="racks", fabric=Fabric(), nodes=nodes)
    snap = ClusterSnapshot.from_cluster(c)
    assert snap.layout.level_names == ("node", "rack", "leaf", "spine", "zone", "cluster")
    # n0 is busy: a two-node gang that must stay in one rack skips rack r0 (one node free) and takes r1.
    snap = snap.with_allocation(Allocation(ranks=[RankPlacement(rank=0, node="n0", gpus=[0])]))
    alloc = place_gang(snap, spec(2, 8, domain="rack", mode="required")).allocation
    assert alloc is not None
    assert alloc.domain == "rack" and {r.node for r in alloc.ranks} == {"n2", "n3"}
    # Three whole nodes cannot sit in one rack of two.
    three = place_gang(snap, spec(3, 8, domain="rack", mode="required"))
    assert three.explanation is not None and "under one rack" in three.explanation.message


def test_the_batch_keeps_tp_groups_inside_domains(cluster: Cluster) -> None:
    snap = ClusterSnapshot.from_cluster(cluster)
    gangs = [PendingGang(f"j{n}", spec(8, 4, group_gpus=16)) for n in range(4)]
    result = place_batch(snap, gangs, time_limit_s=0.5)
    for n in range(4):
        alloc = result.decisions[f"j{n}"].allocation
        assert alloc is not None
        assert len(domains_of(cluster, alloc, range(4))) == 1
        assert len(domains_of(cluster, alloc, range(4, 8))) == 1
