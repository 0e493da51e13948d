"""The cpuset of a rank: the CPUs of its GPUs' NUMA node, clamped to the CPUs the host has."""

from __future__ import annotations

import pytest
from executor_engine_support import real_topology
from hypothesis import given
from hypothesis import strategies as st
from oneplus_node_executor.runtime.cpuset import format_cpu_list, gpu_affinity, numa_cpuset, parse_cpu_list


def test_cpu_lists_parse_like_the_kernel_prints_them() -> None:
    assert parse_cpu_list("0-3,8,10-11") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert format_cpu_list({11, 10, 0, 1, 2, 3, 8}) == "0-3,8,10-11"


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1))
def test_format_then_parse_is_the_identity(cpus: set[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize(("text", "why"), [("0-a", "is not N or N-M"), ("5-2", "runs backwards"), ("x", "not N")])
def test_malformed_cpu_lists_are_refused_by_part(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_cpu_list(text)


def test_h100_gpus_take_their_socket_and_its_hyperthreads() -> None:
    topo = real_topology("h100_sxm_8gpu_nvswitch_nv18.txt")
    assert numa_cpuset(topo, [4, 5], None) == "52-103,156-207"
    # Spanning both sockets takes both: the rank needs CPUs near every one of its GPUs.
    assert numa_cpuset(topo, [3, 4], None) == "0-207"


def test_dgx_a100_nps4_numa_nodes() -> None:
    topo = real_topology("dgx_a100_8gpu_nv12_12nic.txt")
    assert gpu_affinity(topo, [2]) == parse_cpu_list("16-31,144-159")


def test_clamped_to_the_host_cpus_and_none_when_nothing_is_left() -> None:
    topo = real_topology("h100_sxm_8gpu_nvswitch_nv18.txt")
    assert numa_cpuset(topo, [0], range(2)) == "0-1"  # a 2-CPU test host under socket 0's list
    assert numa_cpuset(topo, [7], range(2)) is None  # socket 1's CPUs do not exist here


def test_no_topology_means_no_cpuset() -> None:
    assert numa_cpuset(None, [0], range(2)) is None


def test_unknown_gpu_is_an_error() -> None:
    with pytest.raises(ValueError, match="GPU 9 is not on node node-a"):
        numa_cpuset(real_topology("h100_sxm_8gpu_nvswitch_nv18.txt"), [9], None)
