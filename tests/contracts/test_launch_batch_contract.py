"""`launch_batch`: one node's launches of one commit in one command message (issue 42, item 1)."""

from __future__ import annotations

import pytest
from oneplus_contracts import NODE_COMMAND_ADAPTER, JobSpec, LaunchBatch, LaunchRanks, RankPlacement, RankResources
from pydantic import ValidationError


def launch(job_id: str, node: str = "n0", token: int = 3, traceparent: str | None = None) -> LaunchRanks:
    return LaunchRanks(
        command_id=f"launch-{job_id}-{token}-{node}",
        job_id=job_id,
        node=node,
        token=token,
        spec=JobSpec(name=job_id, resources=RankResources(gpus=1)),
        ranks=[RankPlacement(rank=0, node=node, gpus=[0], cpus=1, memory_mb=64)],
        world_size=1,
        node_rank=0,
        nodes=[node],
        master_addr=node,
        traceparent=traceparent,
    )


TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_batch_round_trips_through_the_node_command_union_with_each_launch_whole() -> None:
    batch = LaunchBatch.of([launch("j-a", traceparent=TRACE), launch("j-b", token=7)])
    read = NODE_COMMAND_ADAPTER.validate_json(batch.model_dump_json())
    assert isinstance(read, LaunchBatch)
    assert read == batch
    assert [(c.job_id, c.token, c.traceparent) for c in read.launches] == [("j-a", 3, TRACE), ("j-b", 7, None)]


def test_the_batch_id_is_fixed_by_its_launches_so_a_resend_is_a_duplicate() -> None:
    a = LaunchBatch.of([launch("j-a"), launch("j-b")])
    again = LaunchBatch.of([launch("j-a"), launch("j-b")])
    assert a.command_id == again.command_id and a.command_id.startswith("launch-batch-n0-")
    assert LaunchBatch.of([launch("j-a"), launch("j-b", token=4)]).command_id != a.command_id  # another attempt
    assert LaunchBatch.of([launch("j-b"), launch("j-a")]).command_id != a.command_id
    # Read back, the id stays the one sent (not derived again from what was read).
    assert NODE_COMMAND_ADAPTER.validate_json(a.model_dump_json()).command_id == a.command_id


def test_a_batch_holds_one_nodes_launches_and_at_least_one() -> None:
    with pytest.raises(ValidationError, match="holds launches for n1"):
        LaunchBatch(node="n0", launches=[launch("j-a"), launch("j-b", node="n1")])
    with pytest.raises(ValidationError):
        LaunchBatch(node="n0", launches=[])


def test_a_single_launch_is_still_read_as_before() -> None:
    # The wire shape of a launch from a solver before batches (no `traceparent` field).
    wire = launch("j-old").model_dump_json(exclude={"traceparent"})
    read = NODE_COMMAND_ADAPTER.validate_json(wire)
    assert isinstance(read, LaunchRanks) and read.traceparent is None and read.job_id == "j-old"
