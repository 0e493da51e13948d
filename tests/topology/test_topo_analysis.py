"""NVLink groups and domains, ring bandwidth, best GPU sets, degraded links and health."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oneplus_contracts import GpuHealth, GpuInfo, GpuLink, NodeTopology
from oneplus_topology import analysis as an
from oneplus_topology.bandwidth import link_gbps
from topology_cases import parse_file


def brute_force_ring(topo: NodeTopology, gpus: list[int]) -> float:
    if len(gpus) < 2:
        return 0.0
    g = an.pair_gbps(topo)
    pos = {x.index: p for p, x in enumerate(topo.gpus)}
    first, rest = gpus[0], gpus[1:]
    best = 0.0
    for order in itertools.permutations(rest):
        ring = [first, *order]
        best = max(best, min(g[pos[a]][pos[b]] for a, b in zip(ring, ring[1:] + ring[:1], strict=True)))
    return best


def test_dgx1_rings_follow_the_cube_mesh() -> None:
    topo = parse_file("dgx1_v100")
    sys_v100 = link_gbps("SYS", "V100")
    assert an.ring_gbps(topo, [0, 3]) == 50.0
    assert an.ring_gbps(topo, [0, 4]) == 50.0
    assert an.ring_gbps(topo, [0, 1]) == 25.0
    assert an.ring_gbps(topo, [0, 1, 2, 3]) == 25.0  # every 4-ring in a quad uses an NV1 link
    assert an.ring_gbps(topo, list(range(8))) == 50.0  # the NV2 ring 0-3-2-1-5-6-7-4 NCCL uses on a DGX-1
    assert an.ring_gbps(topo, [0, 1, 5, 4]) == 25.0
    assert an.ring_gbps(topo, [0, 1, 2, 4]) == sys_v100  # GPU4 has one NVLink peer in this set
    assert an.ring_gbps(topo, [0, 5]) == sys_v100
    assert an.ring_gbps(topo, [3]) == 0.0


@pytest.mark.parametrize("name", ["dgx1_v100", "pcie_pix_pxb_8gpu", "l40s_8gpu_pcie_node_sys"])
def test_ring_matches_brute_force_on_every_subset(name: str) -> None:
    topo = parse_file(name)
    for k in range(2, 9):
        for combo in itertools.combinations(range(8), k):
            assert an.ring_gbps(topo, combo) == brute_force_ring(topo, list(combo)), combo


@settings(max_examples=40, deadline=None)
@given(
    st.integers(3, 7).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(
                st.sampled_from(["NV1", "NV2", "NV4", "PIX", "PXB", "NODE", "SYS"]),
                min_size=n * (n - 1) // 2,
                max_size=n * (n - 1) // 2,
            ),
        )
    )
)
def test_ring_matches_brute_force_on_random_nodes(case: tuple[int, list[str]]) -> None:
    n, kinds = case
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    links = [
        GpuLink(a=a, b=b, kind=k, nvlinks=int(k[2:]) if k.startswith("NV") else 0, gbps=link_gbps(k, "H100"))
        for (a, b), k in zip(pairs, kinds, strict=True)
    ]
    topo = NodeTopology(node="r", gpu_model="H100", gpus=[GpuInfo(index=i) for i in range(n)], links=links)
    assert an.ring_gbps(topo, range(n)) == brute_force_ring(topo, list(range(n)))


def test_ring_refuses_unknown_or_repeated_gpus() -> None:
    topo = parse_file("h100_sxm_8gpu_nvswitch_nv18")
    with pytest.raises(ValueError, match="GPU 9 is not on this node"):
        an.ring_gbps(topo, [0, 9])
    with pytest.raises(ValueError, match="twice"):
        an.ring_gbps(topo, [1, 1])


def test_best_sets_prefer_fast_rings_then_one_numa_node_then_tight_pcie() -> None:
    dgx1 = parse_file("dgx1_v100")
    top = an.best_gpu_sets(dgx1, 4)[0]
    assert top.gpus == (0, 1, 2, 3) and top.ring_gbps == 25.0 and top.numa_nodes == 1
    h100 = parse_file("h100_sxm_8gpu_nvswitch_nv18")
    assert an.best_gpu_sets(h100, 2, free={1, 4, 2, 6})[0].gpus == (1, 2)
    pcie = parse_file("pcie_pix_pxb_8gpu")
    first, second = an.best_gpu_sets(pcie, 2, limit=2)
    assert first.gpus == (0, 1) and second.gpus == (2, 3)  # PIX pairs before PXB pairs at equal GB/s
    assert [s.gpus for s in an.best_gpu_sets(pcie, 4, limit=2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    with pytest.raises(ValueError, match="at least 1"):
        an.best_gpu_sets(pcie, 0)


def test_degraded_gpu_leaves_nvlink_groups_and_loses_bandwidth() -> None:
    dgx1 = parse_file("dgx1_v100")
    hurt = an.degrade(dgx1, 0, 5)
    assert an.nvlink_groups(hurt) == [[1, 2, 3], [1, 5], [2, 6], [3, 7], [4, 5, 6, 7]]
    assert an.nvlink_domains(hurt) == [[1, 2, 3, 4, 5, 6, 7]]
    m = an.node_model(hurt)
    assert m.pair_gbps(0, 3) == 25.0  # NV2 with 5 of 6 links up keeps one link
    assert m.kind[0][1] == "NODE" and m.pair_gbps(0, 1) == link_gbps("NODE", "V100")  # NV1 lost: PCIe, same NUMA
    assert an.nvlink_groups(dgx1)[0] == [0, 1, 2, 3]  # the original is untouched

    h100 = parse_file("h100_sxm_8gpu_nvswitch_nv18")
    one_down = an.degrade(h100, 3, 17)
    assert an.nvlink_groups(one_down) == [[0, 1, 2, 4, 5, 6, 7]]
    assert an.ring_gbps(one_down, [0, 3]) == 17 * 25.0
    assert an.ring_gbps(one_down, [0, 1]) == 450.0
    all_down = an.degrade(h100, 3, 0)
    assert an.ring_gbps(all_down, [0, 3]) == link_gbps("NODE", "H100")
    assert an.ring_gbps(all_down, [4, 3]) == link_gbps("SYS", "H100")


def test_degrade_refuses_what_cannot_be() -> None:
    h100 = parse_file("h100_sxm_8gpu_nvswitch_nv18")
    with pytest.raises(ValueError, match="GPU 8 is not on node"):
        an.degrade(h100, 8, 1)
    with pytest.raises(ValueError, match="has 18 NVLinks"):
        an.degrade(h100, 0, 19)
    with pytest.raises(ValueError, match="has 0 NVLinks"):
        an.degrade(parse_file("l40s_8gpu_pcie_node_sys"), 0, 1)


def test_heartbeat_health_is_applied_to_a_copy() -> None:
    h100 = parse_file("h100_sxm_8gpu_nvswitch_nv18")
    after = an.apply_health(h100, [GpuHealth(index=2, healthy=False, reason="XID 79", nvlinks_active=10)])
    assert (after.gpus[2].healthy, after.gpus[2].health_reason, after.gpus[2].nvlinks_active) == (False, "XID 79", 10)
    assert h100.gpus[2].healthy and h100.gpus[2].nvlinks_active == 18
    assert 2 not in an.nvlink_domains(after)[0]
    with pytest.raises(ValueError, match="does not have"):
        an.apply_health(h100, [GpuHealth(index=12)])


def test_pcie_numa_and_rail_groupings() -> None:
    dgx = parse_file("dgx_a100_8gpu_nv12_12nic")
    assert an.numa_groups(dgx) == {1: [2, 3], 3: [0, 1], 5: [6, 7], 7: [4, 5]}
    assert an.pcie_switch_groups(dgx) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert an.rails(dgx)[5] == ["mlx5_6", "mlx5_7"]
    matrix = an.pair_gbps(dgx)
    assert all(matrix[i][i] == 0.0 for i in range(8))
    assert all(matrix[i][j] == matrix[j][i] == 300.0 for i in range(8) for j in range(8) if i != j)


def test_nodes_with_one_layout_share_one_model() -> None:
    h100 = parse_file("h100_sxm_8gpu_nvswitch_nv18")
    assert an.node_model(h100) is an.node_model(h100.model_copy(update={"node": "elsewhere"}))
    assert an.node_model(h100) is not an.node_model(an.degrade(h100, 0, 17))


def test_memoised_ring_answers_do_not_depend_on_the_order_asked() -> None:
    topo = parse_file("dgx1_v100")  # its speed (about 2 µs a query) is a figure of `task bench:solver`
    rng = random.Random(7)
    for _ in range(500):
        s = rng.sample(range(8), rng.randint(2, 8))
        first = an.ring_gbps(topo, s)
        assert an.ring_gbps(topo, list(reversed(s))) == first == an.ring_gbps(topo, sorted(s)), s
    an.ring_gbps(topo, [0, 1])
    with pytest.raises(ValueError, match="twice"):  # the memo of {0, 1} does not answer for a GPU named twice
        an.ring_gbps(topo, [0, 1, 1])


def test_model_cache_notices_links_taken_down_in_place_and_forgets_dead_topologies() -> None:
    topo = parse_file("h100_sxm_8gpu_nvswitch_nv18")
    assert an.nvlink_groups(topo) == [list(range(8))]
    topo.gpus[5].nvlinks_active = 0
    assert an.nvlink_groups(topo) == [[0, 1, 2, 3, 4, 6, 7]]
    key = id(topo)
    assert key in an._by_identity
    del topo
    assert key not in an._by_identity
