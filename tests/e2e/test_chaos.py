"""The chaos run of `oneplus.chaos`, short enough for CI (deliverable 6 of the reliability issue).

About 60 gangs of 1-16 GPUs on the demo's 4 nodes while, one after another in a seeded order: the solver is
SIGKILLed and restarted, one executor is SIGKILLed and restarted, the intake or the preemption service is SIGKILLed
and restarted, NATS is SIGKILLed and restarted on its store after 10 s, the solver is SIGSTOPped for 5 s, and last
Redis is SIGKILLed and restarted empty. Its own NATS and Redis (the shared servers are never killed).

Every invariant is checked from the job event stream and the nodes' own heartbeats, not from Redis: every job ends
as it should, no job has two live attempts, no GPU is held by two jobs (events) or used by two ranks (heartbeats),
no dead letter, every service alive, every job record equal to a replay of its events.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from oneplus.chaos import ChaosConfig, ChaosRun, render

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(420)
async def test_no_job_lost_no_gpu_used_twice_nothing_wedged_whatever_fails(tmp_path: Path) -> None:
    cfg = ChaosConfig(gangs=60, seed=1, profile="ci", drain_timeout_s=120.0, workdir=tmp_path / "chaos")
    result = await ChaosRun(cfg).run()
    render(result)
    (tmp_path / "chaos.json").write_text(json.dumps(asdict(result), indent=2))

    kinds = {f["kind"] for f in result.faults}
    assert kinds == {"kill", "pause", "nats-outage", "redis-reset"}, kinds
    assert {f["target"] for f in result.faults if f["kind"] == "kill"} >= {"placement-solver"}
    assert any(f["target"].startswith("executor-") for f in result.faults)
    assert all(f["lasted_s"] >= 10.0 for f in result.faults if f["kind"] == "nats-outage")
    assert result.faults[-1]["kind"] == "redis-reset"
    assert result.jobs["submitted"] == cfg.gangs

    broken = {name: v for name, v in result.invariants.items() if v}
    evidence = json.dumps(result.evidence, indent=1)
    assert not broken, f"{json.dumps(broken, indent=1)}\nlog lines: {evidence}\nlogs in {result.workdir}"
