"""Capacity indexes kept from one cycle to the next, as the live solver and the simulator keep them: each cycle's
working copy is recounted on the nodes whose change stamps differ from the last copy's, and every index then equals
one counted afresh on that copy."""

from __future__ import annotations

import random

from oneplus_contracts import Allocation, JobSpec
from oneplus_placement.capacity import CapacityIndex, CapacityIndexes
from oneplus_placement.fitters import fitter_for
from oneplus_placement.greedy import place_gang
from oneplus_placement.request import GangRequest
from oneplus_placement.snapshot import ClusterState
from oneplus_topology.cluster import synthetic_cluster

SHAPES = [
    JobSpec(name=f"g{gpus}x{ranks}", ranks=ranks, resources={"gpus": gpus})  # type: ignore[arg-type]
    for gpus, ranks in ((1, 1), (2, 1), (4, 2), (8, 1), (8, 3))
]


def assert_counted_afresh(indexes: CapacityIndexes, work: ClusterState) -> None:
    for spec in SHAPES:
        fitter = fitter_for(work, GangRequest.of(spec))
        kept, fresh = indexes.index(fitter, fitter.req), CapacityIndex(fitter)
        assert (kept.caps, kept.leaf_caps, kept.classes) == (fresh.caps, fresh.leaf_caps, fresh.classes), spec.name


def test_indexes_kept_across_cycles_equal_a_fresh_count_whatever_changed_between() -> None:
    live = ClusterState.from_cluster(synthetic_cluster(48, nodes_per_leaf=8))
    indexes = CapacityIndexes()
    rng = random.Random(7)
    held: list[Allocation] = []
    for cycle in range(40):
        work = live.snapshot().thaw()  # the cycle's working copy (schedule_cycle's `working_copy`)
        assert_counted_afresh(indexes, work)
        # The cycle places gangs on its copy, keeping the indexes current (Capacity.apply); the live state takes
        # them when they are bound, and meanwhile ends others, loses and regains nodes, blocks GPUs.
        for _ in range(rng.randint(0, 4)):
            got = place_gang(work, rng.choice(SHAPES), job_id=f"c{cycle}", seed=cycle, indexes=indexes).allocation
            if got is None:
                continue
            work.apply(got)
            indexes.touched((work.layout.index(n) for n in got.nodes), work)
            if rng.random() < 0.8:  # bound; the rest lost to a conflict and decided again next cycle
                live.apply(got)
                held.append(got)
        assert_counted_afresh(indexes, work)
        for _ in range(rng.randint(0, 3)):
            if held:
                live.release(held.pop(rng.randrange(len(held))))
        node = live.layout.slots[rng.randrange(len(live.layout.slots))].name
        if rng.random() < 0.2:
            live.set_schedulable(node, rng.random() < 0.5)
        if rng.random() < 0.2:
            live.block(node, [rng.randrange(8)])


def test_a_copy_holds_its_lineages_stamps_and_a_change_on_either_side_gets_a_new_one() -> None:
    live = ClusterState.from_cluster(synthetic_cluster(4, nodes_per_leaf=4))
    copy = live.snapshot().thaw()
    assert copy.stamps == live.stamps
    copy.block(live.layout.slots[1].name, [0])
    live.block(live.layout.slots[1].name, [0])  # the same change, made apart: not known to be the same
    assert [i for i, (a, b) in enumerate(zip(copy.stamps, live.stamps, strict=True)) if a != b] == [1]
