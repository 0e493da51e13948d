"""A synthetic job's container script, run by the same busybox shell the demo image holds (no engine needed)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest
from executor_fakes import spec
from oneplus_contracts import LaunchRanks, RankPlacement
from oneplus_node_executor.runtime.container_spec import container_body
from oneplus_node_executor.runtime.synthetic import synthetic_command, synthetic_script

BUSYBOX = Path("/bin/busybox")
needs_busybox = pytest.mark.skipif(
    not BUSYBOX.exists(), reason="/bin/busybox is absent (apt-get install busybox-static)"
)


async def run(script: str, marker: Path, *, signal_after: float | None = None) -> tuple[int, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        str(BUSYBOX),
        "sh",
        "-c",
        script,
        stdout=subprocess.PIPE,
        env={**os.environ, "ONEPLUS_CHECKPOINT_MARKER": str(marker)},
    )
    if signal_after is not None:
        await asyncio.sleep(signal_after)
        proc.send_signal(signal.SIGUSR1)
    out, _ = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode is not None
    return proc.returncode, out.decode().splitlines()


@needs_busybox
async def test_the_script_sleeps_its_duration_and_exits_with_its_code(tmp_path: Path) -> None:
    job = spec(command=["python", "train.py"], simulate={"duration_s": 0.3, "exit_code": 3})
    code, lines = await run(synthetic_script(job), tmp_path / "ck")
    assert code == 3
    assert lines == ["simulated run of python train.py: 0.3 s, then exit 3", "exited 3"]


@needs_busybox
async def test_the_checkpoint_signal_writes_the_marker_and_the_run_goes_on_to_its_end(tmp_path: Path) -> None:
    marker = tmp_path / "ck"
    job = spec(simulate={"duration_s": 1.0, "checkpoint_after_s": 0.1})
    code, lines = await run(synthetic_script(job), marker, signal_after=0.3)
    assert code == 0
    assert lines[1:] == [f"checkpoint written to {marker}", "exited 0"]
    assert marker.read_text().strip().isdigit()


@needs_busybox
async def test_a_job_that_never_checkpoints_ignores_the_signal_and_writes_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ck"
    job = spec(simulate={"duration_s": 0.6, "checkpoint_after_s": None})
    script = synthetic_script(job)
    assert "USR1" not in script
    # Not PID 1 here, so an untrapped SIGUSR1 would kill the shell: trap it away as PID 1 would ignore it.
    code, lines = await run("trap '' USR1\n" + script, marker, signal_after=0.2)
    assert code == 0 and not marker.exists()
    assert lines[-1] == "exited 0"


def test_the_exit_code_is_one_byte_as_the_engine_reports_it_and_the_signal_name_is_the_specs() -> None:
    script = synthetic_script(spec(simulate={"exit_code": 257}, checkpoint={"signal": "SIGUSR2"}))
    assert script.endswith("exit 1") and " USR2\n" in script


@needs_busybox
async def test_a_resumed_run_sleeps_only_the_work_left_after_its_checkpoint(tmp_path: Path) -> None:
    job = spec(simulate={"duration_s": 30.0})
    started = asyncio.get_running_loop().time()
    code, lines = await run(synthetic_script(job, resume_progress_s=29.8), tmp_path / "ck")
    assert code == 0 and asyncio.get_running_loop().time() - started < 5
    assert (
        lines[0]
        == "simulated run of (no command): 0.2 s, then exit 0 (resumed: 29.8 s were done before the last checkpoint)"
    )


def test_a_job_without_simulate_has_no_synthetic_script() -> None:
    with pytest.raises(ValueError, match="has no `simulate` section"):
        synthetic_script(spec(command=["sh", "-c", "true"]))


def launch_of(**extra: object) -> LaunchRanks:
    return LaunchRanks(
        job_id="j-1",
        node="n",
        token=1,
        spec=spec(**extra),
        ranks=[RankPlacement(rank=0, node="n", gpus=[0])],
        world_size=1,
        node_rank=0,
        nodes=["n"],
        master_addr="127.0.0.1",
    )


def test_the_container_runs_the_script_for_a_synthetic_job_and_the_command_otherwise() -> None:
    cmd = launch_of(command=["python", "train.py"], simulate={"duration_s": 2})
    cmd.resume_progress_s = 1.5
    body = container_body(
        cmd, cmd.ranks[0], {}, local_rank=0, gpu_node=False, network_mode="none", cpuset=None, nano_cpus=None
    )
    assert body["Cmd"] == synthetic_command(cmd.spec, 1.5)
    assert "sleep 0.5 &" in body["Cmd"][2]
    real = launch_of(command=["python", "train.py"])
    body = container_body(
        real, real.ranks[0], {}, local_rank=0, gpu_node=False, network_mode="none", cpuset=None, nano_cpus=None
    )
    assert body["Cmd"] == ["python", "train.py"]
