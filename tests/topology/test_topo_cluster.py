"""Cluster YAML loading (paths relative to the file, presets, overrides, errors) and synthetic clusters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from oneplus_topology.cluster import Fabric, load_cluster, synthetic_cluster
from oneplus_topology.errors import ClusterConfigError
from topology_cases import TOPOLOGIES

ISSUE_YAML = """\
name: lab
fabric: {nodes_per_leaf: 8, leaves_per_spine: 4, nic_gbps_per_gpu: 400, oversubscription: 2.0}
node_groups:
  - {prefix: h100, count: 16, topology: ../shared/data/topologies/h100_sxm_8gpu_nvswitch_nv18.txt}
  - {prefix: l40s, count: 8,  topology: ../shared/data/topologies/l40s_8gpu_pcie_node_sys.txt}
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    shared = tmp_path / "shared/data/topologies"
    shared.mkdir(parents=True)
    for name in ("h100_sxm_8gpu_nvswitch_nv18", "l40s_8gpu_pcie_node_sys"):
        shutil.copy(TOPOLOGIES / f"{name}.txt", shared)
    return write(tmp_path / "main/lab.yaml", ISSUE_YAML)


def test_the_issue_yaml_loads_with_paths_relative_to_the_file(lab: Path) -> None:
    c = load_cluster(lab)
    assert c.name == "lab"
    assert len(c.nodes) == 24 and c.total_gpus == 192
    assert [n.node for n in c.nodes[:2]] == ["h100-00", "h100-01"]
    assert c.nodes[-1].node == "l40s-07"
    assert {leaf: len(nodes) for leaf, nodes in c.nodes_by_leaf().items()} == {"leaf0": 8, "leaf1": 8, "leaf2": 8}
    assert c.leaf_of("h100-09") == "leaf1"
    assert c.leaf_of("l40s-00") == "leaf2"  # each group starts on its own leaf
    assert c.spine_of("l40s-07") == "spine0"
    assert c.node("l40s-03").gpu_model == "L40S"
    assert c.node("h100-03").nic_gbps_per_gpu == 50.0  # 400 Gb/s is 50 GB/s
    assert c.fabric.oversubscription == 2.0
    assert c.fabric.ring_gbps(crosses_spine=False) == pytest.approx(47.0)
    assert c.fabric.ring_gbps(crosses_spine=True) == pytest.approx(23.5)
    assert c.node("h100-00").gpus is c.node("h100-01").gpus  # one parsed layout shared by the group


def test_presets_spines_and_nvlink_domains(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.yaml",
        """
name: mixed
fabric: {nodes_per_leaf: 4, leaves_per_spine: 2}
node_groups:
  - {prefix: gb200, count: 36, topology: gb200_nvl72_compute_tray_4gpu, nodes_per_nvlink_domain: 18}
  - {prefix: dgx1, count: 3, topology: dgx1_v100, start: 1, cpus: 80, memory_mb: 524288, labels: {team: vision}}
""",
    )
    c = load_cluster(path)
    # Leaves hold whole NVLink domains: with 4 nodes a leaf and 18 a domain, each NVL72 rack gets a leaf of its own.
    assert {leaf: len(n) for leaf, n in c.nodes_by_leaf().items()} == {"leaf0": 18, "leaf1": 18, "leaf2": 3}
    assert c.spine_of("gb200-35") == "spine0" and c.spine_of("dgx1-01") == "spine1"
    assert {d: len(n) for d, n in c.nodes_by_nvlink_domain().items()} == {"gb200-nvl0": 18, "gb200-nvl1": 18}
    dgx = c.node("dgx1-03")
    assert (dgx.cpus, dgx.memory_mb, dgx.labels) == (80, 524288, {"team": "vision"})
    assert [n.node for n in c.nodes if n.node.startswith("dgx1")] == ["dgx1-01", "dgx1-02", "dgx1-03"]
    with pytest.raises(KeyError, match="no node 'dgx1-00'"):
        c.node("dgx1-00")


def test_labels_lldp_and_explicit_values_override_the_computed_place(tmp_path: Path) -> None:
    lldp = {"lldp": {"interface": {"ens1": {"chassis": {"tor-12": {"id": {"type": "mac", "value": "m"}}}}}}}
    write(tmp_path / "lldp/h100-01.json", json.dumps(lldp))
    path = write(
        tmp_path / "c.yaml",
        """
name: labelled
fabric: {label_levels: [example.com/block, example.com/rack, kubernetes.io/hostname]}
node_groups:
  - {prefix: h100, count: 4, topology: h100_sxm_8gpu_nvswitch_nv18}
nodes:
  h100-00: {labels: {example.com/block: b2, example.com/rack: r5, nvidia.com/gpu.clique: "uuid.4"}}
  h100-01: {lldp: lldp/h100-01.json}
  h100-02: {lldp: {lldp: {interface: {ens1: {chassis: {tor-13: {descr: x}}}}}}, spine: pod-9}
  h100-03: {leaf: manual-leaf}
""",
    )
    c = load_cluster(path)
    n0, n1, n2, n3 = c.nodes
    assert (n0.spine, n0.leaf, n0.nvlink_domain) == ("b2", "b2/r5", "uuid.4")
    assert n0.labels["example.com/rack"] == "r5"
    assert (n1.leaf, n1.spine) == ("tor-12", "spine0")
    assert (n2.leaf, n2.spine) == ("tor-13", "pod-9")
    assert n3.leaf == "manual-leaf"


BAD = {
    "typo in fabric": (
        "name: x\nfabric: {nodes_per_lef: 8}\nnode_groups: [{prefix: a, count: 1, topology: dgx1_v100}]",
        "fabric.nodes_per_lef: Extra inputs are not permitted",
    ),
    "zero count": ("name: x\nnode_groups: [{prefix: a, count: 0, topology: dgx1_v100}]", "node_groups.0.count"),
    "no groups": ("name: x\n", "node_groups: Field required"),
    "bad prefix": ("name: x\nnode_groups: [{prefix: A_B, count: 1, topology: dgx1_v100}]", "node_groups.0.prefix"),
    "unknown topology": (
        "name: x\nnode_groups: [{prefix: a, count: 1, topology: nope.txt}]",
        "node_groups.0.topology: 'nope.txt' is neither a preset",
    ),
    "not a mapping": ("- a\n- b\n", "expected a mapping"),
    "not yaml": ("name: [unclosed\n", "not valid YAML"),
    "unknown node": (
        "name: x\nnode_groups: [{prefix: a, count: 1, topology: dgx1_v100}]\nnodes: {b-00: {leaf: l}}",
        "nodes.b-00: no such node",
    ),
    "missing lldp file": (
        "name: x\nnode_groups: [{prefix: a, count: 1, topology: dgx1_v100}]\nnodes: {a-00: {lldp: gone.json}}",
        "nodes.a-00.lldp: no file",
    ),
    "bad lldp": (
        "name: x\nnode_groups: [{prefix: a, count: 1, topology: dgx1_v100}]\nnodes: {a-00: {lldp: {x: 1}}}",
        "nodes.a-00.lldp: LLDP data must be",
    ),
    "oversubscription below 1": (
        "name: x\nfabric: {oversubscription: 0.5}\nnode_groups: [{prefix: a, count: 1, topology: dgx1_v100}]",
        "fabric.oversubscription",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_yaml_names_the_file_and_key(tmp_path: Path, case: str) -> None:
    text, words = BAD[case]
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ClusterConfigError) as e:
        load_cluster(path)
    assert str(e.value).startswith(str(path))
    assert words in str(e.value)


def test_a_broken_topology_file_names_key_and_line(tmp_path: Path) -> None:
    write(tmp_path / "broken.txt", "\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV2\t X \n")
    path = write(tmp_path / "c.yaml", "name: x\nnode_groups: [{prefix: a, count: 1, topology: broken.txt}]\n")
    with pytest.raises(ClusterConfigError, match=r"node_groups\.0\.topology: .*broken\.txt: line 3: "):
        load_cluster(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match="cannot read"):
        load_cluster(tmp_path / "absent.yaml")


@pytest.mark.parametrize("n", [1024, 4096])
def test_synthetic_clusters_have_the_asked_shape(n: int) -> None:
    c = synthetic_cluster(n)  # its build time is a figure of `task bench:solver`, not an assertion
    assert len(c.nodes) == n and c.total_gpus == 8 * n
    assert len(c.nodes_by_leaf()) == n // 8
    assert len(c.nodes_by_spine()) == n // 32
    assert c.nodes[0].node == f"node-{0:0{len(str(n - 1))}d}"
    assert c.nodes[-1].source == "synthetic"
    assert c.nodes[5].gpus is c.nodes[6].gpus


def test_synthetic_cluster_options_and_errors() -> None:
    c = synthetic_cluster(
        72,
        preset="gb200_nvl72_compute_tray_4gpu",
        nodes_per_leaf=18,
        leaves_per_spine=2,
        nodes_per_nvlink_domain=18,
        nic_gbps_per_gpu=800,
        oversubscription=1.5,
        prefix="tray",
    )
    assert len(c.nodes_by_nvlink_domain()) == 4
    assert c.fabric == Fabric(nodes_per_leaf=18, leaves_per_spine=2, nic_gbps_per_gpu=800, oversubscription=1.5)
    assert c.nodes[0].nic_gbps_per_gpu == 100.0
    assert c.spine_of("tray-71") == "spine1"
    with pytest.raises(ValueError, match="at least 1"):
        synthetic_cluster(0)
    with pytest.raises(KeyError, match="unknown topology preset"):
        synthetic_cluster(2, preset="dgx9000")


def test_a_site_names_its_levels_bottom_up_and_nodes_get_their_domain_at_each(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.yaml",
        """
name: racks
fabric:
  nodes_per_leaf: 4
  levels: [rack, leaf, spine, zone]
  level_labels: {zone: topology.kubernetes.io/zone}
node_groups:
  - {prefix: h100, count: 8, topology: h100_sxm_8gpu_nvswitch_nv18, nodes_per_level: {rack: 2},
     labels: {topology.kubernetes.io/zone: z1}}
nodes:
  h100-07: {levels: {rack: spare}, labels: {topology.kubernetes.io/zone: z2}}
""",
    )
    c = load_cluster(path)
    assert c.node("h100-00").levels == {"rack": "h100-rack0", "leaf": "leaf0", "spine": "spine0", "zone": "z1"}
    assert c.node("h100-05").levels["rack"] == "h100-rack2"
    assert c.node("h100-07").levels == {"rack": "spare", "leaf": "leaf1", "spine": "spine0", "zone": "z2"}


def test_kueue_label_levels_above_leaf_and_spine_become_levels_of_their_own(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.yaml",
        """
name: kueue
fabric:
  label_levels:
    - topology.kubernetes.io/zone
    - cloud.provider.com/topology-block
    - cloud.provider.com/topology-rack
    - kubernetes.io/hostname
node_groups:
  - prefix: h100
    count: 2
    topology: h100_sxm_8gpu_nvswitch_nv18
    labels:
      topology.kubernetes.io/zone: z1
      cloud.provider.com/topology-block: b1
      cloud.provider.com/topology-rack: r1
""",
    )
    n = load_cluster(path).node("h100-00")
    assert (n.leaf, n.spine) == ("b1/r1", "b1")
    assert n.levels == {"leaf": "b1/r1", "spine": "b1", "zone": "z1"}


@pytest.mark.parametrize(
    ("fabric", "group", "message"),
    [
        ("{levels: [rack, node]}", "", "levels: 'node' is implicit"),
        ("{levels: [rack], level_labels: {zone: z}}", "", "level_labels: 'zone' is not one of levels"),
        ("{levels: [rack]}", ", nodes_per_level: {row: 2}", "node_groups.0: level 'row' is not one of fabric.levels"),
    ],
)
def test_levels_a_site_does_not_define_are_refused(tmp_path: Path, fabric: str, group: str, message: str) -> None:
    path = write(
        tmp_path / "c.yaml",
        f"name: x\nfabric: {fabric}\nnode_groups: [{{prefix: a, count: 2, topology: dgx1_v100{group}}}]\n",
    )
    with pytest.raises(ClusterConfigError, match=message):
        load_cluster(path)
