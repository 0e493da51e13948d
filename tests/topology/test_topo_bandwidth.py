"""Bandwidth per link type: every constant matches the CSV row it cites."""

from __future__ import annotations

import csv

import pytest
from oneplus_topology import bandwidth as bw
from topology_cases import REPO


def _csv_rows() -> list[list[str]]:
    with (REPO / bw.CSV_PATH).open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


@pytest.mark.parametrize("key", sorted(bw.CITATIONS))
def test_each_cited_row_still_says_what_the_code_assumes(key: str) -> None:
    cite = bw.CITATIONS[key]
    row = _csv_rows()[cite.line - 1]
    header = _csv_rows()[0]
    assert row[header.index("hardware")] == cite.hardware
    assert row[header.index("value_GBps")] == cite.value_gbps


def test_per_link_nvlink_rates_come_from_the_aggregate_rows() -> None:
    rows = _csv_rows()
    links_per_gpu = {2: 6, 3: 12, 4: 18, 5: 18}
    for gen, line in ((2, 2), (3, 3), (4, 4), (5, 5)):
        assert bw.NVLINK_PER_LINK_GBPS[gen] == float(rows[line - 1][4]) / links_per_gpu[gen]
    assert bw.PCIE_X16_GBPS[4] == float(rows[5][4])
    assert bw.PCIE_X16_GBPS[5] == float(rows[6][4])


@pytest.mark.parametrize(
    ("kind", "model", "gbps"),
    [
        ("NV18", "H100", 450.0),
        ("NV12", "A100", 300.0),
        ("NV8", "A800", 200.0),
        ("NV2", "V100", 50.0),
        ("NV1", "V100", 25.0),
        ("NV18", "GB200", 900.0),
        ("NV6", "H100", 150.0),
        ("NV4", "unknown", 100.0),
        ("PIX", "L40S", 31.0),
        ("PXB", "H100", 63.0),
        ("SYS", "H100", 28.0),
        ("NODE", "RTX 5090", 35.0),
        ("PIX", "unknown", 31.0),
    ],
)
def test_link_gbps(kind: str, model: str, gbps: float) -> None:
    assert bw.link_gbps(kind, model) == pytest.approx(gbps)


@pytest.mark.parametrize("model", ["H100", "L40S", "V100", "unknown"])
def test_pcie_tiers_never_get_faster_further_away(model: str) -> None:
    rates = [bw.link_gbps(t, model) for t in ("PIX", "PXB", "PHB", "NODE", "SYS")]
    assert rates == sorted(rates, reverse=True)
    assert rates[-1] < rates[0]


def test_device_names_are_recognised_inside_longer_text() -> None:
    assert bw.link_gbps("NV18", "NVIDIA H100 80GB HBM3") == 450.0
    assert bw.link_gbps("NV18", "NVIDIA GB200") == 900.0


@pytest.mark.parametrize("kind", ["X", "FOO", "NV", ""])
def test_unknown_link_type_is_refused(kind: str) -> None:
    with pytest.raises(ValueError, match="unknown link type"):
        bw.link_gbps(kind, "H100")


def test_assumptions_are_stated_for_unknown_models_only() -> None:
    assert bw.assumptions("H100") == []
    (note,) = bw.assumptions("unknown")
    assert "25 GB/s per link" in note and "Gen4" in note


def test_nic_rates() -> None:
    assert bw.nic_gbytes(400) == 50.0
    assert bw.nic_gbytes(200) == bw.NIC_HDR_200_GBPS == 25.0
    assert bw.nic_ring_gbps(400) == pytest.approx(47.0)
    assert bw.nic_ring_gbps(400, oversubscription=2.0) == pytest.approx(23.5)
    with pytest.raises(ValueError, match="positive"):
        bw.nic_gbytes(0)
    with pytest.raises(ValueError, match="oversubscription"):
        bw.nic_ring_gbps(400, oversubscription=0.5)
