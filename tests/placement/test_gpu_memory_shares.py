"""A GPU share that asks `resources.gpu_memory_mb` fits only on a GPU whose memory left holds it (the GPU's memory as
discovered, `GpuInfo.memory_mb`); unknown GPU memory limits nothing."""

from __future__ import annotations

import pytest
from oneplus_contracts import Allocation, JobSpec, NodeRecord, RankPlacement
from oneplus_placement import AllocationConflict, ClusterSnapshot
from oneplus_placement.fgd import FragMeter, WorkloadShape
from oneplus_placement.greedy import place_gang
from oneplus_placement.snapshot import ClusterState
from oneplus_topology.presets import load_preset

GPU_MB = 48 * 1024  # an L40S


def cluster(memory_mb: int | None = GPU_MB, gpus: int | None = None) -> ClusterSnapshot:
    topo = load_preset("l40s_8gpu_pcie_node_sys", "l40s-0").model_copy(update={"leaf": "l0", "spine": "s0"})
    listed = topo.gpus if gpus is None else topo.gpus[:gpus]
    topo = topo.model_copy(update={"gpus": [g.model_copy(update={"memory_mb": memory_mb}) for g in listed]})
    if gpus is not None:
        topo = topo.model_copy(update={"links": [lk for lk in topo.links if lk.a < gpus and lk.b < gpus]})
    return ClusterSnapshot.from_records("c", [NodeRecord(topology=topo)])


def share(gpus: float, memory_mb: int | None = None, ranks: int = 1) -> JobSpec:
    res: dict[str, object] = {"gpus": gpus}
    if memory_mb is not None:
        res["gpu_memory_mb"] = memory_mb
    return JobSpec.model_validate({"name": "s", "ranks": ranks, "resources": res})


def placed_gpus(snap: ClusterSnapshot, spec: JobSpec, **kw: object) -> tuple[ClusterSnapshot, list[int]]:
    got = place_gang(snap, spec, **kw).allocation  # type: ignore[arg-type]
    assert got is not None
    return snap.with_allocation(got), [g for r in got.ranks for g in r.gpus]


def test_a_share_whose_memory_does_not_fit_goes_to_another_gpu() -> None:
    snap, first = placed_gpus(cluster(), share(0.25, 40_000))
    # 0.25 of compute is left thrice over on that GPU, but 9,152 MiB of memory: the next share opens another GPU.
    snap, second = placed_gpus(snap, share(0.25, 20_000))
    assert second != first
    # A share asking no memory still joins the fullest shared GPU.
    _, third = placed_gpus(snap, share(0.25))
    assert third == first


def test_shares_fill_a_gpu_up_to_its_memory_not_past_it() -> None:
    snap, gpus = placed_gpus(cluster(gpus=1), share(0.1, 12 * 1024, ranks=4))
    assert gpus == [0, 0, 0, 0]  # 4 x 12 GiB = all 48 GiB
    more = place_gang(snap, share(0.1, 1))
    assert not more.placed


def test_the_rank_carries_its_gpu_memory_and_release_gives_it_back() -> None:
    snap = cluster(gpus=1)
    got = place_gang(snap, share(0.5, 30_000)).allocation
    assert got is not None and got.ranks[0].gpu_memory_mb == 30_000
    state = snap.thaw()
    state.apply(got)
    assert state.gpu_memory_left(0, 0) == GPU_MB - 30_000
    state.release(got)
    assert state.gpu_memory_left(0, 0) == GPU_MB and state.gpu_mem_used[0] is None
    assert "gpu_memory_mb" not in place_gang(snap, share(0.5)).allocation.ranks[0].model_dump()  # type: ignore[union-attr]


def test_apply_refuses_shares_that_pin_more_than_the_gpu_has_and_takes_nothing() -> None:
    state: ClusterState = cluster(gpus=1).thaw()
    rank = {"node": "l40s-0", "gpus": [0], "gpu_milli": 250, "gpu_memory_mb": 30_000}
    state.apply(Allocation(ranks=[RankPlacement(rank=0, **rank)]))  # type: ignore[arg-type]
    too_much = Allocation(ranks=[RankPlacement(rank=0, **rank)])  # type: ignore[arg-type]
    with pytest.raises(AllocationConflict, match="would pin 60000 MiB of its 49152 MiB"):
        state.apply(too_much)
    assert not state.fits(too_much)
    assert state.gpu_memory_left(0, 0) == GPU_MB - 30_000 and state.shares[0] == (250,)


def test_unknown_gpu_memory_limits_nothing() -> None:
    snap, first = placed_gpus(cluster(memory_mb=None), share(0.25, 40_000))
    _, second = placed_gpus(snap, share(0.25, 40_000))
    assert second == first


def test_the_fgd_policy_respects_gpu_memory_too() -> None:
    meter = FragMeter([(WorkloadShape(cpu=1000, milli=250, n_gpu=1), 1.0)])
    snap, first = placed_gpus(cluster(), share(0.25, 40_000), fgd=meter)
    _, second = placed_gpus(snap, share(0.25, 20_000), fgd=meter)
    assert second != first


def test_a_share_asking_more_memory_than_any_gpu_has_is_explained() -> None:
    res = place_gang(cluster(), share(0.25, GPU_MB + 1))
    assert not res.placed and res.explanation is not None
    assert res.explanation.constraint == "gpu_memory"
    assert res.explanation.message == "a share pins 49153 MiB of GPU memory; the largest GPU here has 49152 MiB"
