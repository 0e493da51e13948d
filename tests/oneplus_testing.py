"""Helpers shared by the tests that talk to real NATS and Redis (importable: tests/ is on sys.path)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence

import pytest
from _pytest.nodeid import NodeId
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError, NotFoundError
from oneplus_contracts import subjects

# Tests that kill or pause the platform's processes and give it seconds to recover: under `--dist loadgroup` they
# all go to one pytest-xdist worker, one after another, so that no two of them share the machine's cores at once.
FAULTS = pytest.mark.xdist_group("faults")
# Tests that stop a server the platform depends on (the container engine, a Redis primary) and time the recovery:
# one after another on one worker too, but beside the platform faults above (each worker has its own servers).
DEPENDENCY_FAULTS = pytest.mark.xdist_group("dependency-faults")


class Servers:
    def __init__(self, nats_url: str, redis_url: str) -> None:
        self.nats_url = nats_url
        self.redis_url = redis_url


def planned_workers(dist: str, tx: Sequence[str]) -> int:
    """How many pytest-xdist workers a run starts, from its `--dist` and `--tx` options (`-n N` sets N x popen)."""
    if dist == "no":
        return 1
    count = 0
    for spec in tx:
        times, star, _ = spec.partition("*")
        count += int(times) if star and times.isdigit() else 1
    return max(count, 1)


def parallel_refusal(workers: int, env: Mapping[str, str]) -> str | None:
    """Why this run must not go on, or None: parallel workers on shared NATS/Redis would wipe each other.

    Every test starts from empty streams, buckets and keys under OnePlus's fixed names (`wipe_bus`); each worker's
    own embedded servers keep that safe, shared servers named by NATS_URL / REDIS_URL do not."""
    shared = [name for name in ("NATS_URL", "REDIS_URL") if env.get(name)]
    if workers <= 1 or not shared:
        return None
    return (
        f"{' and '.join(shared)} {'is' if len(shared) == 1 else 'are'} set and {workers} pytest-xdist workers were "
        "asked for: the tests wipe OnePlus's streams, buckets and keys under fixed names, so workers sharing servers "
        "would wipe each other; run serially against shared servers (`uv run task test`, or -n 0), or unset "
        "NATS_URL and REDIS_URL so that each worker starts its own"
    )


def group_by_module(items: Sequence[pytest.Item]) -> None:
    """Tests without an xdist group get their module's: under `--dist loadgroup` a module then runs on one worker,
    so its module-scoped platform starts once, not once a worker, and tests that read what the module's earlier ones
    left (the intake's counters in test_queues_apply.py) see it."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = getattr(item, "module", None)  # its name: unique in a run, whatever the rootdir
            item.add_marker(pytest.mark.xdist_group(module.__name__ if module is not None else str(item.path)))


def put_groups_in_ids(items: Sequence[pytest.Item]) -> None:
    """What pytest-xdist 3.8's worker does for `--dist loadgroup`, done so that pytest 9.2 keeps it: the item's
    groups after an `@` in its id, which the scheduler reads. xdist sets `item._nodeid`, which pytest 9.2 no longer
    reads (the id comes from `item._id`): every group was ignored and the fault tests ran side by side."""
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers(
            "xdist_group")})  # fmt: skip
        if groups and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")  # no public setter exists


def give_items_their_own_ids(items: Sequence[pytest.Item]) -> None:
    """An item named `f[x]` whose node id lost the `[x]` gets it back; UsageError if two items still share an id.

    pytest 9.2 builds a function's node id from its original name and its callspec; schemathesis's per-operation
    items have no callspec (the operation is only in the name), so the fuzz test's 13 cases shared one id.
    pytest-xdist schedules by id: it ran one of the 13 and reported 12 results fewer than collected."""
    for item in items:
        base, bracket, params = item.name.partition("[")
        node_id = getattr(item, "_id", None)  # pytest's NodeId (9.2); no public setter exists
        if bracket and node_id is not None and node_id.params is None and item.nodeid.endswith("::" + base):
            item._id = node_id.with_params(params.removesuffix("]"))
    seen: dict[str, int] = {}
    for item in items:
        seen[item.nodeid] = seen.get(item.nodeid, 0) + 1
    shared = sorted(nodeid for nodeid, n in seen.items() if n > 1)
    if shared:
        raise pytest.UsageError(
            f"{len(shared)} test id(s) name more than one test, which pytest-xdist would run once: {', '.join(shared)}"
        )


async def wipe_bus(nc: Client) -> None:
    """Delete OnePlus's streams and KV buckets so a test starts from nothing."""
    js = nc.jetstream()
    for name in subjects.STREAMS:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    for bucket in (
        subjects.JOBS_KV,
        subjects.TOPOLOGY_KV,
        subjects.QUEUES_KV,
        subjects.SOLVER_STATE_KV,
        subjects.ADVANCE_RESERVATIONS_KV,
    ):
        with contextlib.suppress(NotFoundError, BucketNotFoundError):
            await js.delete_key_value(bucket)


async def until(check: Callable[[], object], timeout: float = 5.0) -> None:
    """Until `check()` is true (polled every 10 ms); AssertionError after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
