"""squeue and sinfo print Slurm's default columns; hostlists compress like Slurm's."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st
from oneplus_contracts import Allocation, GpuInfo, JobRecord, JobSpec, JobState, NodeRecord, NodeTopology, RankPlacement
from oneplus_contracts.slurm import STATE_CODES, compress_hostlist, expand_hostlist
from oneplus_jobformats.slurm_tables import render_sinfo, render_squeue

NOW = 10_000.0


def job(
    job_id: str, state: str, *, nodes: list[str] | None = None, reason: str | None = None, started: float | None = None
) -> JobRecord:
    spec = JobSpec.model_validate(
        {
            "name": f"job-{job_id}-with-a-long-name",
            "user": "dave",
            "queue": "debug",
            "ranks": 4,
            "resources": {"gpus": 8},
        }
    )
    allocation = None
    if nodes:
        allocation = Allocation(ranks=[RankPlacement(rank=i, node=n, gpus=list(range(8))) for i, n in enumerate(nodes)])
    return JobRecord(
        job_id=job_id,
        spec=spec,
        state=state,
        submitted_ts=NOW - 100,
        updated_ts=NOW,
        reason=reason,
        allocation=allocation,
        started_ts=started,
    )


def node(name: str, *, model: str = "NVIDIA H100 80GB HBM3", status: str = "ready", **extra: object) -> NodeRecord:
    topo = NodeTopology(node=name, gpu_model=model, gpus=[GpuInfo(index=i) for i in range(8)])
    return NodeRecord(topology=topo, status=status, **extra)


def test_squeue_prints_the_default_header_and_man_page_like_rows():
    records = [
        job("12345", "RUNNING", nodes=["dev9", "dev10", "dev11", "dev12"], started=NOW - 21),
        job("12346", "ACCEPTED", reason="Resources"),
        job("12348", "SUCCEEDED", nodes=["dev1"], started=NOW - 50),
    ]
    lines = render_squeue(records, now=NOW).splitlines()
    assert lines[0] == "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
    assert lines[1] == "             12345     debug job-1234     dave  R       0:21      4 dev[9-12]"
    assert lines[2] == "             12346     debug job-1234     dave PD       0:00      4 (Resources)"
    assert len(lines) == 3  # finished jobs are left out, as squeue does
    assert len(render_squeue(records, now=NOW, include_finished=True).splitlines()) == 4


def test_squeue_time_uses_slurms_elapsed_format():
    running = job("1", "RUNNING", nodes=["a1"], started=NOW - (2 * 86400 + 3 * 3600 + 4 * 60 + 5))
    assert " 2-03:04:05 " in render_squeue([running], now=NOW)
    running = job("1", "RUNNING", nodes=["a1"], started=NOW - 3725)
    assert "    1:02:05 " in render_squeue([running], now=NOW)


def test_every_lifecycle_state_has_a_slurm_code_of_at_most_two_letters():
    states = get_args(JobState)  # the contract is the one list of states
    assert set(states) == set(STATE_CODES)
    assert all(1 <= len(code) <= 2 for code in STATE_CODES.values())


def test_sinfo_groups_by_partition_and_state_with_compressed_hostlists():
    nodes = [node(f"h100-{i}") for i in (0, 1, 2, 3, 7)] + [
        node("h100-4", cordoned=True),
        node("h100-5", status="lost"),
        node("l40s-0", model="NVIDIA L40S"),
        node("big-0", model="NVIDIA H100"),
    ]
    nodes[-1].topology.labels["partition"] = "batch"  # a label names the partition
    jobs = [job("9", "RUNNING", nodes=["h100-0"], started=NOW - 5)]
    lines = render_sinfo(nodes, jobs).splitlines()
    assert lines[0] == "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST"
    assert lines[1:] == [
        "batch        up   infinite      1   idle big-0",
        "h100         up   infinite      1  alloc h100-0",
        "h100         up   infinite      4   idle h100-[1-3,7]",
        "h100         up   infinite      1  drain h100-4",
        "h100         up   infinite      1  down* h100-5",
        "l40s         up   infinite      1   idle l40s-0",
    ]


def test_hostlist_compression_keeps_zero_padding_and_single_names():
    assert compress_hostlist(["h100-0", "h100-1", "h100-2", "h100-3", "h100-7"]) == "h100-[0-3,7]"
    assert compress_hostlist(["node01", "node02", "node10"]) == "node[01-02,10]"
    assert compress_hostlist(["login", "gpu5"]) == "gpu5,login"
    assert expand_hostlist("dev[9-12],x") == ["dev9", "dev10", "dev11", "dev12", "x"]


@given(st.sets(st.tuples(st.sampled_from(["a", "gpu-", "rack1-n"]), st.integers(0, 300)), min_size=1, max_size=40))
def test_compress_then_expand_gives_back_the_same_names(pairs):
    names = {f"{prefix}{n}" for prefix, n in pairs}
    assert set(expand_hostlist(compress_hostlist(sorted(names)))) == names
