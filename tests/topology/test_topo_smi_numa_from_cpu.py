"""NUMA nodes derived from the `CPU Affinity` column when `nvidia-smi topo -m` prints no `NUMA Affinity` column
(drivers before about R418 did not).

The first five rows are the matrix quoted by flx42 in kubernetes/kubernetes#53497 (2017-11-15, issue text; an
8-GPU, one mlx4 NIC, two-socket server). The quote stops after GPU4's row; GPU5-GPU7 are completed here from the
symmetry of the quoted rows (constructed by this project, marked below).
"""

from __future__ import annotations

from oneplus_topology.smi import numa_from_cpu_affinity, parse_topo_matrix

K8S_53497 = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    mlx4_0  CPU Affinity
GPU0     X      PIX     PHB     PHB     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU1    PIX      X      PHB     PHB     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU2    PHB     PHB      X      PIX     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU3    PHB     PHB     PIX      X      SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU4    SYS     SYS     SYS     SYS      X      PIX     PHB     PHB     SYS     10-19,30-39
GPU5    SYS     SYS     SYS     SYS     PIX      X      PHB     PHB     SYS     10-19,30-39
GPU6    SYS     SYS     SYS     SYS     PHB     PHB      X      PIX     SYS     10-19,30-39
GPU7    SYS     SYS     SYS     SYS     PHB     PHB     PIX      X      SYS     10-19,30-39
mlx4_0  PHB     PHB     PHB     PHB     SYS     SYS     SYS     SYS      X
"""
# GPU5-GPU7 and the mlx4_0 row above: constructed by symmetry (see the module docstring).


def test_two_sockets_from_cpu_affinity_give_numa_nodes_0_and_1() -> None:
    topo = parse_topo_matrix(K8S_53497)
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.gpus[4].cpu_affinity == "10-19,30-39"
    assert [n.numa_node for n in topo.nics] == [0]  # the NIC is PHB to GPU0-3: socket 0
    assert topo.cpus == 40


def test_numa_is_numbered_by_lowest_cpu_not_by_gpu_order() -> None:
    assert numa_from_cpu_affinity(["32-63", "0-31", "32-63", None, "N/A"]) == [1, 0, 1, None, None]


def test_overlapping_cpu_lists_leave_numa_unknown() -> None:
    assert numa_from_cpu_affinity(["0-31", "16-47"]) == [None, None]


def test_a_printed_numa_column_still_wins_even_when_it_says_na() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-7\tN/A\nGPU1\tSYS\t X \t8-15\tN/A\n"
    assert [g.numa_node for g in parse_topo_matrix(text).gpus] == [None, None]


def test_single_socket_is_node_0() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-15\nGPU1\tNV4\t X \t0-15\n"
    assert [g.numa_node for g in parse_topo_matrix(text).gpus] == [0, 0]
