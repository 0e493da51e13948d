"""MIG layouts: an `nvidia-smi -L` listing parsed, laid onto a node, read from (fake) NVML, imported by the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_pynvml import make_fake_pynvml
from oneplus_topology.errors import TopologyParseError
from oneplus_topology.mig import apply_gpu_listing, mig_profiles, parse_gpu_listing, profile_of_device_name
from oneplus_topology.nvml import discover_node
from topology_cases import TOPOLOGIES, parse_file
from typer.testing import CliRunner

from oneplus.cli.topology import app

LISTING = TOPOLOGIES / "dgx_a100_8gpu_mig_smi_L.txt"
MATRIX = TOPOLOGIES / "dgx_a100_8gpu_nv12_12nic.txt"
runner = CliRunner()


def test_listing_gives_each_gpu_its_instances() -> None:
    gpus = parse_gpu_listing(LISTING.read_text(encoding="utf-8"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].uuid == "GPU-4a3d5e8c-6f21-9b7d-1c0e-2d8f4b6a9e13" and gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert [(i.device, i.profile) for i in gpus[0].instances] == [
        (0, "3g.40gb"),
        (1, "2g.20gb"),
        (2, "1g.10gb"),
        (3, "1g.10gb"),
    ]
    assert gpus[1].instances[1].uuid == "MIG-5b9d3e1c-7f0a-5c8d-e461-c07f9c1d3e56"
    assert all(not g.instances for g in gpus[2:])


def test_listing_laid_onto_the_matrix() -> None:
    topo = apply_gpu_listing(parse_file("dgx_a100_8gpu_nv12_12nic"), parse_gpu_listing(LISTING.read_text()))
    assert topo.gpus[0].mig_enabled and topo.gpus[1].mig_enabled and not topo.gpus[2].mig_enabled
    assert mig_profiles(topo) == {"3g.40gb": 3, "2g.20gb": 1, "1g.10gb": 2}
    assert topo.gpus[3].uuid == "GPU-00000000-0000-0000-0000-00005a1e0003"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  MIG 1g.10gb Device 0: (UUID: MIG-abc)\n", "line 1: a MIG device before any GPU line"),
        ("GPU 0: X (UUID: GPU-a)\n  MIG big Device 0: (UUID: MIG-b)\n", "line 2: 'big' is not a MIG profile name"),
        ("GPU 0: X (UUID: GPU-a)\nGPU 0: X (UUID: GPU-b)\n", "line 2: GPU 0 is listed twice"),
        ("GPU0\tGPU1\tCPU Affinity\n", "line 1: not an `nvidia-smi -L` line"),
        ("# only a comment\n", "line 1: no `GPU <i>: <name> (UUID: GPU-...)` line"),
    ],
)
def test_bad_listing_is_one_line_naming_it(text: str, expected: str) -> None:
    with pytest.raises(TopologyParseError) as e:
        parse_gpu_listing(text)
    assert str(e.value).startswith(expected)


def test_listing_of_other_gpus_is_refused() -> None:
    with pytest.raises(ValueError, match=r"the listing names GPUs \[0\] but node n has GPUs \[0, 1, 2, 3\]"):
        apply_gpu_listing(
            parse_file("h100_4gpu_nv6").model_copy(update={"node": "n"}), parse_gpu_listing("GPU 0: X (UUID: GPU-a)\n")
        )


def test_nvml_discovery_reads_mig_devices() -> None:
    listing = parse_gpu_listing(LISTING.read_text())
    found = discover_node("a100", make_fake_pynvml(parse_file("dgx_a100_8gpu_nv12_12nic"), mig_listing=listing))
    for g, want in zip(found.gpus, listing, strict=True):
        assert g.uuid == want.uuid
        assert g.mig_instances == want.instances
        assert g.mig_enabled == bool(want.instances)


def test_profile_from_nvml_device_name() -> None:
    assert profile_of_device_name("NVIDIA A100-SXM4-80GB MIG 3g.40gb") == "3g.40gb"
    assert profile_of_device_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert profile_of_device_name("NVIDIA A100-SXM4-80GB") is None


def test_cli_import_with_gpu_list(tmp_path: Path) -> None:
    result = runner.invoke(app, ["import", str(MATRIX), "--gpu-list", str(LISTING), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [i["profile"] for i in doc["mig"]["1"]] == ["3g.40gb", "3g.40gb"] and set(doc["mig"]) == {"0", "1"}
    text = runner.invoke(app, ["import", str(MATRIX), "--gpu-list", str(LISTING)]).stdout
    assert "MIG GPU0: 0:3g.40gb MIG-0c4e8f6d-2a5b-5d3e-9f1c-7b2a4d6e8f01, 1:2g.20gb" in text
    bad = tmp_path / "bad.txt"
    bad.write_text("GPU 0: X (UUID: GPU-a)\n")
    refused = runner.invoke(app, ["import", str(MATRIX), "--gpu-list", str(bad)])
    assert refused.exit_code != 0
    assert "the listing names GPUs [0] but node dgx_a100_8gpu_nv12_12nic has GPUs" in refused.output
