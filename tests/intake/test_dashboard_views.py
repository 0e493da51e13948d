"""The dashboard's views without a browser or a bus: the cluster tree, its counts and fragmentation, the queue split,
a job's page, the cache in front of the platform, and the routes' answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from oneplus_contracts import (
    Allocation,
    GpuLink,
    JobRecord,
    JobSpec,
    NodeRecord,
    NodeTopology,
    RankPlacement,
)
from oneplus_contracts.topology import GpuInfo
from oneplus_intake.dashboard import STATIC_DIR, Dashboard, DashboardError, DashboardSource
from oneplus_intake.dashboard.source import TtlCache
from oneplus_intake.dashboard.views import (
    HUES,
    _slot_of,
    cluster_view,
    colour_of,
    job_colours,
    job_view,
    node_detail,
    pending_view,
    queue_view,
)
from oneplus_placement.tree import build_levels
from oneplus_topology import degrade, load_preset
from oneplus_topology.cluster import load_cluster
from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing

ROOT = Path(__file__).resolve().parents[2]
NVL72 = ROOT / "bench" / "clusters" / "nvl72_2rack_h100.yaml"
MIG_LISTING = ROOT / "data" / "topologies" / "dgx_a100_8gpu_mig_smi_L.txt"

NOW = 1_700_000_000.0


def node(preset: str, name: str, leaf: str | None, **kw: Any) -> NodeRecord:
    topo = load_preset(preset, node=name).model_copy(update={"leaf": leaf, "spine": "spine-0" if leaf else None})
    return NodeRecord(topology=topo, **kw)


def job(job_id: str, state: str, placement: dict[str, list[int]] | None, milli: int = 0, **kw: Any) -> JobRecord:
    gpus = sum(len(g) for g in (placement or {}).values()) or 1
    alloc = None
    if placement is not None:
        ranks = [
            RankPlacement(rank=i, node=n, gpus=g, gpu_milli=milli) for i, (n, g) in enumerate(sorted(placement.items()))
        ]
        alloc = Allocation(ranks=ranks, domain="node" if len(ranks) == 1 else "leaf")
    spec = JobSpec(name=f"n-{job_id}", resources={"gpus": gpus}, ranks=1)
    return JobRecord(
        job_id=job_id,
        spec=spec,
        state=state,
        submitted_ts=NOW - 60,
        updated_ts=NOW,
        allocation=alloc,
        token=7 if alloc else None,
        **kw,
    )


def two_pairs(name: str = "pairs-0") -> NodeRecord:
    """Four GPUs in two NVLink pairs, (0,1) and (2,3), PCIe between the pairs: two NVLink domains."""
    gpus = [GpuInfo(index=i, name="H100", nvlinks_total=4, nvlinks_active=4) for i in range(4)]
    links = []
    for a in range(4):
        for b in range(a + 1, 4):
            paired = (a, b) in ((0, 1), (2, 3))
            links.append(
                GpuLink(
                    a=a, b=b, kind="NV4" if paired else "SYS", nvlinks=4 if paired else 0, gbps=100 if paired else 10
                )
            )
    topo = NodeTopology(node=name, gpu_model="H100", gpus=gpus, links=links, leaf="leaf-9")
    return NodeRecord(topology=topo)


def domain(view: dict[str, Any], domain_id: str) -> dict[str, Any]:
    for leaf in view["leaves"]:
        for n in leaf["nodes"]:
            for d in n["domains"]:
                if d["id"] == domain_id:
                    found: dict[str, Any] = d
                    return found
    raise AssertionError(f"no domain {domain_id}")


def test_cluster_tree_holders_health_and_fragmentation() -> None:
    nodes = [
        node("l40s_8gpu_pcie_node_sys", "l40s-0", "leaf-1", unhealthy_gpus=[5]),
        node("h100_sxm_8gpu_nvswitch_nv18", "h100-1", "leaf-0"),
        node("h100_sxm_8gpu_nvswitch_nv18", "h100-0", "leaf-0"),
    ]
    jobs = [
        job("j-a", "RUNNING", {"h100-0": [0, 1, 2, 3]}),
        job("j-b", "PLACED", {"l40s-0": [0]}),
        job("j-done", "SUCCEEDED", {"h100-1": [0, 1]}),  # finished: holds nothing any more
        job("j-wait", "ACCEPTED", None),
    ]
    view = cluster_view(nodes, jobs, NOW)

    assert [leaf["name"] for leaf in view["leaves"]] == ["leaf-0", "leaf-1"]
    assert [n["name"] for n in view["leaves"][0]["nodes"]] == ["h100-0", "h100-1"]
    busy = domain(view, "h100-0/nv0")
    assert busy["kind"] == "nvlink"
    assert len(busy["gpus"]) == 8
    assert (busy["held"], busy["free"], busy["fragmented"], busy["state"]) == (4, 4, 4, "fragmented")
    assert busy["largest_free_nvlink_group"] == 4
    assert [g["job_id"] for g in busy["gpus"]] == ["j-a"] * 4 + [None] * 4
    assert busy["gpus"][0]["holders"] == [{"job_id": "j-a", "token": 7, "state": "RUNNING", "rank": 0, "milli": 1000}]
    idle = domain(view, "h100-1/nv0")
    assert (idle["held"], idle["free"], idle["fragmented"], idle["state"]) == (0, 8, 0, "idle")

    # No NVLink on an L40S node: its GPUs are one PCIe group, with the unhealthy GPU marked.
    pcie = domain(view, "l40s-0/pcie")
    assert pcie["kind"] == "pcie"
    assert (pcie["held"], pcie["unhealthy"], pcie["free"], pcie["fragmented"]) == (1, 1, 6, 6)
    bad = pcie["gpus"][5]
    assert (bad["state"], bad["health"]) == ("unhealthy", "unhealthy")

    s = view["summary"]
    assert (s["nodes"], s["leaves"], s["total"], s["held"], s["free"], s["unhealthy"]) == (3, 2, 24, 5, 18, 1)
    assert s["fragmented"] == 10
    assert s["frag_pct"] == round(100 * 10 / 18, 1)
    assert s["domains"] == {"fragmented": 2, "idle": 1}
    leaf0 = view["leaves"][0]
    assert (leaf0["held"], leaf0["free"], leaf0["fragmented"], leaf0["frag_pct"]) == (4, 12, 4, 33.3)
    assert set(view["jobs"]) == {"j-a", "j-b"}
    assert view["jobs"]["j-a"]["colour"] == colour_of("j-a") != colour_of("j-b")
    assert view["jobs"]["j-a"]["gpus"] == 4


def test_a_job_filling_one_of_two_domains_leaves_nothing_fragmented() -> None:
    n = two_pairs()
    whole = cluster_view([n], [job("j-x", "RUNNING", {"pairs-0": [0, 1]})], NOW)
    d0, d1 = domain(whole, "pairs-0/nv0"), domain(whole, "pairs-0/nv1")
    assert (d0["state"], d0["held"], d0["free"]) == ("full", 2, 0)
    assert (d1["state"], d1["held"], d1["free"], d1["fragmented"]) == ("idle", 0, 2, 0)
    assert whole["summary"]["fragmented"] == 0

    split = cluster_view([n], [job("j-x", "RUNNING", {"pairs-0": [1, 2]})], NOW)
    assert [domain(split, f"pairs-0/nv{i}")["state"] for i in (0, 1)] == ["fragmented", "fragmented"]
    assert split["summary"]["fragmented"] == 2
    assert split["summary"]["frag_pct"] == 100.0


def test_degraded_gpu_leaves_its_domain_and_shared_gpus_list_every_holder() -> None:
    topo = degrade(load_preset("h100_4gpu_nv6", node="deg-0"), 3, 0)
    n = NodeRecord(topology=topo.model_copy(update={"leaf": "leaf-0"}))
    jobs = [job("j-1", "RUNNING", {"deg-0": [0]}, milli=500), job("j-2", "STARTING", {"deg-0": [0]}, milli=500)]
    view = cluster_view([n], jobs, NOW)
    nv = domain(view, "deg-0/nv0")
    assert [g["index"] for g in nv["gpus"]] == [0, 1, 2]
    assert [h["job_id"] for h in nv["gpus"][0]["holders"]] == ["j-1", "j-2"]
    assert nv["gpus"][0]["holders"][0]["milli"] == 500
    out = domain(view, "deg-0/pcie")
    assert [(g["index"], g["state"], g["health"]) for g in out["gpus"]] == [(3, "free", "degraded")]


def test_unschedulable_node_shows_its_free_gpus_as_unavailable() -> None:
    n = node("h100_4gpu_nv6", "cord-0", "leaf-0", cordoned=True)
    view = cluster_view([n], [job("j-1", "PREEMPTING", {"cord-0": [0]})], NOW)
    d = domain(view, "cord-0/nv0")
    assert (d["held"], d["free"], d["unavailable"], d["fragmented"], d["state"]) == (1, 0, 3, 0, "full")
    assert view["leaves"][0]["nodes"][0]["cordoned"] is True
    alone = cluster_view([n], [], NOW)
    assert domain(alone, "cord-0/nv0")["state"] == "down"


def test_dgx1_largest_free_group_is_smaller_than_the_free_count() -> None:
    n = node("dgx1_v100", "v100-0", "leaf-0")
    # The hybrid cube mesh: one NVLink domain, all-to-all groups of four. Take one GPU from each group.
    view = cluster_view([n], [job("j-1", "RUNNING", {"v100-0": [0, 4]})], NOW)
    d = domain(view, "v100-0/nv0")
    assert d["free"] == 6
    assert d["largest_free_nvlink_group"] == 3


def test_queue_view_splits_pending_from_holders() -> None:
    rows: list[dict[str, Any]] = [
        {"job_id": "j-r", "st": "R", "name": "a", "gpus": "8", "where": "h100-0", "reason": None, "message": None},
        {"job_id": "j-p", "st": "PD", "name": "b", "gpus": "16", "where": "(Resources)", "reason": "Resources"},
    ]
    q = queue_view(rows, NOW)
    assert [r["job_id"] for r in q["pending"]] == ["j-p"]
    assert q["pending"][0]["reason"] == "Resources"
    assert [r["job_id"] for r in q["holding"]] == ["j-r"]
    assert q["holding"][0]["colour"] == colour_of("j-r")
    assert q["reservations"] == []


def test_queue_view_shows_reservations_active_or_to_come_with_the_jobs_waiting_on_each() -> None:
    from oneplus_contracts.advance import AdvanceReservation
    from oneplus_queueing.advance import window_rows

    rows: list[dict[str, Any]] = [
        {"job_id": "j-w", "st": "PD", "name": "w", "gpus": "8", "where": "(Reservation)", "reason": "Reservation",
         "message": "waiting for reservation maint to start at X (in 1h 00m)"},
    ]  # fmt: skip
    made = [
        AdvanceReservation(name="maint", nodes=["h100-0"], start_ts=NOW + 3600, end_ts=NOW + 7200, teams=["ops"],
                           maint=True),
        AdvanceReservation(name="past", nodes=["h100-1"], start_ts=NOW - 7200, end_ts=NOW - 3600, users=["ana"]),
        AdvanceReservation(name="now", nodes=["h100-1"], start_ts=NOW - 60, end_ts=NOW + 60, users=["ana"], gpus=8),
    ]  # fmt: skip
    q = queue_view(rows, NOW, None, window_rows(NOW, made))
    assert [(r["name"], r["state"], r["waiting"], r["gpus"], r["maint"]) for r in q["reservations"]] == [
        ("now", "ACTIVE", 0, 8, False),
        ("maint", "WAITING", 1, None, True),
    ]


def test_job_view_placement_timeline_and_events_in_order() -> None:
    rec = job("j-a", "RUNNING", {"h100-0": [0, 1], "h100-1": [0, 1]}, placed_ts=NOW - 59.5, started_ts=NOW - 59)
    events = [
        {"seq": 3, "type": "submitted", "ts": NOW - 60, "source": "cli"},
        {"seq": 5, "type": "accepted", "ts": NOW - 59.9, "warnings": ["w1"]},
        {
            "seq": 9,
            "type": "placed",
            "ts": NOW - 59.5,
            "token": 7,
            "attempt": 1,
            "allocation": {"domain": "leaf", "ranks": [{"node": "h100-0", "gpus": [0, 1]}]},
        },
        {"seq": 12, "type": "running", "ts": NOW - 59, "node": "h100-0", "token": 7},
    ]
    v = job_view(rec, events, NOW)
    assert v["placement"]["nodes"] == ["h100-0", "h100-1"]
    assert [(r["node"], r["gpus"]) for r in v["placement"]["ranks"]] == [("h100-0", [0, 1]), ("h100-1", [0, 1])]
    assert v["holding"] is True
    assert [m["step"] for m in v["timeline"]] == ["submitted", "placed", "started"]
    assert v["timeline"][1]["after_s"] == 0.5
    assert [e["seq"] for e in v["events"]] == [3, 5, 9, 12]
    assert v["events"][2]["summary"].startswith("on leaf h100-0:0,1; token 7")
    assert "warnings: w1" in v["events"][1]["summary"]
    assert v["events"][3]["after_s"] == 1.0


def _hue(colour: str) -> int:
    return int(colour.removeprefix("hsl(").split(",")[0])


def test_jobs_on_one_node_get_distinct_colours_even_when_their_ids_hash_alike() -> None:
    """Two jobs whose ids give the same hue (a hash alone drew them nearly alike) are coloured at least 45 degrees
    apart when they share a node; a job alone keeps its own colour; the queue and job pages use the same colours."""
    first = "j-000000000000"
    twin = next(f"j-{i:012d}" for i in range(1, 10_000) if _slot_of(f"j-{i:012d}") == _slot_of(first))
    assert colour_of(first) == colour_of(twin)
    a = job(first, "RUNNING", {"h100-0": [0, 1]}, placed_ts=NOW - 30)
    b = job(twin, "RUNNING", {"h100-0": [2, 3]}, placed_ts=NOW - 20)
    c = job("j-elsewhere", "RUNNING", {"h100-1": [0]}, placed_ts=NOW - 10)
    colours = job_colours([b, c, a])
    assert colours[first] == colour_of(first), "the older job keeps its own colour"
    apart = abs(_hue(colours[first]) - _hue(colours[twin])) % 360
    assert min(apart, 360 - apart) >= 45
    assert colours["j-elsewhere"] == colour_of("j-elsewhere")
    view = cluster_view([node("h100_sxm_8gpu_nvswitch_nv18", "h100-0", "leaf-0")], [a, b], NOW)
    assert view["jobs"][twin]["colour"] == colours[twin]
    rows = [{"job_id": twin, "st": "R"}]
    assert queue_view(rows, NOW, colours)["holding"][0]["colour"] == colours[twin]
    assert job_view(b, [], NOW, colour=colours[twin])["colour"] == colours[twin]
    # Eight jobs on one 8-GPU node: every pair at least 22.5 degrees apart (16 hues).
    many = [job(f"j-m{i}", "RUNNING", {"h100-0": [i]}, placed_ts=NOW - i) for i in range(8)]
    hues = sorted(_hue(v) for v in job_colours(many).values())
    assert len(set(hues)) == 8 and HUES == 16


def test_a_gpu_share_is_drawn_as_a_share_and_counted_once() -> None:
    """A 0.5-GPU job holds half of its GPU: the GPU says how much is held, and is counted held and shared, not free
    (the CLI's `nodes` counts it the same way)."""
    n = node("l40s_8gpu_pcie_node_sys", "l40s-0", "leaf-1")
    view = cluster_view([n], [job("j-half", "RUNNING", {"l40s-0": [3]}, milli=500)], NOW)
    pcie = domain(view, "l40s-0/pcie")
    gpu = pcie["gpus"][3]
    assert (gpu["state"], gpu["held_milli"]) == ("held", 500)
    assert (pcie["free"], pcie["held"], pcie["shared"]) == (7, 1, 1)
    whole = cluster_view([n], [job("j-w", "RUNNING", {"l40s-0": [3]})], NOW)
    assert domain(whole, "l40s-0/pcie")["shared"] == 0
    assert domain(whole, "l40s-0/pcie")["gpus"][3]["held_milli"] == 1000
    js = (STATIC_DIR / "dashboard.js").read_text()
    assert "linear-gradient(to top" in js and "no ring" in js  # drawn as a share; no "ring 0 GB/s"


def test_a_pending_jobs_page_says_why_it_waits_and_since_when() -> None:
    rec = job("j-wait", "ACCEPTED", None)
    explain = {
        "pending": True,
        "reason": "Resources",
        "message": "Resources: needs 16 GPUs; 3 are free",
        "level": "cluster",
    }
    v = job_view(rec, [], NOW, explain=explain)
    assert v["pending"]["reason"] == "Resources"
    assert v["pending"]["message"] == "Resources: needs 16 GPUs; 3 are free"
    assert v["pending"]["waiting_s"] == 60.0  # since submission
    assert v["pending"]["explain"]["level"] == "cluster"
    away = pending_view(rec, {"error": "oneplus.ops.job.explain: no responders"}, NOW)
    assert away is not None and away["error"] and away["explain"] is None
    assert job_view(job("j-run", "RUNNING", {"h100-0": [0]}), [], NOW)["pending"] is None


async def test_cache_shares_one_fetch_among_concurrent_readers_and_expires() -> None:
    cache = TtlCache(ttl_s=0.2)
    calls = 0

    async def fetch() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return calls

    assert await asyncio.gather(*(cache.get("k", fetch) for _ in range(20))) == [1] * 20
    assert await cache.get("k", fetch) == 1
    await asyncio.sleep(0.25)
    assert await cache.get("k", fetch) == 2

    async def broken() -> int:
        raise DashboardError("down", 503)

    for _ in range(2):  # a failure is not cached
        try:
            await cache.get("x", broken)
        except DashboardError as exc:
            assert exc.status == 503


class FakeSource(DashboardSource):
    def __init__(self) -> None:
        super().__init__(bus=None)  # type: ignore[arg-type]
        self.asked: list[str] = []

    async def cluster(self) -> dict[str, Any]:
        return cluster_view([two_pairs()], [], NOW)

    async def explain(self, job_id: str) -> dict[str, Any]:
        self.asked.append(job_id)
        raise DashboardError(f"no job {job_id!r}", 404)


async def test_routes_serve_the_page_the_static_files_and_json() -> None:
    assert {p.name for p in STATIC_DIR.iterdir()} >= {"index.html", "dashboard.js", "dashboard.css"}
    app = web.Application()
    source = FakeSource()
    Dashboard(source).routes(app)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/ui", allow_redirects=False)
        assert (r.status, r.headers["Location"]) == (302, "/ui/")
        r = await client.get("/ui/")
        assert r.status == 200 and "/ui/static/dashboard.js" in await r.text()
        r = await client.get("/ui/static/dashboard.js")
        assert r.status == 200 and "POLL_MS" in await r.text()
        r = await client.get("/ui/static/../__init__.py")
        assert r.status in (403, 404)
        r = await client.get("/ui/api/cluster")
        body = await r.json()
        assert r.status == 200 and body["ok"] and body["result"]["summary"]["total"] == 4
        r = await client.get("/ui/api/node/pairs-0")
        body = await r.json()
        assert r.status == 200 and body["result"]["node"]["name"] == "pairs-0"
        assert [p["level"] for p in body["result"]["path"]] == ["leaf"]  # its spine is unnamed: one node, left out
        r = await client.get("/ui/api/node/nope-0")
        assert (r.status, (await r.json())["error"]) == (404, "no node 'nope-0'")
        r = await client.get("/ui/api/node/..%2Fetc")
        assert r.status in (400, 404)
        r = await client.get("/ui/api/node/-bad")
        assert (r.status, (await r.json())["error"]) == (400, "not a node name: '-bad'")
        r = await client.get("/ui/api/explain/j-nope")
        assert (r.status, (await r.json())["ok"]) == (404, False)
        r = await client.get("/ui/api/explain/a.>")
        assert r.status == 400
        assert source.asked == ["j-nope"]


def test_a_node_shows_its_domain_at_each_level_of_the_site() -> None:
    tray = load_preset("gb200_nvl72_compute_tray_4gpu", "gb200-00").model_copy(
        update={"leaf": "leaf0", "spine": "spine0", "nvlink_domain": "gb200-nvl0"}
    )
    view = cluster_view([NodeRecord(topology=tray)], [], NOW)
    (row,) = [n for leaf in view["leaves"] for n in leaf["nodes"]]
    assert row["levels"] == {"nvlink": "gb200-nvl0", "leaf": "leaf0", "spine": "spine0"}


def _group(tree: list[dict[str, Any]], *path: str) -> dict[str, Any]:
    """The group reached by names from the top of the tree."""
    groups, found = tree, None
    for name in path:
        found = next((g for g in groups if g["name"] == name), None)
        assert found is not None, f"no {name} among {[g['name'] for g in groups]}"
        groups = found["children"]
    assert found is not None
    return found


def test_the_tree_of_an_nvl72_cluster_frames_each_rack_of_trays_in_its_nvlink_domain() -> None:
    cluster = load_cluster(NVL72)
    nodes = [NodeRecord(topology=t) for t in cluster.nodes]
    jobs = [
        job("j-tp", "RUNNING", {"gb200-00": [0, 1, 2, 3], "gb200-01": [0, 1, 2, 3]}),
        job("j-h", "RUNNING", {"h100-03": [0, 1]}),
    ]
    view = cluster_view(nodes, jobs, NOW)

    assert view["levels"] == [lv.name for lv in build_levels(cluster.nodes)] == ["nvlink", "leaf", "spine"]
    tree = view["tree"]
    assert [(g["level"], g["name"]) for g in tree] == [("spine", "spine0")]
    spine = tree[0]
    assert (spine["node_count"], spine["gpus"], spine["gpus_in_use"]) == (44, 36 * 4 + 8 * 8, 10)
    assert [(g["level"], g["name"]) for g in spine["children"]] == [
        ("leaf", "leaf0"),
        ("leaf", "leaf1"),
        ("leaf", "leaf2"),
    ]
    # Each rack's 18 trays are one multi-node NVLink domain under its leaf.
    rack0 = _group(tree, "spine0", "leaf0", "gb200-nvl0")
    assert (rack0["level"], rack0["node_count"], rack0["gpus"], rack0["gpus_in_use"]) == ("nvlink", 18, 72, 8)
    assert rack0["nodes"] == sorted(f"gb200-{i:02d}" for i in range(18))
    assert (rack0["held"], rack0["free"]) == (8, 64)
    rack1 = _group(tree, "spine0", "leaf1", "gb200-nvl1")
    assert (rack1["node_count"], rack1["gpus_in_use"], rack1["children"]) == (18, 0, [])
    assert rack1["nodes"][0] == "gb200-18"
    # An H100 board is no one-tray NVLink domain: the boards hang from their leaf directly.
    leaf2 = _group(tree, "spine0", "leaf2")
    assert leaf2["children"] == []
    assert leaf2["nodes"] == [f"h100-{i:02d}" for i in range(8)]
    assert (leaf2["gpus"], leaf2["gpus_in_use"]) == (64, 2)
    # Every node appears exactly once in the tree.
    seen: list[str] = []

    def walk(groups: list[dict[str, Any]]) -> None:
        for g in groups:
            seen.extend(g["nodes"])
            walk(g["children"])

    walk(tree)
    assert sorted(seen) == sorted(t.node for t in cluster.nodes)

    detail = node_detail(view, "gb200-01")
    assert detail is not None
    assert [(p["level"], p["name"], p["gpus_in_use"]) for p in detail["path"]] == [
        ("spine", "spine0", 10),
        ("leaf", "leaf0", 8),
        ("nvlink", "gb200-nvl0", 8),
    ]
    assert set(detail["jobs"]) == {"j-tp"}
    assert node_detail(view, "gb200-99") is None


def _tray(name: str, zone: str, spine: str, leaf: str, rack: str, nvlink: str) -> NodeRecord:
    topo = load_preset("gb200_nvl72_compute_tray_4gpu", node=name).model_copy(
        update={"levels": {"nvlink": nvlink, "rack": rack, "leaf": leaf, "spine": spine, "zone": zone}}
    )
    return NodeRecord(topology=topo)


def test_the_tree_has_every_level_the_site_names_from_zone_down_to_the_nvlink_domain() -> None:
    nodes = [
        _tray("t-0", "z-a", "sp-1", "lf-1", "rk-1", "nvl-1"),
        _tray("t-1", "z-a", "sp-1", "lf-1", "rk-1", "nvl-1"),
        _tray("t-2", "z-a", "sp-1", "lf-1", "rk-2", "nvl-2"),
        _tray("t-3", "z-b", "sp-2", "lf-2", "rk-3", "nvl-3"),
    ]
    view = cluster_view(nodes, [job("j-z", "RUNNING", {"t-2": [0, 1, 2]})], NOW)

    assert view["levels"] == ["nvlink", "rack", "leaf", "spine", "zone"]
    tree = view["tree"]
    assert [g["name"] for g in tree] == ["z-a", "z-b"]
    chain = [tree[0]]
    for name in ("sp-1", "lf-1", "rk-2", "nvl-2"):
        chain.append(next(g for g in chain[-1]["children"] if g["name"] == name))
    assert [(g["level"], g["name"], g["node_count"], g["gpus"], g["gpus_in_use"]) for g in chain] == [
        ("zone", "z-a", 3, 12, 3),
        ("spine", "sp-1", 3, 12, 3),
        ("leaf", "lf-1", 3, 12, 3),
        ("rack", "rk-2", 1, 4, 3),
        ("nvlink", "nvl-2", 1, 4, 3),
    ]
    assert chain[-1]["nodes"] == ["t-2"] and chain[-1]["children"] == []
    assert [g["name"] for g in chain[3 - 1]["children"]] == ["rk-1", "rk-2"]
    assert _group(tree, "z-a", "sp-1", "lf-1", "rk-1", "nvl-1")["nodes"] == ["t-0", "t-1"]
    assert _group(tree, "z-b", "sp-2", "lf-2", "rk-3", "nvl-3")["gpus_in_use"] == 0
    assert [p["level"] for p in (node_detail(view, "t-3") or {})["path"]] == ["zone", "spine", "leaf", "rack", "nvlink"]


def test_a_node_without_levels_hangs_from_its_own_leaf_and_the_one_spine() -> None:
    view = cluster_view([node("h100_sxm_8gpu_nvswitch_nv18", "solo-0", None)], [], NOW)
    assert view["levels"] == ["leaf", "spine"]
    # Neither is named by the site: a single node's unnamed domains are the node itself.
    assert [(g["level"], g["nodes"]) for g in view["tree"]] == [("cluster", ["solo-0"])]


def mig_node(name: str = "a100-mig") -> NodeRecord:
    """A DGX A100 with the imported `nvidia-smi -L`: GPU 0 as 3g.40gb + 2g.20gb + 2x 1g.10gb, GPU 1 as 2x 3g.40gb."""
    topo = load_preset("dgx_a100_8gpu_nv12_12nic", node=name).model_copy(update={"leaf": "leaf-m", "spine": "sp"})
    return NodeRecord(topology=apply_gpu_listing(topo, parse_gpu_listing(MIG_LISTING.read_text(encoding="utf-8"))))


def mig_job(job_id: str, node_name: str, uuids: list[str]) -> JobRecord:
    ranks = [RankPlacement(rank=i, node=node_name, gpus=[], mig=[u]) for i, u in enumerate(uuids)]
    spec = JobSpec.model_validate({"name": f"n-{job_id}", "ranks": len(uuids), "resources": {"mig": "3g.40gb"}})
    return JobRecord(
        job_id=job_id,
        spec=spec,
        state="RUNNING",
        submitted_ts=NOW - 60,
        updated_ts=NOW,
        allocation=Allocation(ranks=ranks),
        token=3,
    )


def test_a_mig_node_shows_each_gpus_mode_and_instances_with_the_job_holding_each() -> None:
    n = mig_node()
    listing = parse_gpu_listing(MIG_LISTING.read_text(encoding="utf-8"))
    gpu0, gpu1 = listing[0], listing[1]
    held = gpu0.instances[0].uuid  # GPU 0's 3g.40gb
    view = cluster_view([n], [mig_job("j-mig", n.topology.node, [held])], NOW)
    (row,) = [r for leaf in view["leaves"] for r in leaf["nodes"]]

    layout = row["mig_layout"]
    assert [(g["index"], g["mig_enabled"], len(g["instances"])) for g in layout] == [
        (0, True, 4),
        (1, True, 2),
        *[(i, False, 0) for i in range(2, 8)],
    ]
    first = layout[0]
    assert [(i["device"], i["profile"], i["uuid"]) for i in first["instances"]] == [
        (i.device, i.profile, i.uuid) for i in gpu0.instances
    ]
    assert [i["profile"] for i in first["instances"]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert first["instances"][0]["job_id"] == "j-mig"
    assert first["instances"][0]["holders"] == [
        {"job_id": "j-mig", "token": 3, "state": "RUNNING", "rank": 0, "mig": held}
    ]
    assert [i["job_id"] for i in first["instances"][1:]] == [None, None, None]
    assert (first["held"], first["free"]) == (1, 3)
    assert [i["uuid"] for i in layout[1]["instances"]] == [i.uuid for i in gpu1.instances]
    assert layout[0]["uuid"] == gpu0.uuid

    # On the tile: GPU 0 is held through its instance (3 of its 7 listed compute slices), with room left: shared.
    # GPU 1 is split but nothing holds an instance: not free (placement never hands a split GPU out whole).
    tiles = {g["index"]: g for d in row["domains"] for g in d["gpus"]}
    assert (tiles[0]["state"], tiles[0]["mig_enabled"], tiles[0]["mig_instances"]) == ("held", True, 4)
    assert tiles[0]["held_milli"] == 1000 * 3 // 7
    assert tiles[0]["job_id"] == "j-mig"
    assert (tiles[1]["state"], tiles[1]["mig_enabled"]) == ("mig", True)
    assert (tiles[2]["state"], tiles[2]["mig_enabled"], tiles[2]["mig_instances"]) == ("free", False, 0)
    assert (row["total"], row["held"], row["shared"], row["mig"], row["free"]) == (8, 1, 1, 1, 6)
    # A MIG instance held takes nothing from a whole-GPU gang: the six whole GPUs are not fragmented.
    (nv,) = row["domains"]
    assert (nv["fragmented"], nv["state"], nv["largest_free_nvlink_group"]) == (0, "partial", 6)
    assert set(view["jobs"]) == {"j-mig"}

    detail = node_detail(view, "a100-mig")
    assert detail is not None and detail["node"]["mig_layout"] == layout
    assert [(p["level"], p["name"]) for p in detail["path"]] == [("spine", "sp"), ("leaf", "leaf-m")]
    assert set(detail["jobs"]) == {"j-mig"}

    # Nothing held: the split GPUs are idle with the rest; a whole-GPU job beside them fragments the whole GPUs only.
    idle = cluster_view([n], [], NOW)["leaves"][0]["nodes"][0]["domains"][0]
    assert (idle["state"], idle["mig"], idle["free"]) == ("idle", 2, 6)
    busy = cluster_view([n], [job("j-w", "RUNNING", {"a100-mig": [2, 3]})], NOW)["leaves"][0]["nodes"][0]
    assert (busy["held"], busy["free"], busy["mig"], busy["fragmented"]) == (2, 4, 2, 4)


def test_a_node_with_no_gpu_in_mig_mode_has_no_layout() -> None:
    view = cluster_view([two_pairs()], [], NOW)
    (row,) = [r for leaf in view["leaves"] for r in leaf["nodes"]]
    assert row["mig_layout"] == []
    assert all(not g["mig_enabled"] for d in row["domains"] for g in d["gpus"])
