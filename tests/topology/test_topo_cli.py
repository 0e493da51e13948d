"""`oneplus topology import|presets|cluster`, driven through typer's CliRunner on the sub-app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oneplus_topology.presets import PRESETS
from topology_cases import REAL_FILES, TOPOLOGIES, parse_file
from typer.testing import CliRunner

from oneplus.cli.topology import app, render_link_matrix

runner = CliRunner()


@pytest.mark.parametrize("name", REAL_FILES)
def test_import_json_has_the_documented_keys(name: str) -> None:
    result = runner.invoke(app, ["import", str(TOPOLOGIES / f"{name}.txt"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    n = doc["gpus"]
    assert {"gpus", "links", "nvlink_groups", "numa"} <= set(doc)
    assert len(doc["links"]) == n * (n - 1) // 2
    assert all(len(link) == 4 and link[0] < link[1] for link in doc["links"])
    assert len(doc["numa"]) == n
    assert doc["model"]["node"] == name


def test_import_json_values() -> None:
    dgx = json.loads(runner.invoke(app, ["import", str(TOPOLOGIES / "dgx_a100_8gpu_nv12_12nic.txt"), "--json"]).stdout)
    assert dgx["links"][0] == [0, 1, "NV12", 300.0]
    assert dgx["numa"] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert dgx["nvlink_groups"] == [list(range(8))]
    gb = json.loads(
        runner.invoke(app, ["import", str(TOPOLOGIES / "gb200_nvl72_compute_tray_4gpu.txt"), "--json"]).stdout
    )
    assert gb["numa"] == [0, 0, 1, 1]
    l40s = json.loads(runner.invoke(app, ["import", str(TOPOLOGIES / "l40s_8gpu_pcie_node_sys.txt"), "--json"]).stdout)
    assert l40s["nvlink_groups"] == []
    assert l40s["links"][3][:3] == [0, 4, "SYS"]
    assert l40s["links"][0][:3] == [0, 1, "NODE"]
    assert l40s["links"][0][3] > l40s["links"][3][3]


def test_import_json_gives_null_for_unknown_numa(tmp_path: Path) -> None:
    f = tmp_path / "two.txt"
    f.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV2\t X \n")
    doc = json.loads(runner.invoke(app, ["import", str(f), "--json", "--node", "box"]).stdout)
    assert doc["numa"] == [None, None]
    assert doc["node"] == "box"
    assert doc["assumptions"] and "not known" in doc["assumptions"][0]


def test_import_prints_the_matrix() -> None:
    result = runner.invoke(app, ["import", str(TOPOLOGIES / "dgx1_v100.txt")])
    assert result.exit_code == 0
    assert "NV2" in result.stdout and "NVLink groups: [0, 1, 2, 3], [0, 4]" in result.stdout


def test_bad_file_exits_2_naming_the_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.txt"
    f.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tWAT\t X \n")
    result = runner.invoke(app, ["import", str(f)])
    assert result.exit_code == 2
    assert "line 3:" in result.stderr and "WAT" in result.stderr
    missing = runner.invoke(app, ["import", str(tmp_path / "absent.txt")])
    assert missing.exit_code == 2 and "cannot read" in missing.stderr


def test_presets_and_cluster_commands(tmp_path: Path) -> None:
    listed = json.loads(runner.invoke(app, ["presets", "--json"]).stdout)
    assert [p["name"] for p in listed] == list(PRESETS)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("name: c\nnode_groups: [{prefix: a, count: 10, topology: h100_4gpu_nv6}]\n")
    doc = json.loads(runner.invoke(app, ["cluster", str(yaml_file), "--json"]).stdout)
    assert doc["nodes"] == 10 and doc["gpus"] == 40
    assert doc["leaves"]["leaf1"] == ["a-08", "a-09"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: c\n")
    result = runner.invoke(app, ["cluster", str(bad)])
    assert result.exit_code == 2 and "node_groups" in result.stderr


def test_render_link_matrix_has_a_column_per_device() -> None:
    topo = parse_file("a800_8gpu_nvswitch_nv8_4nic")
    table = render_link_matrix(topo)
    assert len(table.columns) == 1 + 8 + 4 + 1
    assert table.row_count == 8
