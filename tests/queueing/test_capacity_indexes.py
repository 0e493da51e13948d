"""A cycle's working state keeps per-node capacities current across its trials (`Capacity.indexes`) instead of
computing every node again for each gang: its decisions must be exactly the ones computed from scratch, through
placements, releases, the backfill's moves and the victim search's trial releases."""

from __future__ import annotations

import random

from oneplus_contracts import Allocation, JobSpec, RankPlacement
from oneplus_placement.greedy import place_gang
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.capacity import Capacity
from oneplus_queueing.model import CycleStats
from oneplus_topology.cluster import synthetic_cluster
from queueing_world import spec

SHAPES = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (2, 3), (1, 5), (4, 4), (0.5, 1)]


def fresh(capacity: Capacity, s: JobSpec, seed: int) -> Allocation | None:
    """The decision with nothing kept between calls."""
    return place_gang(
        capacity.state,
        s,
        job_id="x",
        seed=seed,
        keep_strong_boards=capacity.keep_strong_boards,
        shares_need_mps=s.queue not in capacity.timeslice_queues,
    ).allocation


def test_kept_capacities_decide_as_a_fresh_computation_through_places_releases_and_trials() -> None:
    rng = random.Random(7)
    # Its nodes run no MPS: the shares' queue time-slices them (else no share would ever be placed here).
    state = ClusterState.from_cluster(synthetic_cluster(24, nodes_per_leaf=4))
    capacity = Capacity(state, CycleStats(), timeslice_queues=frozenset({"default"}))
    held: list[Allocation] = []
    compared = placed = 0
    for step in range(400):
        gpus, ranks = rng.choice(SHAPES)
        s = spec(f"j{step}", gpus, ranks)
        seed = rng.randrange(3)
        kept = capacity.place(s, f"j{step}", seed).allocation
        assert kept == fresh(capacity, s, seed), f"step {step}: {gpus} GPUs x {ranks}"
        compared += 1
        roll = rng.random()
        if kept is not None and roll < 0.6:
            capacity.apply(kept)
            held.append(kept)
            placed += 1
        elif held and roll < 0.85:
            capacity.release(held.pop(rng.randrange(len(held))))
        elif held:
            # The victim search's trial: some holders given back inside the block, taken again after it.
            trial = rng.sample(held, min(len(held), rng.randint(1, 3)))
            with capacity.released(trial):
                s2 = spec(f"t{step}", *rng.choice(SHAPES))
                assert capacity.place(s2, "t", 0).allocation == fresh(capacity, s2, 0)
            assert capacity.place(s, "again", seed).allocation == fresh(capacity, s, seed)
    assert placed > 50 and compared == 400


def test_the_backfill_moves_through_the_working_state_so_its_trials_see_the_releases() -> None:
    from oneplus_queueing.backfill import Release, _Prefix

    capacity = Capacity(ClusterState.from_cluster(synthetic_cluster(4, nodes_per_leaf=2)), CycleStats())
    whole: list[Allocation] = []
    for i in range(4):
        alloc = capacity.place(spec(f"w{i}", 8), f"w{i}", 0).allocation
        assert alloc is not None
        capacity.apply(alloc)
        whole.append(alloc)
    assert capacity.place(spec("big", 8, 2), "big", 0).allocation is None, "the cluster is full"
    timeline = _Prefix(capacity, [Release(float(i), f"w{i}", a) for i, a in enumerate(whole)])
    assert timeline.place(0, spec("big", 8, 2), "big", 0) is None
    got = timeline.place(2, spec("big", 8, 2), "big", 0)
    assert got is not None and set(got.nodes) <= {n for a in whole[:2] for n in a.nodes}
    assert timeline.place(1, spec("big", 8, 2), "big", 0) is None, "moving back takes the node again"


def test_an_allocation_over_trays_of_one_rack_is_in_that_nvlink_domain() -> None:
    racks = synthetic_cluster(
        36, "gb200_nvl72_compute_tray_4gpu", nodes_per_leaf=36, nodes_per_nvlink_domain=18, prefix="tray"
    )
    capacity = Capacity(ClusterState.from_cluster(racks), CycleStats())
    in_rack = Allocation(ranks=[RankPlacement(rank=r, node=f"tray-{18 + r:02d}", gpus=[0, 1, 2, 3]) for r in range(4)])
    assert capacity.alloc_domain(in_rack) == ("nvlink", "tray-nvl1")
    over = Allocation(ranks=[RankPlacement(rank=r, node=f"tray-{16 + r:02d}", gpus=[0]) for r in range(4)])
    assert capacity.alloc_domain(over) == ("leaf", "leaf0")
    assert list(capacity.domain_nodes(("nvlink", 1))) == list(range(18, 36))
