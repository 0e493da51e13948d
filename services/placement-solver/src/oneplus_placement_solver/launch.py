"""Turning a committed allocation into one launch command per node, and which nodes still wait for theirs (pure)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

from oneplus_contracts import Allocation, JobRecord, LaunchRanks

MASTER_PORT_BASE = 29500
# A launch_batch's body stays well under NATS' max_payload (1 MiB by default) whatever its jobs' specs weigh.
BATCH_BYTES = 256 * 1024


def launch_commands(
    rec: JobRecord, alloc: Allocation, token: int, addresses: Mapping[str, str] | None = None
) -> list[LaunchRanks]:
    """`addresses`: node → address where the registry knows one (the containers' /etc/hosts entries)."""
    nodes = alloc.nodes
    per_node = [sum(1 for r in alloc.ranks if r.node == n) for n in nodes]
    hosts = {n: a for n, a in (addresses or {}).items() if n in nodes and a}
    # A port per job keeps two gangs that share a master node from colliding.
    port = MASTER_PORT_BASE + zlib.crc32(rec.job_id.encode()) % 2000
    # Ranks on several trays of one NVLink domain share GPU memory through IMEX (the executor gives the channel).
    nvlink = alloc.domain == "nvlink" and len(nodes) > 1
    cmds: list[LaunchRanks] = []
    for node_rank, node in enumerate(nodes):
        cmds.append(
            LaunchRanks(
                command_id=f"launch-{rec.job_id}-{token}-{node}",
                job_id=rec.job_id,
                node=node,
                token=token,
                spec=rec.spec,
                ranks=[r for r in alloc.ranks if r.node == node],
                world_size=len(alloc.ranks),
                node_rank=node_rank,
                nodes=nodes,
                master_addr=nodes[0],
                master_port=port,
                ranks_per_node=per_node,
                hosts=hosts,
                resume_from_checkpoint_ts=rec.checkpoint_ts,
                resume_progress_s=rec.progress_s,
                multi_node_nvlink=nvlink,
            )
        )
    return cmds


def silent_nodes(rec: JobRecord, token: int, now: float, after_s: float, until_s: float) -> list[str]:
    """Nodes of the placed attempt `token` that have not reported on their ranks `after_s` after the placement.

    Only until `until_s` after it: within the stream's duplicate window a resent launch is dropped for a node that
    did get it, so resending can only reach a node that never did.
    """
    if rec.state not in ("PLACED", "STARTING", "RUNNING") or rec.token != token or rec.allocation is None:
        return []
    age = now - (rec.placed_ts if rec.placed_ts is not None else now)
    if not after_s <= age <= until_s:
        return []
    return [n for n in rec.allocation.nodes if n not in rec.nodes_started and n not in rec.nodes_done]


def chunked(cmds: Sequence[LaunchRanks], max_bytes: int = BATCH_BYTES) -> list[list[LaunchRanks]]:
    """One node's launches in runs of at most `max_bytes` of JSON each (a launch bigger alone gets a run of its own),
    their order kept: each run is one message."""
    runs: list[list[LaunchRanks]] = []
    size = 0
    for cmd in cmds:
        n = len(cmd.model_dump_json())
        if not runs or size + n > max_bytes:
            runs.append([])
            size = 0
        runs[-1].append(cmd)
        size += n
    return runs
