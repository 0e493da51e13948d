"""Queue config: the tree, guarantees, priority classes and clear errors for bad YAML."""

from __future__ import annotations

import pytest
from oneplus_contracts import JobSpec, RankResources
from oneplus_queueing.config import (
    QueueConfigError,
    UnknownPriorityClass,
    UnknownQueue,
    default_config,
    load_queue_config,
)

TREE = """
queues:
  - {name: research, guarantee_gpus: 48, borrow_limit_gpus: 16, weight: 2}
  - {name: vision, parent: research, guarantee_gpus: 32, borrow_limit_gpus: 8}
  - {name: nlp, parent: research, guarantee_gpus: 16}
  - {name: product, guarantee_gpus: 16}
priority_classes:
  urgent: {value: 1000, preemptible: false}
  normal: {value: 100}
  scavenger: {value: 1}
default_priority_class: normal
preemption: {preemption_delay_s: 30, rate_limit_gangs: 4}
"""


def _spec(queue: str = "vision", **kw: object) -> JobSpec:
    return JobSpec(name="j", queue=queue, resources=RankResources(gpus=1), **kw)


def test_tree_paths_and_leaves() -> None:
    cfg = load_queue_config(TREE)
    assert cfg.path("vision") == ("research", "vision")
    assert cfg.path("product") == ("product",)
    assert sorted(cfg.leaf_queues()) == ["nlp", "product", "vision"]
    assert cfg.children(None) == ["research", "product"]
    assert cfg.queue("vision").limit_gpus == 40
    assert cfg.queue("nlp").limit_gpus == float("inf")
    assert cfg.preemption.preemption_delay_s == 30


def test_default_config_has_one_default_queue_that_accepts_jobs() -> None:
    cfg = default_config()
    assert cfg.leaf_queues() == ["default"]
    cfg.validate_job(_spec("default"))
    assert cfg.priority_of(_spec("default", priority=7)) == 7
    assert load_queue_config("").leaf_queues() == ["default"]


def test_unknown_queue_is_a_clear_error_naming_the_known_ones() -> None:
    cfg = load_queue_config(TREE)
    with pytest.raises(UnknownQueue, match=r"unknown queue 'gpu-hogs'; known queues: nlp, product, research, vision"):
        cfg.validate_job(_spec("gpu-hogs"))


def test_job_on_an_organisation_queue_is_refused_with_its_teams() -> None:
    cfg = load_queue_config(TREE)
    with pytest.raises(QueueConfigError, match=r"organisation queue; submit to one of its teams: nlp, vision"):
        cfg.validate_job(_spec("research"))


def test_priority_class_values_default_class_and_preemptible() -> None:
    cfg = load_queue_config(TREE)
    assert cfg.priority_of(_spec(priority_class="urgent")) == 1000
    assert cfg.priority_of(_spec(priority=5)) == 105  # default class plus the job's own priority
    assert not cfg.preemptible(_spec(priority_class="urgent"))
    assert cfg.preemptible(_spec(priority_class="scavenger"))
    assert not cfg.preemptible(_spec(priority_class="scavenger", preemptible=False))
    with pytest.raises(UnknownPriorityClass, match=r"unknown priority class 'vip'; known classes: normal, scavenger"):
        cfg.validate_job(_spec(priority_class="vip"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("queues: [{name: a}, {name: a}]", r"'a' is defined twice"),
        ("queues: [{name: a, parent: ghost}]", r"'a' has unknown parent 'ghost'"),
        ("queues: [{name: a, parent: b}, {name: b, parent: a}]", r"form a cycle"),
        ("queues: []", r"at least one queue"),
        ("queues: [{name: a, guarantee_gpus: -1}]", r"queues\.0\.guarantee_gpus: Input should be greater"),
        ("queues: [{name: a, weight: 0}]", r"queues\.0\.weight"),
        ("queues: [{name: 'bad name'}]", r"queue name 'bad name'"),
        ("queues: [{name: a, colour: red}]", r"queues\.0\.colour: Extra inputs are not permitted"),
        (
            "queues: [{name: o, guarantee_gpus: 8}, {name: t1, parent: o, guarantee_gpus: 6},"
            " {name: t2, parent: o, guarantee_gpus: 4}]",
            r"children sum to 10 GPUs, more than its own guarantee of 8",
        ),
        ("default_priority_class: high", r"default_priority_class 'high' is not one of the priority_classes"),
        ("queues: [{name: a}]\npreemption: {rate_window_s: 0}", r"preemption\.rate_window_s"),
        ("- just\n- a list", r"must be a mapping with a 'queues' list, got list"),
        ("queues: [{name: a\n", r"not valid YAML"),
    ],
)
def test_bad_queue_config_gets_a_specific_error(text: str, message: str) -> None:
    with pytest.raises(QueueConfigError, match=message):
        load_queue_config(text)
