"""GPU shares are isolated: under MPS on nodes that run it, time-sliced only where the queue allows it."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec, MpsDaemon, NodeRecord
from oneplus_placement import ClusterSnapshot
from oneplus_placement.greedy import place_gang
from oneplus_topology.presets import load_preset
from pydantic import ValidationError


def cluster(mps_nodes: tuple[str, ...]) -> ClusterSnapshot:
    records = []
    for name in ("l40s-0", "l40s-1"):
        topo = load_preset("l40s_8gpu_pcie_node_sys", name).model_copy(update={"leaf": "l0", "spine": "s0"})
        if name in mps_nodes:
            topo = topo.model_copy(update={"mps": MpsDaemon()})
        records.append(NodeRecord(topology=topo))
    return ClusterSnapshot.from_records("c", records)


def share(gpus: float = 0.5, **resources: object) -> JobSpec:
    return JobSpec.model_validate({"name": "s", "resources": {"gpus": gpus, **resources}})


def test_a_share_goes_only_to_a_node_that_runs_mps() -> None:
    snap = cluster(("l40s-1",))
    for seed in range(4):
        got = place_gang(snap, share(), seed=seed, shares_need_mps=True).allocation
        assert got is not None and [(r.node, r.sharing) for r in got.ranks] == [("l40s-1", "mps")]


def test_no_mps_node_leaves_a_share_waiting_unless_its_queue_time_slices() -> None:
    snap = cluster(())
    waiting = place_gang(snap, share(), shares_need_mps=True)
    assert not waiting.placed and waiting.explanation is not None and "mps" in waiting.explanation.message
    sliced = place_gang(snap, share(), shares_need_mps=False).allocation
    assert sliced is not None and sliced.ranks[0].sharing == "time-slice"
    # A CPU-only job carries the 0.001 share: nothing on a GPU to isolate, it runs anywhere.
    cpu_only = place_gang(snap, share(0.001), shares_need_mps=True).allocation
    assert cpu_only is not None and cpu_only.ranks[0].sharing is None


def test_whole_gpus_are_not_stamped() -> None:
    got = place_gang(cluster(()), JobSpec.model_validate({"name": "w", "resources": {"gpus": 2}}), shares_need_mps=True)
    assert got.allocation is not None and all(r.sharing is None for r in got.allocation.ranks)


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            {"gpus": 2, "gpu_memory_mb": 8192},
            "gpu_memory_mb=8192 is the memory of a GPU share: it needs gpus below 1, not gpus=2",
        ),
        ({"mig": "1g.10gb", "gpu_memory_mb": 100}, "not mig='1g.10gb'"),
    ],
)
def test_gpu_memory_belongs_to_a_share(resources: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JobSpec.model_validate({"name": "s", "resources": resources})
    assert share(0.25, gpu_memory_mb=8192).resources.gpu_memory_mb == 8192
