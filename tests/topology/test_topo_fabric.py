"""Leaf, spine and NVLink domain from node labels and from LLDP neighbour data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from oneplus_topology.fabric import leaf_from_lldp, nvlink_domain_of, place_from_labels
from topology_cases import parse_file


def test_well_known_labels_name_leaf_spine_and_clique() -> None:
    place = place_from_labels(
        {
            "kubernetes.io/hostname": "gpu-17",
            "network.topology.nvidia.com/leaf": "sw-leaf-3",
            "network.topology.nvidia.com/spine": "sw-spine-1",
            "nvidia.com/gpu.clique": "6ba7b810-9dad-11d1-80b4-00c04fd430c8.7",
        }
    )
    assert place.leaf == "sw-spine-1/sw-leaf-3"
    assert place.spine == "sw-spine-1"
    assert place.nvlink_domain == "6ba7b810-9dad-11d1-80b4-00c04fd430c8.7"


def test_kueue_style_block_and_rack_labels() -> None:
    labels = {"cloud.provider.com/topology-block": "b1", "cloud.provider.com/topology-rack": "r2"}
    place = place_from_labels(labels)
    assert (place.spine, place.leaf) == ("b1", "b1/r2")
    levels = ["example.com/block", "example.com/rack", "kubernetes.io/hostname"]
    custom = place_from_labels(
        {"example.com/block": "B", "example.com/rack": "R", "kubernetes.io/hostname": "h"}, levels
    )
    assert (custom.spine, custom.leaf) == ("B", "B/R")
    assert place_from_labels({"example.com/rack": "R"}, ["example.com/rack"]).leaf == "R"


def test_zone_is_only_a_spine_fallback_and_no_labels_mean_nothing() -> None:
    assert place_from_labels({"topology.kubernetes.io/zone": "z1"}).spine == "z1"
    both = place_from_labels({"topology.kubernetes.io/zone": "z1", "cloud.google.com/gce-topology-block": "blk"})
    assert both.spine == "blk"
    empty = place_from_labels({"kubernetes.io/hostname": "h"})
    assert (empty.leaf, empty.spine, empty.nvlink_domain) == (None, None, None)


def _port(chassis: str | None, port: str = "swp1") -> dict[str, Any]:
    body: dict[str, Any] = {"via": "LLDP", "port": {"id": {"type": "ifname", "value": port}}}
    if chassis is None:
        body["chassis"] = {"id": {"type": "mac", "value": "aa:bb:cc:dd:ee:ff"}}
    else:
        body["chassis"] = {chassis: {"id": {"type": "mac", "value": "00:11:22:33:44:55"}, "descr": "Cumulus"}}
    return body


def test_lldpctl_json_one_port() -> None:
    data = {"lldp": {"interface": {"eth0": _port("leaf-07")}}}
    assert leaf_from_lldp(data) == "leaf-07"
    assert leaf_from_lldp(json.dumps(data)) == "leaf-07"


def test_lldpctl_json_several_ports_join_distinct_leaves_and_filter() -> None:
    data = {"lldp": {"interface": [{"ens1": _port("leaf-a")}, {"ens2": _port("leaf-b")}, {"eno1": _port("mgmt-sw")}]}}
    assert leaf_from_lldp(data) == "leaf-a+leaf-b+mgmt-sw"
    assert leaf_from_lldp(data, interfaces=["ens1", "ens2"]) == "leaf-a+leaf-b"
    same = {"lldp": {"interface": [{"ens1": _port("leaf-a")}, {"ens2": _port("leaf-a", "swp2")}]}}
    assert leaf_from_lldp(same) == "leaf-a"


def test_lldpctl_json0_and_unnamed_chassis() -> None:
    json0 = {
        "lldp": [
            {
                "interface": [
                    {
                        "name": "eth0",
                        "via": "LLDP",
                        "chassis": [{"id": [{"type": "mac", "value": "x"}], "name": [{"value": "leaf-9"}]}],
                    }
                ]
            }
        ]
    }
    assert leaf_from_lldp(json0) == "leaf-9"
    assert leaf_from_lldp({"lldp": {"interface": {"eth0": _port(None)}}}) == "aa:bb:cc:dd:ee:ff"
    assert leaf_from_lldp({"lldp": {}}) is None


@pytest.mark.parametrize(("data", "words"), [("{not json", "not JSON"), ({"interfaces": {}}, "'lldp' key")])
def test_bad_lldp_data_is_refused(data: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        leaf_from_lldp(data)


def test_nvlink_domain_from_gpu_clique_ids() -> None:
    tray = parse_file("gb200_nvl72_compute_tray_4gpu")
    assert nvlink_domain_of(tray) is None
    same = tray.model_copy(
        update={"gpus": [g.model_copy(update={"cluster_uuid": "u", "clique_id": 3}) for g in tray.gpus]}
    )
    assert nvlink_domain_of(same) == "u.3"
    mixed = same.model_copy(update={"gpus": [*same.gpus[:3], same.gpus[3].model_copy(update={"clique_id": 4})]})
    assert nvlink_domain_of(mixed) is None
