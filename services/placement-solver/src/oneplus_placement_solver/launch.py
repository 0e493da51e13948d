"""Turning a committed allocation into one launch command per node (pure)."""

from __future__ import annotations

import zlib

from oneplus_contracts import Allocation, JobRecord, LaunchRanks

MASTER_PORT_BASE = 29500


def launch_commands(rec: JobRecord, alloc: Allocation, token: int) -> list[LaunchRanks]:
    nodes = alloc.nodes
    # A port per job keeps two gangs that share a master node from colliding.
    port = MASTER_PORT_BASE + zlib.crc32(rec.job_id.encode()) % 2000
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
                resume_from_checkpoint_ts=rec.checkpoint_ts,
                resume_progress_s=rec.progress_s,
            )
        )
    return cmds
