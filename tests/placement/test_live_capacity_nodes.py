"""The capacity model keeps one topology per board: a node record that comes again with the same board (a persisted
heartbeat, a status change) keeps the topology already held and does not rebuild the model; a new board does."""

from __future__ import annotations

from oneplus_contracts import NodeRecord
from oneplus_placement.live import LiveCapacity
from oneplus_topology.presets import load_preset


def parsed(rec: NodeRecord) -> NodeRecord:
    return NodeRecord.model_validate_json(rec.model_dump_json())  # as the topology watch delivers it


def test_a_record_with_the_same_board_keeps_the_topology_held_and_the_model() -> None:
    cap = LiveCapacity()
    first = parsed(NodeRecord(topology=load_preset("h100_sxm_8gpu_nvswitch_nv18", "n0"), last_heartbeat=1.0))
    assert cap.set_node(first) is True
    model = cap.state()
    again = parsed(first.model_copy(update={"last_heartbeat": 31.0}))
    assert again.topology is not first.topology
    assert cap.set_node(again) is False
    kept = cap.records["n0"]
    assert kept.last_heartbeat == 31.0 and kept.topology is first.topology
    assert cap.state() is model, "the same board does not rebuild the model"
    assert not kept.model_fields_set and not kept.topology.gpus[0].model_fields_set


def test_a_record_with_another_board_rebuilds_the_model() -> None:
    cap = LiveCapacity()
    cap.set_node(parsed(NodeRecord(topology=load_preset("h100_sxm_8gpu_nvswitch_nv18", "n0"))))
    model = cap.state()
    other = parsed(NodeRecord(topology=load_preset("dgx1_v100", "n0")))
    assert cap.set_node(other) is True
    assert cap.records["n0"].topology == other.topology
    assert cap.state() is not model
