"""The cluster YAML examples in docs/topology.md load as documented."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from oneplus_topology.cluster import load_cluster
from topology_cases import REAL_FILES, REPO, TOPOLOGIES

EXAMPLES = re.findall(r"```yaml\n(.*?)```", (REPO / "docs/topology.md").read_text(encoding="utf-8"), re.DOTALL)


def test_the_docs_hold_yaml_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_docs_example_loads(tmp_path: Path, index: int) -> None:
    shared = tmp_path / "shared/data/topologies"
    shared.mkdir(parents=True)
    for name in REAL_FILES:
        shutil.copy(TOPOLOGIES / f"{name}.txt", shared)
    path = tmp_path / "main/cluster.yaml"
    path.parent.mkdir()
    path.write_text(EXAMPLES[index])
    cluster = load_cluster(path)
    assert cluster.nodes and all(n.leaf and n.spine for n in cluster.nodes)


def test_the_full_example_does_what_its_comments_say(tmp_path: Path) -> None:
    path = tmp_path / "research.yaml"
    path.write_text(next(e for e in EXAMPLES if "research" in e))
    c = load_cluster(path)
    assert sorted(c.nodes_by_nvlink_domain()) == ["gb200-nvl0", "gb200-nvl1"]
    assert [n.node for n in c.nodes if n.node.startswith("dgx1")] == ["dgx1-01", "dgx1-02", "dgx1-03", "dgx1-04"]
    assert (c.leaf_of("dgx1-01"), c.spine_of("dgx1-01")) == ("b7/r3", "b7")
    assert c.leaf_of("dgx1-02") == "tor-12"
    assert (c.leaf_of("dgx1-03"), c.spine_of("dgx1-03")) == ("tor-12", "pod-2")
