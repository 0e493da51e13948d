"""The preemption service reads the queue tree as the solver does (one loader): the stored tree, else
ONEPLUS_QUEUES_FILE, else one `default` queue, so both choose by the same guarantees."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from oneplus_preemption.app import Preemption
from oneplus_preemption.settings import PreemptionSettings
from oneplus_queueing.config import QueueConfigError
from oneplus_stores.clusterview import QUEUES_KEY, queue_config_from
from prometheus_client import CollectorRegistry

FILE_TREE = "queues:\n  - {name: research, guarantee_gpus: 16}\n"
STORED_TREE = b"queues:\n  - {name: vision, guarantee_gpus: 8}\n"


def queue_names(config: Any) -> list[str]:
    return sorted(q.name for q in config.queues)


@pytest.fixture
def queues_file(tmp_path: Path) -> Path:
    path = tmp_path / "queues.yaml"
    path.write_text(FILE_TREE)
    return path


def test_the_stored_tree_wins_then_the_file_then_the_default(queues_file: Path) -> None:
    assert queue_names(queue_config_from(STORED_TREE, str(queues_file))) == ["vision"]
    assert queue_names(queue_config_from(None, str(queues_file))) == ["research"]
    assert queue_names(queue_config_from(None, "")) == queue_names(queue_config_from(b"", ""))
    with pytest.raises(QueueConfigError):
        queue_config_from(b"queues: 3\n", str(queues_file))


async def test_preemption_honours_the_queues_file_as_the_solver_does(queues_file: Path) -> None:
    svc = cast(Any, SimpleNamespace(metrics=CollectorRegistry()))
    p = Preemption(svc, PreemptionSettings.load({"ONEPLUS_QUEUES_FILE": str(queues_file)}))
    await p.on_queues(QUEUES_KEY, STORED_TREE)
    assert queue_names(p.config) == ["vision"]
    await p.on_queues(QUEUES_KEY, None)  # the stored tree deleted: back to the file, not to one `default` queue
    assert queue_names(p.config) == ["research"]
