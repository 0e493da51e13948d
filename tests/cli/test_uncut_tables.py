"""Every table command prints whole lines when piped (rich's default 80 columns cut `nodes show a100-0 | cat`
after NIC1, and the NUMA and rails lines)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from oneplus_contracts import NodeRecord
from oneplus_topology.presets import shared_preset
from typer.testing import CliRunner

from oneplus import client as client_module
from oneplus.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
A100 = "dgx_a100_8gpu_nv12_12nic"


class Nodes:
    async def nodes(self) -> list[NodeRecord]:
        topo = shared_preset(A100).model_copy(update={"node": "a100-0"})
        return [NodeRecord(topology=topo)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    @asynccontextmanager
    async def connect(nats_url: str | None = None, **_: Any) -> AsyncIterator[Nodes]:
        yield Nodes()

    monkeypatch.setattr(client_module.OnePlusClient, "connect", connect)


def whole(out: str) -> None:
    """The matrix's every column and every legend line, each on one line."""
    lines = out.splitlines()
    header = next(line for line in lines if "GPU0" in line and "NIC0" in line)
    for col in ("NIC2", "NIC10", "NIC11", "NUMA"):
        assert col in header, header
    assert any(line.strip().startswith("GPU7") and line.rstrip().endswith("5") for line in lines)  # GPU7's NUMA 5
    rails = next(line for line in lines if line.startswith("Rails: "))
    assert rails.endswith("GPU7: mlx5_8/mlx5_9"), rails
    nics = next(line for line in lines if line.startswith("NICs: "))
    assert nics.endswith("NIC11=mlx5_11"), nics
    assert sum(line.startswith("NUMA ") for line in lines) == 4


def test_nodes_show_piped_is_not_cut(fake: None) -> None:
    result = CliRunner().invoke(app, ["nodes", "show", "a100-0"])  # CliRunner's output is no terminal: piped
    assert result.exit_code == 0, result.output
    whole(result.stdout)


def test_topology_import_piped_is_not_cut() -> None:
    result = CliRunner().invoke(app, ["topology", "import", str(ROOT / "data" / "topologies" / f"{A100}.txt")])
    assert result.exit_code == 0, result.output
    whole(result.stdout)


def test_presets_and_cluster_tables_piped_keep_every_cell() -> None:
    result = CliRunner().invoke(app, ["topology", "presets"])
    assert result.exit_code == 0, result.output
    assert "gb200_nvl72_compute_tray_4gpu" in result.stdout and "…" not in result.stdout
    assert "real capture" in result.stdout
    clusters = sorted((ROOT / "bench" / "clusters").glob("*.yaml"))
    result = CliRunner().invoke(app, ["topology", "cluster", str(clusters[0])])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
