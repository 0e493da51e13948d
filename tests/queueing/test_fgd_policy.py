"""FGD as a live placement policy, chosen per queue: the node where the fragmentation expected for the cycle's
workload mix grows least, where best fit would take the node with the fewest GPUs left.

Two 8-GPU nodes: node-00 has 3 GPUs free, node-01 has 2; the jobs around are mostly 2-GPU gangs. A 1-GPU job on
node-01 would leave one GPU no 2-GPU gang can use (FGD: +714 milli-GPUs of expected fragmentation); on node-00 it
leaves two (no growth). Best fit takes node-01; FGD takes node-00.
"""

from __future__ import annotations

import pytest
from oneplus_placement.fgd import FragMeter, WorkloadShape
from oneplus_placement.greedy import place_gang
from oneplus_queueing.capacity import workload_meter
from oneplus_queueing.config import QueueConfigError, default_config, load_queue_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import PendingJob
from queueing_world import World, spec


def world() -> World:
    w = World(n_nodes=2, nodes_per_leaf=2)
    for name, node, gpus in (("a", 0, [0, 1]), ("b", 0, [2, 3]), ("c", 0, [4])):
        w.run(name, [(node, gpus)], started=0)
    for name, gpus in (("d", [0, 1]), ("e", [2, 3]), ("f", [4, 5])):
        w.run(name, [(1, gpus)], started=0)
    return w


ONE = PendingJob("one", spec("one", 1), 10.0)


def test_fgd_takes_the_node_where_fragmentation_grows_least_and_best_fit_the_fullest() -> None:
    w = world()
    pairs = FragMeter([(WorkloadShape(0, 1000, 2), 1.0)])
    assert place_gang(w.state, ONE.spec, fgd=pairs).allocation.ranks[0].node == "node-00"  # type: ignore[union-attr]
    assert place_gang(w.state, ONE.spec).allocation.ranks[0].node == "node-01"  # type: ignore[union-attr]


def test_a_queue_chooses_fgd_in_the_queue_config_and_the_mix_comes_from_the_cycles_jobs() -> None:
    w = world()
    running = list(w.running.values())
    best_fit = schedule_cycle(100.0, w.state, [ONE], running, default_config(), UsageHistory())
    assert best_fit.placements["one"].ranks[0].node == "node-01"
    fgd = load_queue_config("queues: [{name: default, placement: fgd}]\n")
    d = schedule_cycle(100.0, w.state, [ONE], running, fgd, UsageHistory())
    assert d.placements["one"].ranks[0].node == "node-00"
    with pytest.raises(QueueConfigError, match="placement"):
        load_queue_config("queues: [{name: default, placement: first-fit}]\n")


def test_fgd_puts_a_share_on_the_gpu_it_fills_rather_than_opening_a_whole_one() -> None:
    w = World(n_nodes=1, nodes_per_leaf=1)
    w.run("half", [(0, [0])], started=0)  # GPU 0 busy; a share of GPU 1 comes next
    first = place_gang(w.state, spec("s1", 0.5), fgd=FragMeter([(WorkloadShape(0, 500, 1), 1.0)]))
    assert first.allocation is not None
    w.state.apply(first.allocation)
    gpu = first.allocation.ranks[0].gpus[0]
    second = place_gang(w.state, spec("s2", 0.5), fgd=FragMeter([(WorkloadShape(0, 500, 1), 1.0)]))
    assert second.allocation is not None and second.allocation.ranks[0].gpus == [gpu]


def test_fgd_keeps_leaves_filled_only_when_the_mix_holds_gangs_of_several_ranks() -> None:
    # Two leaves of two nodes; leaf 1 is busier (node-02 runs a job). Node-00 and node-03 are each half used, so
    # FGD scores them alike and neither is untouched: leaf fill decides only for a mix with multi-rank gangs.
    w = World(n_nodes=4, nodes_per_leaf=2)
    w.run("x", [(0, [0, 1, 2, 3])], started=0)
    w.run("y", [(3, [0, 1, 2, 3])], started=0)
    w.run("z", [(2, [0, 1, 2, 3, 4, 5])], started=0)
    single = workload_meter([spec("a", 1), spec("b", 2)])
    gangs = workload_meter([spec("a", 1), spec("b", 2, ranks=2)])  # the same shapes, as a gang
    assert not single.multi_rank and gangs.multi_rank
    picked = {
        seed: place_gang(w.state, ONE.spec, seed=seed, fgd=gangs).allocation.ranks[0].node  # type: ignore[union-attr]
        for seed in range(6)
    }
    assert set(picked.values()) == {"node-03"}, picked  # the fuller leaf, whatever the node order
    spread = {
        place_gang(w.state, ONE.spec, seed=seed, fgd=single).allocation.ranks[0].node  # type: ignore[union-attr]
        for seed in range(6)
    }
    assert spread == {"node-00", "node-03"}  # the seeded node order alone


def test_the_cycles_mix_carries_the_memory_its_jobs_ask_a_rank() -> None:
    small, big = spec("a", 1), spec("b", 1)
    big = big.model_copy(update={"resources": big.resources.model_copy(update={"memory_mb": 65_536})})
    meter = workload_meter([small, big, spec("c", 2)])
    shapes = [shape for shape, _ in meter.typical]
    one_gpu = shapes.index(WorkloadShape(int(small.resources.cpus * 1000), 1000, 1))
    assert meter.memory is not None
    assert meter.memory[one_gpu] == sorted([small.resources.memory_mb, 65_536])
