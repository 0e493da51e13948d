"""MIG-aware preemption: a preemptor asking a MIG profile evicts gangs that hold instances of that profile, never
whole-GPU gangs whose eviction frees nothing it can use."""

from __future__ import annotations

from pathlib import Path

from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_placement.mig import instances
from oneplus_queueing.model import PendingJob, RunningJob
from oneplus_queueing.victims import choose_victims
from oneplus_topology.cluster import synthetic_cluster
from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing
from queueing_world import World, unfloored

LISTING = Path(__file__).resolve().parents[2] / "data" / "topologies" / "dgx_a100_8gpu_mig_smi_L.txt"
NOW = 10_000.0


def _boss(ranks: int = 1) -> PendingJob:
    spec = JobSpec.model_validate({"name": "boss", "priority": 10, "ranks": ranks, "resources": {"mig": "3g.40gb"}})
    return PendingJob("boss", spec, 0.0)


def mig_world() -> World:
    """One DGX A100: GPU 0 as 3g.40gb + 2g.20gb + 2x 1g.10gb, GPU 1 as 2x 3g.40gb, GPUs 2-7 whole."""
    cluster = synthetic_cluster(1, preset="dgx_a100_8gpu_nv12_12nic")
    cluster.nodes[0] = apply_gpu_listing(cluster.nodes[0], parse_gpu_listing(LISTING.read_text(encoding="utf-8")))
    return World(cluster=cluster)


def run_mig(w: World, job_id: str, uuid: str, profile: str, checkpoint: float) -> RunningJob:
    s = JobSpec.model_validate({"name": job_id, "resources": {"mig": profile}})
    alloc = Allocation(ranks=[RankPlacement(rank=0, node=w.node(0), gpus=[], mig=[uuid])])
    w.state.apply(alloc)
    job = RunningJob(job_id, s, alloc, 0.0, checkpoint)
    w.running[job_id] = job
    return job


def loaded() -> World:
    """Six cheap whole-GPU gangs (checkpointed just now) and every MIG instance held, 3g.40gb ones with lost work."""
    w = mig_world()
    for g in range(2, 8):
        w.run(f"whole-{g}", [(0, [g])], started=0, checkpoint=NOW)
    lost = {0: 9_000.0, 1: 5_000.0, 2: 7_000.0}  # seconds since the last checkpoint of each 3g.40gb holder
    three = [m for _, m in instances(w.cluster.nodes[0], "3g.40gb")]
    for k, m in enumerate(three):
        run_mig(w, f"mig3-{k}", m.uuid, "3g.40gb", NOW - lost[k])
    for k, m in enumerate(m for _, m in instances(w.cluster.nodes[0]) if m.profile != "3g.40gb"):
        run_mig(w, f"small-{k}", m.uuid, m.profile, NOW)  # other profiles: cheap, and useless to a 3g.40gb rank
    return w


def test_a_mig_preemptor_evicts_the_cheapest_holder_of_its_profile() -> None:
    w = loaded()
    boss = _boss()
    choice = choose_victims(NOW, w.state, boss, list(w.running.values()), unfloored())
    assert choice is not None
    assert choice.victims == ("mig3-1",)  # 5,000 s lost: the cheapest 3g.40gb holder, no whole-GPU gang
    assert [r.mig for r in choice.nominated.ranks] == [list(w.running["mig3-1"].allocation.ranks[0].mig)]


def test_two_ranks_evict_the_two_cheapest_holders() -> None:
    w = loaded()
    choice = choose_victims(NOW, w.state, _boss(ranks=2), list(w.running.values()), unfloored())
    assert choice is not None
    assert sorted(choice.victims) == ["mig3-1", "mig3-2"]


def test_no_victim_when_no_gang_holds_the_profile() -> None:
    w = mig_world()
    for g in range(2, 8):
        w.run(f"whole-{g}", [(0, [g])], started=0, checkpoint=NOW)
    three = [m for _, m in instances(w.cluster.nodes[0], "3g.40gb")]
    for k, m in enumerate(three):  # held by a high-priority gang: not a victim
        s = JobSpec.model_validate({"name": f"keep-{k}", "priority": 100, "resources": {"mig": "3g.40gb"}})
        alloc = Allocation(ranks=[RankPlacement(rank=0, node=w.node(0), gpus=[], mig=[m.uuid])])
        w.state.apply(alloc)
        w.running[f"keep-{k}"] = RunningJob(f"keep-{k}", s, alloc, 0.0, None)
    boss = _boss()
    assert choose_victims(NOW, w.state, boss, list(w.running.values()), unfloored()) is None


def test_cheap_gangs_of_other_kinds_do_not_use_up_a_small_victim_budget() -> None:
    """Three victims per window: trying the nine cheaper gangs that hold no 3g.40gb instance first would exhaust it."""
    config = unfloored()
    config = config.model_copy(update={"preemption": config.preemption.model_copy(update={"rate_limit_gangs": 3})})
    w = loaded()
    choice = choose_victims(NOW, w.state, _boss(), list(w.running.values()), config)
    assert choice is not None and choice.victims == ("mig3-1",)


def test_the_exact_search_tries_only_sets_that_free_an_instance_of_the_profile() -> None:
    """Every subset tried: the 511 sets of cheaper, useless gangs would use up the trial limit before mig3-1 alone."""
    config = unfloored()
    config = config.model_copy(update={"preemption": config.preemption.model_copy(update={"exact_search_max": 16})})
    w = loaded()
    choice = choose_victims(NOW, w.state, _boss(), list(w.running.values()), config)
    assert choice is not None and choice.victims == ("mig3-1",)
