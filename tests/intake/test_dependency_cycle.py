"""`--dependency` chains that loop are refused at submission (issue 13, item 4).

Job ids come from submission ids (`job_id_for`), which a client may choose: a job can name a job not yet submitted,
or its own id. Admission walks the existing jobs' dependencies and refuses the one job that would close a loop."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec
from oneplus_intake.admission import Inadmissible, refuse_dependency_cycle
from oneplus_queueing.dependencies import dependency_cycle


def job(*deps: str, kind: str = "afterok") -> JobSpec:
    return JobSpec.model_validate(
        {"name": "t", "resources": {"gpus": 1}, "dependencies": [{"type": kind, "job_ids": list(deps)}] if deps else []}
    )


def lookup(graph: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    asked: list[str] = []

    async def depends_on(job_id: str) -> list[str] | None:
        asked.append(job_id)
        return graph.get(job_id)

    return depends_on, asked


async def test_a_job_that_closes_a_chain_back_to_itself_is_refused_with_the_chain() -> None:
    # j-a was submitted naming j-c before j-c existed (its id predicted from a chosen submission id).
    depends_on, _ = lookup({"j-a": ["j-c"], "j-b": ["j-a"]})
    with pytest.raises(Inadmissible) as exc:
        await refuse_dependency_cycle("j-c", job("j-b"), depends_on)
    assert str(exc.value) == (
        "--dependency makes a cycle (j-c -> j-b -> j-a -> j-c): the job would wait for itself for ever"
    )


async def test_a_job_that_names_its_own_id_is_refused() -> None:
    depends_on, asked = lookup({})
    with pytest.raises(Inadmissible, match=r"j-self -> j-self"):
        await refuse_dependency_cycle("j-self", job("j-self", kind="afterany"), depends_on)
    assert asked == []  # the new job is not looked up: it does not exist yet


async def test_chains_and_diamonds_without_a_loop_are_admitted_and_each_job_is_read_once() -> None:
    depends_on, asked = lookup({"j-a": ["j-root"], "j-b": ["j-root"], "j-root": []})
    await refuse_dependency_cycle("j-new", job("j-a", "j-b"), depends_on)
    assert sorted(asked) == ["j-a", "j-b", "j-root"]


async def test_unknown_and_ended_jobs_end_the_walk() -> None:
    depends_on, _ = lookup({"j-a": ["j-gone"]})  # j-gone: unknown (or ended: the intake answers None for both)
    await refuse_dependency_cycle("j-new", job("j-a"), depends_on)


def test_the_pure_walk_names_the_loop_or_none() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["new"]}
    assert dependency_cycle("new", job("a"), graph.get) == ["new", "a", "b", "c", "new"]
    assert dependency_cycle("other", job("a"), graph.get) is None
    assert dependency_cycle("new", job(), graph.get) is None
