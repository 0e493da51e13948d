"""Only a weaker board is free: the cycle waits for a strong one when that is expected to finish the job sooner."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec, RankResources
from oneplus_placement.bandwidth import slowdown
from oneplus_queueing.boards import COMM_FRACTION_ONE_NODE
from oneplus_queueing.config import QueueConfigError, default_config, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from oneplus_topology import load_preset
from oneplus_topology.cluster import Cluster, Fabric
from queueing_world import World

H100, L40S = "h100_sxm_8gpu_nvswitch_nv18", "l40s_8gpu_pcie_node_sys"
NOW = 1000.0


def mixed_world() -> World:
    """n000: an 8-GPU H100 NVSwitch board; n001: an 8-GPU L40S board on PCIe (its 4-GPU ring crosses SYS)."""
    nodes = [
        load_preset(preset).model_copy(update={"node": f"n{i:03d}", "leaf": "leaf0", "spine": "spine0"})
        for i, preset in enumerate((H100, L40S))
    ]
    return World(cluster=Cluster(name="mixed", fabric=Fabric(nodes_per_leaf=2, leaves_per_spine=1), nodes=nodes))


def four_gpus(limit_s: int | None = 3600, models: list[str] | None = None) -> PendingJob:
    spec = JobSpec(name="train", resources=RankResources(gpus=4, gpu_models=models), time_limit_s=limit_s)
    return PendingJob("train", spec, NOW - 10)


WAITING = load_queue_config("boards: {wait_for_faster: true}\n")


def cycle(w: World, job: PendingJob):  # type: ignore[no-untyped-def]
    return schedule_cycle(NOW, w.state, [job], list(w.running.values()), WAITING, UsageHistory())


def test_it_waits_for_the_h100_board_that_frees_soon_and_says_why() -> None:
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW - 500, time_limit_s=800)  # the H100 board frees in 300 s
    d = cycle(w, four_gpus())
    assert "train" not in d.placements
    why = d.reasons["train"]
    assert why.code == "Topology"
    assert why.message.startswith("waits for a faster board: expected to finish in 1.1 h on n000")
    assert "now on n001" in why.message
    assert d.reservation is None, "the weaker board is not kept free for a job that will not use it"


def test_the_weaker_board_stays_open_to_the_jobs_behind_the_one_that_waits() -> None:
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW - 500, time_limit_s=800)
    behind = PendingJob("behind", JobSpec(name="behind", resources=RankResources(gpus=4)), NOW - 5)
    d = schedule_cycle(NOW, w.state, [four_gpus(), behind], list(w.running.values()), WAITING, UsageHistory())
    assert "train" not in d.placements
    assert d.placements["behind"].ranks[0].node == "n001"


def test_it_runs_now_on_the_slower_board_when_the_strong_one_is_busy_for_long() -> None:
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW, time_limit_s=100_000)
    d = cycle(w, four_gpus())
    assert d.placements["train"].ranks[0].node == "n001"


@pytest.mark.parametrize(
    "kw",
    [
        {"limit_s": None},  # no time limit: nothing to weigh
        {"models": ["L40S"]},  # it can only ever run on the L40S board
    ],
)
def test_nothing_to_weigh_runs_now(kw: dict[str, object]) -> None:
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW - 500, time_limit_s=800)
    d = cycle(w, four_gpus(**kw))  # type: ignore[arg-type]
    assert d.placements["train"].ranks[0].node == "n001"


def test_a_running_job_without_a_time_limit_never_frees_its_board() -> None:
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW - 500)
    assert cycle(w, four_gpus()).placements["train"].ranks[0].node == "n001"


def test_the_h100_board_free_now_is_simply_taken() -> None:
    d = cycle(mixed_world(), four_gpus())
    assert d.placements["train"].ranks[0].node == "n000"


def test_the_weighing_is_the_simulators_slowdown() -> None:
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW, time_limit_s=100_000)
    score = cycle(w, four_gpus()).placements["train"].score
    best, ring = score["ideal_ring_gbps"], score["ring_gbps"]
    assert ring < best / 2, "the L40S board is the weaker one"
    expected_now_h = 3600 * slowdown(COMM_FRACTION_ONE_NODE, best, ring) / 3600
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW - 500, time_limit_s=800)
    why = cycle(w, four_gpus()).reasons["train"].message
    assert f"against {expected_now_h:.1f} h now on n001 ({ring:g} GB/s ring)" in why
    assert f"on n000 ({best:g} GB/s ring)" in why


def test_the_waiting_is_on_by_default_and_can_be_turned_off() -> None:
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW - 500, time_limit_s=800)
    running = list(w.running.values())
    d = schedule_cycle(NOW, w.state, [four_gpus()], running, default_config(), UsageHistory())
    assert "train" not in d.placements and d.reasons["train"].message.startswith("waits for a faster board")
    off = load_queue_config("boards: {wait_for_faster: false}\n")
    d = schedule_cycle(NOW, w.state, [four_gpus()], running, off, UsageHistory())
    assert d.placements["train"].ranks[0].node == "n001"


def test_a_comm_fraction_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(QueueConfigError, match="comm_fraction"):
        load_queue_config("boards: {comm_fraction: 1.5}\n")


def test_jobs_that_wait_for_the_same_board_count_each_others_claims() -> None:
    """The H100 board frees 8 GPUs in 300 s: two 4-GPU jobs can have them then; the third can only expect its turn
    once one of those two is done (300 s + 1 h), and says so."""
    w = mixed_world()
    w.run("busy", [(0, range(8))], started=NOW - 500, time_limit_s=800)
    jobs = [
        PendingJob(f"t{i}", JobSpec(name=f"t{i}", resources=RankResources(gpus=4), time_limit_s=3600), NOW - 10 + i)
        for i in range(3)
    ]
    d = schedule_cycle(NOW, w.state, jobs, list(w.running.values()), WAITING, UsageHistory())
    assert not d.placements
    assert "finish in 1.1 h on n000" in d.reasons["t0"].message
    assert "finish in 1.1 h on n000" in d.reasons["t1"].message
    assert "finish in 2.1 h on n000" in d.reasons["t2"].message


def test_the_queue_config_can_stop_one_gpu_jobs_from_taking_the_weakest_board() -> None:
    one = PendingJob("one", JobSpec(name="one", resources=RankResources(gpus=1)), NOW - 5)
    d = schedule_cycle(NOW, mixed_world().state, [one], [], default_config(), UsageHistory())
    assert d.placements["one"].ranks[0].node == "n001", "by default the L40S board, keeping the H100 free"
    off = load_queue_config("boards: {keep_strong_boards: false}\n")
    d = schedule_cycle(NOW, mixed_world().state, [one], [], off, UsageHistory())
    assert d.placements["one"].ranks[0].node == "n000", "best fit alone: the first node"
