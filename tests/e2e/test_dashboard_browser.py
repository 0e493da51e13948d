"""The dashboard (/ui/) in headless Chromium against a running platform: the cluster tree with holders coloured and
fragmentation shown, the queue with a pending job's reason and explain, a job's page, and a live update; a pending
job's page (reason, explanation, waiting time), a 0.5-GPU share drawn as a share.

Screenshots go to $ONEPLUS_TEST_ARTIFACTS/dashboard/ (default tests/artifacts/dashboard/). Debian's `chromium` is
driven by Playwright's Python package (no `playwright install`); without a chromium binary the test is skipped.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from oneplus_contracts import JobSpec
from oneplus_testing import Servers
from platform_fixture import fresh_platform

from oneplus.client import OnePlusClient

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = (
    os.environ.get("ONEPLUS_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
    or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def artefacts() -> Path:
    base = Path(os.environ.get("ONEPLUS_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts")
    out = base / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spec(name: str, gpus: float, model: str) -> JobSpec:
    return JobSpec(
        name=name,
        team="vision",
        user="ada",
        preemptible=False,
        resources={"gpus": gpus, "gpu_models": [model]},
        simulate={"duration_s": 600},
    )


async def wait_states(c: OnePlusClient, ids: Iterable[str], states: set[str], timeout: float = 90.0) -> None:
    wanted = set(ids)
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        seen = {r.job_id: r.state for r in await c.list_jobs() if r.job_id in wanted}
        if len(seen) == len(wanted) and set(seen.values()) <= states:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"jobs not {states} after {timeout}s: {seen}")


async def wait_pending_with_reason(c: OnePlusClient, job_id: str, timeout: float = 60.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        rows = [r for r in await c.queue() if r["job_id"] == job_id]
        if rows and rows[0]["st"] == "PD" and rows[0].get("reason"):
            return rows[0]
        await asyncio.sleep(0.3)
    raise AssertionError(f"{job_id} not pending with a reason after {timeout}s: {rows}")


@asynccontextmanager
async def browser(profile: Path) -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    assert CHROMIUM is not None
    async with async_playwright() as pw:
        ctx = await pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield ctx
        finally:
            await ctx.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install -y chromium)")
async def test_dashboard_shows_cluster_queue_job_and_live_updates(servers: Servers, tmp_path: Path) -> None:
    port = free_port()
    shots = artefacts()
    env = {"ONEPLUS_HTTP_PORT": str(port), "ONEPLUS_HTTP_HOST": "127.0.0.1"}
    async with (
        fresh_platform(servers.nats_url, servers.redis_url, tmp_path, **env) as (platform, _bus, _store),
        OnePlusClient.connect(servers.nats_url) as c,
    ):
        ids: dict[str, str] = {}
        for name, gpus, model in (("train-a", 4, "H100"), ("train-b", 8, "H100"), ("infer-c", 2, "L40S")):
            reply = await c.submit(spec(name, gpus, model), msg_id=f"dash-{name}")
            assert reply.ok, reply.error
            ids[name] = str(reply.job_id)
        await wait_states(c, ids.values(), {"RUNNING"})
        # Both H100 nodes are taken (4 + 8): another 8-GPU H100 gang has to wait.
        reply = await c.submit(spec("wait-p", 8, "H100"), msg_id="dash-wait-p")
        assert reply.ok, reply.error
        pending = str(reply.job_id)
        row = await wait_pending_with_reason(c, pending)

        async with browser(tmp_path / "chromium-profile") as ctx:
            page = await ctx.new_page()  # type: ignore[attr-defined]
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"http://127.0.0.1:{port}/ui/")

            # --- the cluster: leaves → nodes → domains → GPUs, holders coloured --------------------------------
            for job_id in ids.values():
                await page.wait_for_selector(f'#cluster-leaves .gpu.held[data-job="{job_id}"]', timeout=20_000)
            leaves = await page.eval_on_selector_all("#cluster-leaves .leaf", "els => els.map(e => e.dataset.leaf)")
            assert leaves == ["leaf-0", "leaf-1"]
            nodes = await page.eval_on_selector_all("#cluster-leaves .node", "els => els.map(e => e.dataset.node)")
            assert sorted(nodes) == ["a100-0", "h100-0", "h100-1", "l40s-0"]
            assert await page.locator("#cluster-leaves .gpu").count() == 32
            domains = await page.eval_on_selector_all(
                "#cluster-leaves .domain", "els => els.map(e => [e.dataset.domain, e.dataset.state])"
            )
            by_id = dict(domains)
            assert by_id["l40s-0/pcie"] == "fragmented"  # 2 of 8 PCIe GPUs held, 6 left beside them
            h100_states = sorted(by_id[f"h100-{i}/nv0"] for i in (0, 1))
            assert h100_states == ["fragmented", "full"], by_id
            assert by_id["a100-0/nv0"] == "idle"
            for job_id, gpus in ((ids["train-a"], 4), (ids["train-b"], 8), (ids["infer-c"], 2)):
                cells = page.locator(f'#cluster-leaves .gpu.held[data-job="{job_id}"]')
                assert await cells.count() == gpus
                colours = set(await cells.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)"))
                legend = page.locator(f'#cluster-legend .legend-item[data-job="{job_id}"] .swatch')
                assert colours == {await legend.evaluate("e => getComputedStyle(e).backgroundColor")}
            colour_a = await page.locator(f'.gpu[data-job="{ids["train-a"]}"]').first.evaluate(
                "e => getComputedStyle(e).backgroundColor"
            )
            colour_free = await page.locator('.gpu[data-state="free"]').first.evaluate(
                "e => getComputedStyle(e).backgroundColor"
            )
            assert colour_a != colour_free
            summary = await page.inner_text("#cluster-summary")
            assert "32 GPUs" in summary and "14 held" in summary and "fragmented" in summary
            assert await page.get_attribute("#cluster-summary .levels", "data-levels") == "leaf,spine"
            # The site's level tree (placement's): spine-0 holds both leaves, each with the GPUs its jobs hold.
            groups = await page.eval_on_selector_all(
                "#cluster-leaves .group",
                "els => els.map(e => [e.dataset.level, e.dataset.group, +e.dataset.gpus, +e.dataset.inUse])",
            )
            assert groups == [["spine", "spine-0", 32, 14], ["leaf", "leaf-0", 16, 12], ["leaf", "leaf-1", 16, 2]]
            under = '#cluster-leaves .group[data-group="spine-0"] .group[data-group="leaf-0"] .node'
            assert await page.eval_on_selector_all(under, "els => els.map(e => e.dataset.node)") == ["h100-0", "h100-1"]
            await page.screenshot(path=str(shots / "cluster.png"), full_page=True)

            # --- live: a job submitted now shows up without a reload -----------------------------------------
            marker = await page.evaluate("() => (window.__loaded = Date.now())")
            reply = await c.submit(spec("late-d", 4, "A100"), msg_id="dash-late-d")
            assert reply.ok, reply.error
            late = str(reply.job_id)
            await page.wait_for_selector(f'#cluster-leaves .gpu.held[data-job="{late}"]', timeout=30_000)
            assert await page.evaluate("() => window.__loaded") == marker, "the page was reloaded"
            assert await page.locator(f'.gpu.held[data-job="{late}"]').count() == 4
            assert await page.get_attribute('.domain[data-domain="a100-0/nv0"]', "data-state") == "fragmented"
            # --- a 0.5-GPU share: drawn as half a tile, counted as shared --------------------------------------
            reply = await c.submit(spec("share-e", 0.5, "A100"), msg_id="dash-share-e")
            assert reply.ok, reply.error
            share = str(reply.job_id)
            tile = page.locator(f'#cluster-leaves .gpu.shared[data-job="{share}"]')
            await tile.wait_for(timeout=30_000)
            assert await tile.get_attribute("data-held-milli") == "500"
            fill = await tile.evaluate("e => getComputedStyle(e).backgroundImage")
            assert "linear-gradient" in fill and "50%" in fill, fill
            assert "1 shared" in await page.inner_text('.node[data-node="a100-0"] .node-foot')
            await page.screenshot(path=str(shots / "cluster-live.png"), full_page=True)

            # --- the queue: the pending job, its reason, its explain ------------------------------------------
            await page.click('nav a[data-nav="queue"]')
            pending_row = page.locator(f'#pending tr[data-job="{pending}"]')
            await pending_row.wait_for(timeout=15_000)
            assert (await pending_row.locator("td.reason").inner_text()).strip() == row["reason"]
            await pending_row.locator("button.explain-btn").click()
            explain = page.locator(f'.explain[data-job="{pending}"] dl')
            await explain.wait_for(timeout=15_000)
            text = await explain.inner_text()
            assert "message" in text and "needs GPUs" in text and "8" in text, text
            assert await page.locator(f'#holding tr[data-job="{ids["train-a"]}"]').count() == 1
            # An advance reservation to come shows in the Reservations table (deleted again: it would keep jobs
            # without a time limit off its node).
            from oneplus_contracts.advance import AdvanceReservationRequest

            await c.create_reservation(
                AdvanceReservationRequest(name="dash-maint", gpus=8, start_ts=time.time() + 7200,
                                          end_ts=time.time() + 10800, teams=["ops"], maint=True)
            )  # fmt: skip
            res_row = page.locator('#reservations tr[data-reservation="dash-maint"]')
            await res_row.wait_for(timeout=15_000)
            assert (await res_row.locator("td.reservation-state").inner_text()).strip() == "WAITING"
            assert (await res_row.locator("td.waiting").inner_text()).strip() == "0"
            assert await c.delete_advance_reservation("dash-maint")
            # Its waiting time counts from its submission (it stayed 0:00).
            await page.wait_for_function(
                f"""() => {{ const td = document.querySelector('#pending tr[data-job="{pending}"] td:nth-child(6)');
                          return td && /^[0-9]+:[0-9]{{2}}/.test(td.textContent) && td.textContent !== "0:00"; }}""",
                timeout=15_000,
            )
            await page.screenshot(path=str(shots / "queue.png"), full_page=True)

            # --- the pending job's page: its reason, its explanation, how long it has waited ---------------------
            await page.click(f'#pending a[data-job="{pending}"]')
            box = page.locator(f'#job-placement .pending[data-job="{pending}"]')
            await box.wait_for(timeout=15_000)
            assert await box.locator(".pending-reason").get_attribute("data-reason") == row["reason"]
            text = await box.inner_text()
            assert "waiting" in text and "since submission" in text and "not placed" not in text, text
            facts = await box.locator(".explain dl").inner_text()
            assert "needs GPUs" in facts and "message" in facts, facts
            await page.screenshot(path=str(shots / "job-pending.png"), full_page=True)

            # --- the share's page: a share of one GPU, no "ring 0 GB/s" ----------------------------------------
            await page.goto(f"http://127.0.0.1:{port}/ui/#/job/{share}")
            await page.wait_for_selector('#job-placement tr[data-rank="0"]', timeout=15_000)
            placement = await page.inner_text("#job-placement")
            assert "a share of one GPU (50%), no ring" in placement and "ring 0" not in placement, placement

            # --- a job's page: placement, timeline, events in order --------------------------------------------
            await page.click('nav a[data-nav="queue"]')
            await page.click(f'#holding a[data-job="{ids["train-a"]}"]')
            # The share's page was showing a RUNNING job too: wait until the page is train-a's before reading it.
            await page.wait_for_function(
                f"""() => (document.querySelector('#job-head')?.textContent || '').includes('{ids["train-a"]}')""",
                timeout=15_000,
            )
            await page.wait_for_selector('#job-events tr[data-type="running"]', timeout=15_000)
            head = await page.inner_text("#job-head")
            assert ids["train-a"] in head and "RUNNING" in head and "train-a" in head
            types = await page.eval_on_selector_all("#job-events tr.event", "els => els.map(e => e.dataset.type)")
            order = [t for t in types if t in ("accepted", "placed", "running")]
            assert order[:2] == ["accepted", "placed"] and "running" in order, types
            seqs = await page.eval_on_selector_all(
                "#job-events tr.event td:first-child", "els => els.map(e => +e.textContent)"
            )
            assert seqs == sorted(seqs)
            steps = await page.eval_on_selector_all("#job-timeline li", "els => els.map(e => e.dataset.step)")
            assert steps[:3] == ["submitted", "placed", "started"]
            assert await page.locator("#job-placement tr[data-rank]").count() == 1
            await page.wait_for_selector(f'#job-map .gpu[data-job="{ids["train-a"]}"]', timeout=10_000)
            assert await page.locator(f'#job-map .gpu[data-job="{ids["train-a"]}"]').count() == 4
            # Its nodes in the level tree, cut down to them.
            assert await page.eval_on_selector_all("#job-map .group", "els => els.map(e => e.dataset.group)") == [
                "spine-0",
                "leaf-0",
            ]
            await page.screenshot(path=str(shots / "job.png"), full_page=True)

            # --- its node's page: where the node sits in the tree; no MIG table on a node without MIG -----------
            await page.click("#job-map .node-link")
            await page.wait_for_selector("#node-head .path-step", timeout=10_000)
            path = await page.eval_on_selector_all(
                "#node-head .path-step", "els => els.map(e => [e.dataset.level, e.dataset.group])"
            )
            assert path == [["spine", "spine-0"], ["leaf", "leaf-0"]]
            assert await page.locator(f'#node-card .gpu[data-job="{ids["train-a"]}"]').count() == 4
            assert await page.locator("#node-mig").is_hidden()
            await page.screenshot(path=str(shots / "node.png"), full_page=True)

            assert errors == [], errors
        assert platform.dead() == {}
