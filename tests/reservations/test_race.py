"""Several solver processes race for the same GPUs: never a GPU held twice, never a partial gang visible."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random

import redis.asyncio as aioredis
from oneplus_contracts import Allocation, RankPlacement
from oneplus_reservations import Conflict, ReservationStore, check_history

NODES = ("n0", "n1")
GPUS = 8
ROUNDS = 800
RACERS = 4

# Reads every GPU key and every gang in one atomic step, as an observer would at any instant.
SNAPSHOT = r"""
local out = {}
local gpus = redis.call('MGET', unpack(KEYS))
for i = 1, #KEYS do out[#out + 1] = KEYS[i]; out[#out + 1] = gpus[i] or '' end
local gangs = redis.call('SMEMBERS', ARGV[1])
local g = {}
for _, job in ipairs(gangs) do
  local h = redis.call('HMGET', ARGV[2] .. job, 'token', 'slots')
  if h[1] then g[#g + 1] = job .. '|' .. h[1] .. '#' .. h[2] end
end
return {out, g}
"""


def _racer(url: str, cluster: str, seed: int) -> tuple[int, int]:
    async def run() -> tuple[int, int]:
        store = ReservationStore(aioredis.Redis.from_url(url), cluster)
        rng = random.Random(seed)
        won = lost = 0
        for i in range(ROUNDS):
            ranks = []
            for r, node in enumerate(rng.sample(NODES, rng.choice([1, 2]))):
                ranks.append(
                    RankPlacement(rank=r, node=node, gpus=sorted(rng.sample(range(GPUS), rng.choice([1, 2, 4]))))
                )
            job = f"r{seed}-{i}"
            res = await store.reserve(job, Allocation(ranks=ranks))
            if isinstance(res, Conflict):
                lost += 1
                continue
            won += 1
            if rng.random() < 0.5:
                await asyncio.sleep(0)
            assert await store.release(job, res)
        await store.close()
        return won, lost

    return asyncio.run(run())


async def test_racing_solver_processes_never_double_hold_or_show_a_partial_gang(store: ReservationStore) -> None:
    url = store.r.connection_pool.connection_kwargs
    redis_url = f"redis://{url.get('host', '127.0.0.1')}:{url.get('port', 6379)}/{url.get('db', 0)}"
    ctx = mp.get_context("spawn")
    gpu_keys = [store.ks.gpu(n, g) for n in NODES for g in range(GPUS)]
    snap = store.r.register_script(SNAPSHOT)
    violations: list[str] = []
    observed = 0

    with ctx.Pool(RACERS) as pool:
        pending = pool.starmap_async(_racer, [(redis_url, store.ks.cluster, s) for s in range(RACERS)])
        while not pending.ready():
            flat, gangs = await snap(keys=gpu_keys, args=[store.ks.gangs, store.ks.gang("")])
            observed += 1
            held = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2) if flat[i + 1]}
            for g in gangs:
                head, _, slots = g.decode().partition("#")
                for slot in filter(None, slots.split(",")):
                    key = slot.rpartition("=")[0]
                    if held.get(key) != head:
                        violations.append(f"gang {head} partial: {key} held by {held.get(key)}")
            await asyncio.sleep(0.001)
        results = pending.get(timeout=120)

    won = sum(w for w, _ in results)
    lost = sum(x for _, x in results)
    assert won + lost == RACERS * ROUNDS
    assert won > 0 and lost > 0, "the racers must actually have contended"
    assert observed > 10
    assert violations == []
    hist = await store.history()
    assert sum(1 for e in hist if e.op == "reserve") == won
    assert check_history(hist) == []
    assert await store.held_slots() == {}
