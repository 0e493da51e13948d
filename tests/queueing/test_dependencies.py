"""Slurm's --dependency and singleton in a cycle, and --constraint reasons: which pending jobs are considered."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec
from oneplus_contracts.jobspec import Dependency
from oneplus_placement.snapshot import ClusterState
from oneplus_queueing.config import default_config
from oneplus_queueing.cycle import schedule_cycle
from oneplus_queueing.dependencies import check_dependencies
from oneplus_queueing.fairshare import UsageHistory
from oneplus_queueing.model import CycleDecision, PendingJob
from oneplus_topology.cluster import Cluster, synthetic_cluster
from queueing_world import World, spec


def dep(s: JobSpec, *deps: tuple[str, list[str]], any_of: bool = False, singleton: bool = False) -> JobSpec:
    return s.model_copy(
        update={
            "dependencies": [Dependency(type=t, job_ids=ids) for t, ids in deps],  # type: ignore[arg-type]
            "dependency_any": any_of,
            "singleton": singleton,
        }
    )


def _cycle(w: World, pending: list[PendingJob], states: dict[str, str] | None = None) -> CycleDecision:
    return schedule_cycle(
        100.0, w.state, pending, list(w.running.values()), default_config(), UsageHistory(), job_states=states
    )


@pytest.mark.parametrize(
    ("kind", "state", "verdict"),
    [
        ("afterok", "RUNNING", "wait"),
        ("afterok", "SUCCEEDED", "ready"),
        ("afterok", "FAILED", "never"),
        ("afterok", "CANCELLED", "never"),
        ("afterany", "RUNNING", "wait"),
        ("afterany", "FAILED", "ready"),
        ("afterany", "SUCCEEDED", "ready"),
        ("afternotok", "SUCCEEDED", "never"),
        ("afternotok", "FAILED", "ready"),
        ("afternotok", "CANCELLED", "ready"),
        ("afternotok", "PLACED", "wait"),
        ("after", "ACCEPTED", "wait"),
        ("after", "RUNNING", "ready"),
        ("after", "CANCELLED", "ready"),
        ("afterok", None, "never"),
    ],
)
def test_each_dependency_type(kind: str, state: str | None, verdict: str) -> None:
    s = dep(spec("b", 1), (kind, ["a"]))
    assert check_dependencies(s, {"a": state}.get).verdict == verdict


def test_all_must_hold_unless_any_is_asked() -> None:
    states = {"a": "SUCCEEDED", "b": "RUNNING", "c": "FAILED"}.get
    assert check_dependencies(dep(spec("x", 1), ("afterok", ["a", "b"])), states).verdict == "wait"
    assert check_dependencies(dep(spec("x", 1), ("afterok", ["a", "c"])), states).verdict == "never"
    assert check_dependencies(dep(spec("x", 1), ("afterok", ["b", "c"]), any_of=True), states).verdict == "wait"
    assert check_dependencies(dep(spec("x", 1), ("afterok", ["a", "c"]), any_of=True), states).verdict == "ready"
    assert check_dependencies(dep(spec("x", 1), ("afterok", ["c", "zz"]), any_of=True), states).verdict == "never"


def test_a_job_waits_with_reason_dependency_while_its_dependency_runs() -> None:
    w = World(n_nodes=2)
    w.run("a", [(0, [0])])
    d = _cycle(w, [PendingJob("b", dep(spec("b", 1), ("afterok", ["a"])), 1.0)])
    assert "b" not in d.placements
    assert d.reasons["b"].code == "Dependency" and "a is RUNNING" in d.reasons["b"].message
    assert "b" not in d.order  # not considered: it can be neither the head nor a preemptor


def test_a_satisfied_dependency_is_placed() -> None:
    w = World(n_nodes=2)
    d = _cycle(w, [PendingJob("b", dep(spec("b", 1), ("afterok", ["a"])), 1.0)], {"a": "SUCCEEDED"})
    assert "b" in d.placements


def test_a_dependency_on_a_pending_job_waits_even_in_the_same_cycle() -> None:
    w = World(n_nodes=2)
    jobs = [PendingJob("a", spec("a", 1), 0.0), PendingJob("b", dep(spec("b", 1), ("after", ["a"])), 1.0)]
    d = _cycle(w, jobs)
    assert "a" in d.placements and d.reasons["b"].code == "Dependency"


@pytest.mark.parametrize(("kind", "states"), [("afterok", {"a": "FAILED"}), ("afternotok", {"a": "SUCCEEDED"})])
def test_a_never_satisfiable_dependency_is_reported(kind: str, states: dict[str, str]) -> None:
    w = World(n_nodes=2)
    d = _cycle(w, [PendingJob("b", dep(spec("b", 1), (kind, ["a"])), 1.0)], states)
    assert d.reasons["b"].code == "DependencyNeverSatisfied"
    assert "b" in d.unsatisfiable and "b" not in d.placements


def test_an_unknown_job_id_can_never_be_satisfied() -> None:
    d = _cycle(World(n_nodes=1), [PendingJob("b", dep(spec("b", 1), ("afterany", ["nope"])), 1.0)])
    assert d.unsatisfiable["b"] == "afterany:nope: no job nope"


def test_singleton_waits_while_a_job_of_the_same_name_and_user_holds_gpus() -> None:
    w = World(n_nodes=2)
    w.run("first", [(0, [0])])  # spec name "first"
    later = dep(spec("first", 1), singleton=True)
    other = dep(spec("other", 1), singleton=True)
    d = _cycle(w, [PendingJob("s1", later, 1.0), PendingJob("s2", other, 2.0)])
    assert d.reasons["s1"].code == "Dependency" and "singleton" in d.reasons["s1"].message
    assert "s2" in d.placements


def test_at_most_one_singleton_of_a_name_starts_per_cycle() -> None:
    w = World(n_nodes=2)
    jobs = [PendingJob(f"s{i}", dep(spec("train", 1), singleton=True), float(i)) for i in range(3)]
    d = _cycle(w, jobs)
    assert list(d.placements) == ["s0"]
    assert d.reasons["s1"].code == "Dependency" and d.reasons["s2"].code == "Dependency"


def _mixed() -> ClusterState:
    a = synthetic_cluster(2, preset="dgx_a100_8gpu_nv12_12nic", prefix="a")
    h = synthetic_cluster(2, preset="h100_sxm_8gpu_nvswitch_nv18", prefix="h")
    return ClusterState.from_cluster(Cluster(name="mixed", fabric=a.fabric, nodes=[*a.nodes, *h.nodes]))


def test_constraint_routes_jobs_in_a_cycle_and_an_impossible_one_gets_bad_constraints() -> None:
    state = _mixed()
    jobs = [PendingJob(f"h{i}", spec(f"h{i}", 4).model_copy(update={"constraint": "h100"}), float(i)) for i in range(4)]
    jobs.append(PendingJob("v", spec("v", 1).model_copy(update={"constraint": "v100"}), 10.0))
    d = schedule_cycle(100.0, state, jobs, [], default_config(), UsageHistory())
    assert sorted(d.placements) == ["h0", "h1", "h2", "h3"]
    assert all(n.startswith("h-") for a in d.placements.values() for n in a.nodes)
    assert d.reasons["v"].code == "BadConstraints" and "'v100'" in d.reasons["v"].message


def test_bad_constraints_wins_over_resources_on_a_full_cluster() -> None:
    w = World(n_nodes=1)
    w.run("big", [(0, list(range(8)))])
    d = _cycle(w, [PendingJob("v", spec("v", 1).model_copy(update={"constraint": "a100"}), 1.0)])
    assert d.reasons["v"].code == "BadConstraints"
