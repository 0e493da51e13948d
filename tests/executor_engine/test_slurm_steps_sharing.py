"""srun steps side by side, without an engine: each step's share of the allocation (--exact, --overlap, whole nodes),
a step that waits for one, `srun ... &` with `wait` through the real shim, signals, and GPU asks refused."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from oneplus_node_executor.runtime import slurm
from oneplus_node_executor.runtime.slurm import StepServer, _Labeller
from oneplus_node_executor.runtime.slurm_shares import GpuAsk, GpuAskError, Shares, StepClaim, check_gpus
from oneplus_node_executor.runtime.slurm_tasks import NodeTasks
from test_slurm_steps_unit import FakeNodes, batch_launch


def test_a_step_holds_whole_nodes_one_slot_per_task_with_exact_and_nothing_with_overlap() -> None:
    shares = Shares({"n0": 2, "n1": 2})
    assert shares.take(0, StepClaim({"n0": 1})) == {"n0": (0,)}  # without --exact: all of n0 (its task in slot 0)
    assert shares.free_on("n0") == []
    assert shares.take(1, StepClaim({"n0": 1}, exact=True)) is None  # n0 is busy: it waits
    assert shares.take(1, StepClaim({"n1": 1}, exact=True)) == {"n1": (0,)}
    assert shares.take(2, StepClaim({"n1": 1}, exact=True)) == {"n1": (1,)}  # two --exact steps share n1
    assert shares.take(3, StepClaim({"n1": 1}, exact=True)) is None
    assert shares.take(3, StepClaim({"n1": 1})) is None  # a whole node waits for a node nobody uses
    assert shares.take(4, StepClaim({"n0": 2, "n1": 2}, overlap=True)) == {"n0": (0, 1), "n1": (0, 1)}
    assert 4 not in shares.held  # --overlap holds nothing
    claim = StepClaim({"n0": 1}, exact=True)
    assert not shares.node_fits("n0", 1, claim) and not shares.node_fits("n1", 1, claim)
    shares.release(0)
    assert shares.free_on("n0") == [0, 1]
    assert shares.node_fits("n0", 2, StepClaim({}, exact=False))
    assert shares.take(3, StepClaim({"n0": 1})) == {"n0": (0,)}


def test_exact_tasks_share_a_slot_while_its_cpus_last_and_gpu_tasks_hold_its_gpus() -> None:
    # One task of 8 CPUs and its GPU (sbatch --ntasks=1 --cpus-per-task=8 --gpus=1): Slurm runs `srun --exact -c4
    # server &` and `srun --exact -c2 client` side by side, and a third --exact -c4 step waits.
    shares = Shares({"n0": 1}, cpus_per_slot=8)
    assert shares.take(0, StepClaim({"n0": 1}, exact=True, cpus_per_task=4, gpus=True)) == {"n0": (0,)}
    assert shares.take(1, StepClaim({"n0": 1}, exact=True, cpus_per_task=2)) == {"n0": (0,)}
    assert shares.take(2, StepClaim({"n0": 1}, exact=True, cpus_per_task=4)) is None  # 2 CPUs left
    assert shares.take(2, StepClaim({"n0": 1}, exact=True, cpus_per_task=1, gpus=True)) is None  # the GPU is held
    assert shares.take(2, StepClaim({"n0": 1}, exact=True, cpus_per_task=2)) == {"n0": (0,)}
    assert shares.take(3, StepClaim({"n0": 1})) is None  # a step without --exact waits for the whole node
    for step in (0, 1, 2):
        shares.release(step)
    assert shares.take(3, StepClaim({"n0": 1})) == {"n0": (0,)}


@pytest.mark.parametrize(
    ("ask", "said"),
    [
        (GpuAsk(total=9, option="--gpus=9"), "--gpus=9: more GPUs than the job's allocation has .8."),
        (GpuAsk(per_node=5, option="--gpus-per-node=5"), "more GPUs than the job's allocation has per node .4."),
        (GpuAsk(gres=5, option="--gres=gpu:5"), "more GPUs than the job's allocation has per node .4."),
        (GpuAsk(per_task=2, option="--gpus-per-task=2"), "2 GPU.s. per task is more than one task's 1 GPU.s.: each"),
        (GpuAsk(total=4, option="-G 4"), "4 GPU.s. over 2 task.s. is more than one task's 1 GPU.s."),
    ],
)
def test_gpu_asks_the_allocation_cannot_give_are_refused(ask: GpuAsk, said: str) -> None:
    with pytest.raises(GpuAskError, match=said) as caught:
        check_gpus(ask, {"n0": 1, "n1": 1}, gpus_per_slot=1, slots_on={"n0": 4, "n1": 4})
    assert str(caught.value).startswith("srun: error: ") and "\n" not in str(caught.value)


def test_gpu_asks_on_a_job_without_gpus_say_so_and_fitting_ones_pass() -> None:
    with pytest.raises(GpuAskError, match="--gpus=1: the job's allocation has no GPUs"):
        check_gpus(GpuAsk(total=1, option="--gpus=1"), {"n0": 1}, gpus_per_slot=0, slots_on={"n0": 2})
    check_gpus(GpuAsk(total=2, per_task=1, option="x"), {"n0": 2}, gpus_per_slot=1, slots_on={"n0": 2})
    check_gpus(GpuAsk(), {"n0": 2}, gpus_per_slot=0, slots_on={"n0": 2})


def test_labels_wait_for_the_end_of_a_line() -> None:
    labels = _Labeller(True)
    assert labels.feed(0, "out", "par") == ""
    assert labels.feed(1, "out", "one\ntw") == "1: one\n"
    assert labels.feed(0, "out", "tial\nmore") == "0: partial\n"
    assert labels.flush("out") == "0: more\n1: tw\n"
    assert _Labeller(False).feed(0, "out", "as is") == "as is"


def chunks(spool: Path, rid: str, kind: str) -> str:
    """What srun has printed so far on one stream (its numbered chunk files)."""
    out, n = [], 0
    while (spool / f"{rid}.{kind}{n}").exists():
        out.append((spool / f"{rid}.{kind}{n}").read_text())
        n += 1
    return "".join(out)


def sharing_server(spool: Path, fake: FakeNodes) -> StepServer:
    runtime = SimpleNamespace(slurm_tasks=NodeTasks(None))  # type: ignore[arg-type]  # the steps' record only
    return StepServer(runtime, batch_launch("batch-host", 0, [0]), spool, fake.run, fake.release)  # type: ignore[arg-type]


async def until(check: Callable[[], object], timeout_s: float = 20.0) -> None:  # generous: CI hosts run loaded
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_steps_run_side_by_side_in_their_shares_and_one_that_does_not_fit_waits(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    server = sharing_server(spool, fake)  # two nodes (n0, n1), two task slots each

    def run(rid: str, *args: str) -> asyncio.Task[int]:
        return asyncio.create_task(server.step(list(args), "/", {}, slurm.SpoolAnswer(spool, rid)))

    server_step = run("a", "-N1", "-n1", "hold")  # without --exact: all of n0
    await until(lambda: len(fake.steps) == 1)
    client = await run("b", "-N1", "-n1", "echo", "client")  # n0 is busy: it runs on n1, at once
    assert client == 0
    overlap = await run("d", "--overlap", "-n", "4", "echo", "beside")  # shares what the others hold
    assert overlap == 3  # the stand-in's task 1
    whole = run("c", "-N", "2", "echo", "both")  # wants n0 and n1 whole: waits for the server step
    exact_on_n0 = run("e", "--exact", "-n1", "-w", "n0", "echo", "e")  # n0 is held whole: waits too
    await until(lambda: "temporarily disabled" in chunks(spool, "c", "e") and chunks(spool, "e", "e"))
    assert not whole.done() and not exact_on_n0.done()
    assert chunks(spool, "c", "e") == slurm.BUSY
    assert [(node, s.step_id, s.argv[0]) for node, s in fake.steps] == [
        ("n0", 0, "hold"),
        ("n1", 1, "echo"),
        ("n0", 2, "echo"),
        ("n1", 2, "echo"),
    ]
    assert "n0 0 hold" in chunks(spool, "a", "o")  # a running step's output is there while it runs
    fake.let_go()
    assert await asyncio.wait_for(server_step, 5) == 0
    await asyncio.wait_for(asyncio.gather(whole, exact_on_n0), 5)
    assert chunks(spool, "c", "e").startswith(slurm.BUSY + "srun: Step created for StepId=job-1.3\noops\n")
    assert chunks(spool, "e", "e") == slurm.BUSY + "srun: Step created for StepId=job-1.4\n"
    assert server.shares.held == {}
    assert {e.step_id for e in server.records.ends["job-1"]} == {0, 1, 2, 3, 4}  # type: ignore[union-attr]


async def run_script(spool: Path, server: StepServer, script: str, timeout_s: float = 20.0) -> tuple[int, str, str]:
    """A batch script (with the real shim as `srun`) against the step server, served until it ends."""
    shell = shutil.which("sh")
    assert shell is not None
    bin_dir = spool.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").symlink_to(slurm.SHIM_DIR / "srun")
    proc = await asyncio.create_subprocess_exec(
        shell,
        "-c",
        script,
        env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", slurm.SPOOL_ENV: str(spool)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    communicate = asyncio.ensure_future(proc.communicate())

    def serve_once() -> bool:
        for req in sorted(spool.glob("*.req")):
            server._serve(req)
        server._collect_acks()
        return communicate.done()

    await until(serve_once, timeout_s)
    out, err = communicate.result()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_srun_in_the_background_runs_beside_the_next_one_and_wait_waits_for_it(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    server = sharing_server(spool, fake)
    script = (
        "srun -N1 -n1 hold &\n"  # the server step, in the background
        "srun -N1 -n1 client\n"  # the client step: runs while the server runs (on the other node)
        'echo "client exit $?"\n'
        "wait\n"
        'echo "server exit $?"\n'
    )

    async def release_the_server_once_the_client_ran() -> None:
        await until(lambda: any(s.argv == ["client"] for _, s in fake.steps), 15)
        fake.let_go()

    helper = asyncio.create_task(release_the_server_once_the_client_ran())
    code, out, err = await run_script(spool, server, script)
    await helper
    assert code == 0, err
    lines = out.splitlines()
    assert lines.index("client exit 0") < lines.index("server exit 0") == len(lines) - 1
    assert {"n0 0 hold", "n1 0 client"} <= set(lines)
    assert [s.argv for _, s in fake.steps] == [["hold"], ["client"]]


async def test_a_signal_sent_to_srun_reaches_its_tasks_and_srun_waits_for_them(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    server = sharing_server(spool, fake)
    script = 'srun -N1 -n1 hold &\npid=$!\nsleep 0.5\nkill $pid\nwait $pid\necho "srun exit $?"\n'
    code, out, err = await run_script(spool, server, script)
    assert code == 0, err
    assert out.splitlines()[-1] == "srun exit 143"
    assert fake.signals == [("n0", 0, "TERM")]
    assert "srun: error: n0: task 0: Terminated" in err


async def test_the_scripts_end_ends_its_running_steps_and_each_steps_end_is_recorded(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    server = sharing_server(spool, fake)
    done = await server.step(["-n", "1", "echo", "first"], "/", {}, slurm.SpoolAnswer(spool, "1"))
    req = spool / "2.req"
    for i, arg in enumerate(["-N1", "hold"]):
        (spool / f"2.arg{i}").write_text(arg)
    (spool / "2.cwd").write_text("/\n")
    req.write_text("2\nend\n")
    running = server._serve(req)
    assert running is not None
    await until(lambda: len(fake.steps) == 2)
    await server.end_running_steps(kill_wait_s=2.0)
    assert fake.signals == [("n0", 1, "SIGTERM")]
    assert running.done() and (spool / "2.rc").read_text() == "143\n"
    records = server.records
    assert records is not None and done == 0
    assert records.summary("job-1") == "srun steps: 0 exit 0, 1 ended with the batch script (exit 143)"


async def test_a_step_asking_more_gpus_than_the_allocation_is_refused_in_one_line(tmp_path: Path) -> None:
    spool = slurm.prepare_spool(tmp_path, "job-1", 3)
    fake = FakeNodes()
    server = sharing_server(spool, fake)
    server.gpus_per_slot = 1  # two nodes x two slots x one GPU
    code = await server.step(["--gpus=5", "x"], "/", {}, slurm.SpoolAnswer(spool, "9"))
    assert code == 1 and fake.steps == []
    assert chunks(spool, "9", "e") == "srun: error: --gpus=5: more GPUs than the job's allocation has (4)\n"
    code = await server.step(["-c", "4", "--exact", "x"], "/", {}, slurm.SpoolAnswer(spool, "12"))
    assert code == 1  # the job's tasks have 3 CPUs each (#SBATCH --cpus-per-task=3)
    assert chunks(spool, "12", "e") == (
        "srun: error: --cpus-per-task=4: more CPUs per task than each of the allocation's tasks has (3)\n"
    )
    code = await server.step(["--het-group=1", "x"], "/", {}, slurm.SpoolAnswer(spool, "10"))
    assert code == 1 and "is not a heterogeneous job" in chunks(spool, "10", "e")
    assert (
        await server.step(["-n", "2", "--gpus-per-task=1", "--exact", "x"], "/", {}, slurm.SpoolAnswer(spool, "11"))
        == 3
    )


def test_signal_names_and_a_poll_for_a_step_this_node_does_not_run() -> None:
    from oneplus_node_executor.runtime.slurm_tasks import StepEnd, signal_name

    assert [signal_name(s) for s in ("SIGTERM", "usr1", "15", 10)] == ["TERM", "USR1", "TERM", "USR1"]
    with pytest.raises(KeyError):
        signal_name("SIGNOPE")
    tasks = NodeTasks(SimpleNamespace(node="n1"))  # type: ignore[arg-type]
    lost = tasks.poll("job-1", 4, 0)
    assert lost.done and lost.error == "srun: error: step job-1.4 is not running on n1 (its executor restarted?)"
    assert tasks.summary("job-1") is None
    for end in (StepEnd(1, 143, ended_by_script_end=True), StepEnd(0, 0)):
        tasks.record_end("job-1", end)
    assert tasks.summary("job-1") == "srun steps: 0 exit 0, 1 ended with the batch script (exit 143)"
    for i in range(2, 15):
        tasks.record_end("job-1", StepEnd(i, 0))
    assert (
        tasks.summary("job-1", most=3)
        == "srun steps: 0 exit 0, 1 ended with the batch script (exit 143), 2 exit 0, 12 more"
    )
