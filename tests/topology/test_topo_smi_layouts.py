"""The parser beyond the six captures: constructed layouts, spellings, bad input, and random matrices."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oneplus_topology.analysis import nvlink_domains, nvlink_groups, pcie_switch_groups, rails
from oneplus_topology.errors import TopologyParseError
from oneplus_topology.smi import parse_topo_matrix, render_topo_matrix
from topology_cases import kind, parse_file

TIERS = ["PIX", "PXB", "PHB", "NODE", "SYS"]


def test_dgx1_hybrid_cube_mesh_gives_two_quads_and_four_cross_pairs() -> None:
    topo = parse_file("dgx1_v100")
    assert topo.gpu_model == "V100"
    assert nvlink_groups(topo) == [[0, 1, 2, 3], [0, 4], [1, 5], [2, 6], [3, 7], [4, 5, 6, 7]]
    assert nvlink_domains(topo) == [list(range(8))]
    nv2 = sorted((lk.a, lk.b) for lk in topo.links if lk.kind == "NV2")
    assert nv2 == [(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)]
    assert kind(topo, 0, 1) == "NV1"
    assert kind(topo, 0, 5) == "SYS"
    assert all(g.nvlinks_total == 6 for g in topo.gpus)  # six NVLink2 links per V100
    assert {lk.gbps for lk in topo.links if lk.kind == "NV2"} == {50.0}
    assert {lk.gbps for lk in topo.links if lk.kind == "NV1"} == {25.0}
    assert rails(topo)[2] == ["mlx5_1"]


def test_h100_board_without_nvswitch_counts_direct_nv6_links() -> None:
    topo = parse_file("h100_4gpu_nv6")
    assert {lk.kind for lk in topo.links} == {"NV6"}
    assert {lk.gbps for lk in topo.links} == {150.0}
    assert all(g.nvlinks_total == 18 for g in topo.gpus)  # 3 peers x 6 links: a mesh, not a switch
    assert nvlink_groups(topo) == [[0, 1, 2, 3]]
    assert [n.name for n in topo.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert rails(topo) == {0: ["mlx5_0"], 1: ["mlx5_1"], 2: ["mlx5_2"], 3: ["mlx5_3"]}


def test_pcie_board_groups_gpus_by_switch_tree() -> None:
    topo = parse_file("pcie_pix_pxb_8gpu")
    assert kind(topo, 0, 1) == "PIX"
    assert kind(topo, 0, 2) == "PXB"
    assert kind(topo, 0, 4) == "SYS"
    assert pcie_switch_groups(topo) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nvlink_groups(topo) == []
    assert [n.numa_node for n in topo.nics] == [0, 0, 1, 1]
    assert topo.nics[1].near_gpus == []  # NODE: on its own root port
    assert topo.nics[0].near_gpus == [0, 1, 2, 3]
    pix = next(lk.gbps for lk in topo.links if lk.kind == "PIX")
    sys_ = next(lk.gbps for lk in topo.links if lk.kind == "SYS")
    assert pix == 31.0 and sys_ < pix


def test_space_and_tab_alignment_parse_the_same() -> None:
    tab = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\t X \t8-15\t1\n"
    space = "        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      NV4     0-7     0\n"
    space += "GPU1    NV4      X      8-15    1\n"
    assert parse_topo_matrix(tab) == parse_topo_matrix(space)


def test_old_soc_spelling_reads_as_sys_and_unknown_model_uses_documented_default() -> None:
    text = "\tGPU0\tGPU1\nGPU0\t X \tSOC\nGPU1\tSOC\t X \n"
    topo = parse_topo_matrix(text)
    assert topo.links[0].kind == "SYS"
    assert topo.gpu_model == "unknown"
    assert topo.gpus[0].numa_node is None and topo.gpus[0].cpu_affinity is None
    nv = parse_topo_matrix("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV2\t X \n")
    assert nv.links[0].gbps == 50.0  # 25 GB/s per link when the model is unknown


def test_gpu_model_hint_comment_wins() -> None:
    text = "# gpu_model: NVIDIA H200 141GB\n# System: some H100 box\n\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
    assert parse_topo_matrix(text).gpu_model == "H200"


BAD = {
    "empty": ("", 1, "no nvidia-smi topo -m matrix"),
    "prose": ("# a comment\nhello world\n", 2, "expected the matrix header"),
    "unknown type": ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tFOO\t X \n", 3, "unknown link type 'FOO'"),
    "short row": ("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tSYS\tSYS\nGPU1\tSYS\t X \n", 3, "GPU1 has 2 cells"),
    "asymmetric": ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV2\t X \n", 3, "must be symmetric"),
    "missing row": ("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tSYS\tSYS\nGPU1\tSYS\t X \tSYS\n\n", 4, "expected the row of GPU2"),
    "rows out of order": ("\tGPU0\tGPU1\nGPU1\tSYS\t X \nGPU0\t X \tSYS\n", 2, "expected the row of GPU0"),
    "x off diagonal": ("\tGPU0\tGPU1\nGPU0\t X \tX\nGPU1\tSYS\t X \n", 2, "between GPU0 and GPU1"),
    "no x on diagonal": ("\tGPU0\tGPU1\nGPU0\tSYS\tSYS\nGPU1\tSYS\t X \n", 2, "on the diagonal"),
    "unknown column": ("\tGPU0\tGPU1\tCPU Affinity\tFan\nGPU0\t X \tSYS\nGPU1\tSYS\t X \n", 1, "unknown column 'Fan'"),
    "unknown device column": ("\tGPU0\tGPU1\tFan\nGPU0\t X \tSYS\nGPU1\tSYS\t X \n", 2, "GPU0 GPU1 Fan"),
    "bad affinity": ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\tlots\nGPU1\tSYS\t X \t0-3\n", 2, "'lots'"),
    "extra values": ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-3\t0\nGPU1\tSYS\t X \t0-3\n", 2, "2 values"),
    "stray row": ("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU1\tSYS\t X \nmlx5_9\tSYS\tSYS\n", 4, "not a column"),
    "duplicate column": ("\tGPU0\tGPU1\tNIC0\tNIC0\nGPU0\t X \tSYS\tSYS\tSYS\n", 1, "appears twice"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_line(case: str) -> None:
    text, line, words = BAD[case]
    with pytest.raises(TopologyParseError) as e:
        parse_topo_matrix(text)
    assert e.value.line == line
    assert str(e.value).startswith(f"line {line}: ")
    assert words in str(e.value)


def test_parse_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="line 1"):
        parse_topo_matrix("")


@st.composite
def matrices(draw: st.DrawFn) -> tuple[list[list[str]], list[list[str]], list[int | None], list[str | None]]:
    n = draw(st.integers(1, 8))
    nics = draw(st.integers(0, 3))
    kinds = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            kinds[a][b] = kinds[b][a] = draw(st.sampled_from([*TIERS, "NV1", "NV2", "NV4", "NV6", "NV12", "NV18"]))
    nic_tiers = [[draw(st.sampled_from(TIERS)) for _ in range(nics)] for _ in range(n)]
    numa = [draw(st.none() | st.integers(0, 7)) for _ in range(n)]
    cpus = [draw(st.none() | st.sampled_from(["0-7", "0-51,104-155", "3", "8-15,24-31"])) for _ in range(n)]
    return kinds, nic_tiers, numa, cpus


def _write(
    kinds: list[list[str]], nic_tiers: list[list[str]], numa: list[int | None], cpus: list[str | None], sep: str
) -> str:
    n, m = len(kinds), len(nic_tiers[0]) if nic_tiers else 0
    header = ["", *[f"GPU{i}" for i in range(n)], *[f"NIC{k}" for k in range(m)], "CPU Affinity", "NUMA Affinity"]
    rows = [sep.join(header)]
    for i in range(n):
        cells = [" X " if j == i else kinds[i][j] for j in range(n)] + nic_tiers[i]
        tail = [cpus[i] or "N/A", "N/A" if numa[i] is None else str(numa[i])]
        rows.append(sep.join([f"GPU{i}", *cells, *tail]))
    legend = ["", "NIC Legend:", ""] + [f"  NIC{k}: mlx5_{k}" for k in range(m)]
    return "\n".join(rows + legend) + "\n"


@settings(max_examples=60, deadline=None)
@given(matrices(), st.sampled_from(["\t", "    "]))
def test_random_matrices_round_trip_through_text(
    case: tuple[list[list[str]], list[list[str]], list[int | None], list[str | None]], sep: str
) -> None:
    kinds, nic_tiers, numa, cpus = case
    topo = parse_topo_matrix(_write(kinds, nic_tiers, numa, cpus, sep))
    n = len(kinds)
    assert {(lk.a, lk.b): lk.kind for lk in topo.links} == {
        (a, b): kinds[a][b] for a in range(n) for b in range(a + 1, n)
    }
    assert [g.numa_node for g in topo.gpus] == numa
    assert [g.cpu_affinity for g in topo.gpus] == cpus
    for k, nic in enumerate(topo.nics):
        assert nic.name == f"mlx5_{k}"
        assert nic.gpu_tiers == {i: nic_tiers[i][k] for i in range(n)}
    assert parse_topo_matrix(render_topo_matrix(topo), node=topo.node) == topo
