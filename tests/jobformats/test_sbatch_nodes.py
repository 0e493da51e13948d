"""sbatch's node options become a placement constraint: `--nodes=N` is exactly N distinct nodes (issue 44).

Before, `--nodes=2 --gpus-per-node=4 --ntasks-per-node=1` gave two ranks of 4 GPUs with no node count, and
placement put both on one 8-GPU board.
"""

from __future__ import annotations

import pytest
from oneplus_jobformats import JobFormatError, dry_run_summary, parse_sbatch
from oneplus_placement import ClusterState, place_gang
from oneplus_topology.cluster import synthetic_cluster


def script(*directives: str, body: str = "srun hostname\n") -> str:
    return "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + body


def test_nodes_with_gpus_per_node_is_a_count_of_distinct_nodes() -> None:
    tr = parse_sbatch(script("--nodes=2", "--gpus-per-node=4", "--ntasks-per-node=1"))
    assert (tr.spec.ranks, tr.spec.resources.gpus, tr.spec.topology.nodes) == (2, 4.0, 2)
    summary = dry_run_summary(tr.spec, tr.warnings, kind="sbatch")
    assert summary["nodes"] == 2 and summary["spec"]["topology"]["nodes"] == 2


@pytest.mark.parametrize(
    ("directives", "ranks", "nodes"),
    [
        (["--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8"], 16, 2),  # a rank per task, 8 per node
        (["--ntasks=16", "--ntasks-per-node=8", "--gpus-per-node=8"], 16, 2),  # the nodes the tasks are laid on
        (["--ntasks=2", "--ntasks-per-node=1", "--gpus-per-task=4"], 2, 2),
        (["--nodes=4", "--gpus=16"], 4, 4),  # a total spread over the nodes
        (["--nodes=1", "--ntasks-per-node=4", "--gpus-per-node=4"], 4, 1),
        (["--nodes=2", "--ntasks-per-node=2"], 4, 2),  # no GPU: one rank per task, two on each node
    ],
)
def test_the_node_count_lays_the_tasks_on_that_many_nodes(directives: list[str], ranks: int, nodes: int) -> None:
    spec = parse_sbatch(script(*directives)).spec
    assert (spec.ranks, spec.topology.nodes) == (ranks, nodes)


def test_tasks_alone_leave_the_node_count_to_placement() -> None:
    spec = parse_sbatch(script("--ntasks=16", "--gpus-per-task=1")).spec
    assert spec.topology.nodes is None


def test_a_node_range_uses_its_minimum_and_says_so() -> None:
    tr = parse_sbatch(script("--nodes=2-4", "--gpus-per-node=8"))
    assert tr.spec.topology.nodes == 2
    assert any("--nodes=2-4: a gang has a fixed size; using the minimum, exactly 2 nodes" in w for w in tr.warnings)


def test_uneven_tasks_without_gpus_are_placed_without_a_node_count_and_say_so() -> None:
    tr = parse_sbatch(script("--nodes=2", "--ntasks=3"))
    assert (tr.spec.ranks, tr.spec.topology.nodes) == (3, None)
    assert any("3 tasks do not spread evenly over 2 nodes" in w for w in tr.warnings)


@pytest.mark.parametrize(
    ("directives", "message"),
    [
        (["--nodes=3", "--ntasks=2", "--gpus-per-task=1"], "--nodes=3: 3 nodes are more than the 2 tasks (--ntasks)"),
        (["--nodes=4-2"], "--nodes=4-2: the minimum (4) is above the maximum (2)"),
        (["--nodes=0"], "--nodes=0: the node count must be at least 1"),
        (["--nodes=2", "--ntasks=3", "--gpus-per-node=4"], "3 tasks cannot be spread evenly over 2 nodes"),
    ],
)
def test_node_counts_that_cannot_be_met_get_one_clear_line(directives: list[str], message: str) -> None:
    with pytest.raises(JobFormatError) as info:
        parse_sbatch(script(*directives), filename="job.sh")
    text = str(info.value)
    assert message in text and "\n" not in text.strip()
    assert text.startswith("job.sh: line ")


def test_sbatch_exclusive_job_holds_its_whole_node_and_the_dry_run_says_so() -> None:
    text = "#!/bin/bash\n#SBATCH --exclusive\n#SBATCH --ntasks=1\n#SBATCH --gpus-per-task=2\nsrun hostname\n"
    parsed = parse_sbatch(text, filename="excl.sh")
    summary = dry_run_summary(parsed.spec, parsed.warnings)
    assert summary["exclusive"] is True
    assert any(n.startswith("exclusive: each of the job's nodes is held whole") for n in summary["resource_notes"])
    state = ClusterState.from_cluster(synthetic_cluster(1, preset="h100_sxm_8gpu_nvswitch_nv18", name="t"))
    alloc = place_gang(state.snapshot(), parsed.spec).allocation
    assert alloc is not None
    # Asked for 2 GPUs; the job holds all 8 of its node (sbatch(1): all CPUs and GRES of its nodes).
    assert sorted(alloc.ranks[0].gpus) == list(range(8)) and alloc.ranks[0].cpus == state.slots[0].cpus
    state.apply(alloc)
    one = parse_sbatch("#!/bin/bash\n#SBATCH --gpus=1\nsrun hostname\n", filename="one.sh").spec
    assert place_gang(state.snapshot(), one).allocation is None
