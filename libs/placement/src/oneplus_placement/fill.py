"""A seeded random fill: the fragmented cluster benchmarks and `oneplus place --fill` decide on."""

from __future__ import annotations

import random

from .shape import bits
from .snapshot import ClusterSnapshot

_FILL_SIZES = (1, 1, 1, 1, 2, 2, 4, 8)


def seeded_fill(snapshot: ClusterSnapshot, seed: int, pct: float) -> ClusterSnapshot:
    """Hold random small pieces (1-8 GPUs on random GPUs of random nodes) until `pct`% of usable GPUs are held.

    The same seed and snapshot always give the same fill; CPU and memory are taken in proportion.
    """
    if not 0 <= pct <= 100:
        raise ValueError(f"fill percentage must be between 0 and 100, got {pct}")
    rng = random.Random(seed)
    state = snapshot.thaw()
    usable = state.usable_gpus()
    target = round(usable * pct / 100)
    held = usable - state.total_free_gpus()
    open_nodes = [i for i in range(len(state.free)) if state.free_count[i]]
    while held < target and open_nodes:
        k = rng.randrange(len(open_nodes))
        i = open_nodes[k]
        slot = state.slots[i]
        free_pos = list(bits(state.free[i]))
        size = min(rng.choice(_FILL_SIZES), len(free_pos), target - held)
        mask = 0
        for p in rng.sample(free_pos, size):
            mask |= 1 << p
        frac = size / slot.shape.n
        state.whole[i] |= mask
        state.cpu_used[i] = min(slot.cpus, state.cpu_used[i] + slot.cpus * frac / 2)
        state.mem_used[i] = min(slot.memory_mb, state.mem_used[i] + int(slot.memory_mb * frac / 2))
        state._refresh(i)
        held += size
        if not state.free_count[i]:
            open_nodes[k] = open_nodes[-1]
            open_nodes.pop()
    return state.snapshot()
