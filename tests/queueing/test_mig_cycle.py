"""A MIG job goes through a scheduling cycle on a cluster whose only free GPUs are MIG instances."""

from __future__ import annotations

from pathlib import Path

from oneplus_contracts import JobSpec
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.config import default_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from oneplus_topology.cluster import synthetic_cluster
from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing

LISTING = Path(__file__).resolve().parents[2] / "data" / "topologies" / "dgx_a100_8gpu_mig_smi_L.txt"


def test_mig_ranks_are_placed_while_every_whole_gpu_is_taken() -> None:
    cluster = synthetic_cluster(1, preset="dgx_a100_8gpu_nv12_12nic")
    listing = parse_gpu_listing(LISTING.read_text(encoding="utf-8"))
    cluster.nodes[0] = apply_gpu_listing(cluster.nodes[0], listing)
    state = ClusterState.from_cluster(cluster)
    whole = JobSpec.model_validate({"name": "w", "resources": {"gpus": 6}})
    mig = JobSpec.model_validate({"name": "m", "ranks": 2, "resources": {"mig": "1g.10gb"}})
    late = JobSpec.model_validate({"name": "l", "ranks": 1, "resources": {"mig": "1g.10gb"}})
    pending = [PendingJob("w", whole, 0.0), PendingJob("m", mig, 1.0), PendingJob("l", late, 2.0)]
    d = schedule_cycle(10.0, state, pending, [], default_config(), UsageHistory())
    # Two 1g.10gb instances exist: the cycle serves one of the MIG jobs (its order), the other waits for instances.
    assert "w" in d.placements and sorted(d.placements["w"].ranks[0].gpus) == [2, 3, 4, 5, 6, 7]
    served = [j for j in ("m", "l") if j in d.placements]
    waiting = [j for j in ("m", "l") if j not in d.placements]
    assert len(served) == 1 and len(waiting) == 1
    assert all(len(r.mig) == 1 and not r.gpus for r in d.placements[served[0]].ranks)
    assert "free MIG 1g.10gb instances" in d.reasons[waiting[0]].message
