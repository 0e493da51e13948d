"""ONEPLUS_STREAM_REPLICAS and a comma-separated NATS_URL: parsed, refused clearly, applied to streams and buckets.

The three-server side (replicas 3, an existing stream re-replicated, fail-over) is tests/deploy/test_nats_cluster.py.
"""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from oneplus_bus.settings import BusSettings, nats_servers
from oneplus_bus.streams import StreamSetupError, ensure_kv, ensure_streams, stream_replicas
from oneplus_contracts import subjects


def test_one_replica_unless_told() -> None:
    assert stream_replicas({}) == 1
    assert stream_replicas({"ONEPLUS_STREAM_REPLICAS": " 3 "}) == 3


@pytest.mark.parametrize(
    ("raw", "why"),
    [("three", "not a whole number"), ("2.5", "not a whole number"), ("0", "between 1 and 5"), ("7", "between 1")],
)
def test_a_bad_replica_count_is_refused_by_name(raw: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"ONEPLUS_STREAM_REPLICAS='{raw}'.*{why}"):
        stream_replicas({"ONEPLUS_STREAM_REPLICAS": raw})


async def test_a_bad_replica_count_stops_the_declaration(nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEPLUS_STREAM_REPLICAS", "many")
    with pytest.raises(ValueError, match="ONEPLUS_STREAM_REPLICAS"):
        await ensure_streams(nc.jetstream())
    with pytest.raises(ValueError, match="ONEPLUS_STREAM_REPLICAS"):
        await ensure_kv(nc.jetstream())


async def test_streams_and_buckets_get_the_configured_count(nc: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEPLUS_STREAM_REPLICAS", "1")
    js = nc.jetstream()
    await ensure_streams(js)
    await ensure_kv(js)
    for name in subjects.STREAMS:
        assert (await js.stream_info(name)).config.num_replicas == 1
    assert (await js.stream_info(f"KV_{subjects.JOBS_KV}")).config.num_replicas == 1


async def test_more_replicas_than_one_server_keeps_is_a_clear_error(nc: Client) -> None:
    js = nc.jetstream()
    # Creating: no stream yet.
    with pytest.raises(StreamSetupError, match=r"3 replica\(s\) \(more than one replica needs a JetStream cluster\)"):
        await ensure_streams(js, replicas=3)
    # Updating: the streams exist with one copy, three are asked for.
    await ensure_streams(js, replicas=1)
    with pytest.raises(StreamSetupError, match=r"refused stream .* with 3 replica"):
        await ensure_streams(js, replicas=3)
    assert (await js.stream_info(subjects.JOBS_STREAM)).config.num_replicas == 1


async def test_more_replicas_than_one_server_keeps_is_a_clear_error_for_buckets(nc: Client) -> None:
    js = nc.jetstream()
    with pytest.raises(StreamSetupError, match=r"refused KV bucket .* with 3 replica"):
        await ensure_kv(js, replicas=3)
    await ensure_kv(js, replicas=1)
    with pytest.raises(StreamSetupError, match=r"refused KV bucket .* with 3 replica"):
        await ensure_kv(js, replicas=3)


def test_nats_url_may_name_every_server_of_a_cluster() -> None:
    assert nats_servers("nats://a:4222") == ["nats://a:4222"]
    assert nats_servers("nats://u:p@a:4222, nats://u:p@b:4222,,nats://u:p@c:4222 ") == [
        "nats://u:p@a:4222",
        "nats://u:p@b:4222",
        "nats://u:p@c:4222",
    ]
    settings = BusSettings(nats_url="nats://a:4222,nats://b:4222", redis_url="redis://r")
    assert settings.nats_servers == ["nats://a:4222", "nats://b:4222"]


@pytest.mark.parametrize("url", ["", " , ,"])
def test_a_nats_url_without_a_server_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="names no server"):
        nats_servers(url)


def test_the_bus_package_depends_on_no_domain_library() -> None:
    """libs/bus is transport: it declares no dependency on the reservation store, placement or queueing."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "libs/bus/pyproject.toml").read_text())
    deps = " ".join(project["project"]["dependencies"])
    for lib in ("oneplus-reservations", "oneplus-placement", "oneplus-queueing", "oneplus-sim", "ortools"):
        assert lib not in deps, f"libs/bus depends on {lib}"
    sources = (Path(__file__).resolve().parents[2] / "libs/bus/src/oneplus_bus").rglob("*.py")
    imports = [p.name for p in sources if "import oneplus_reservations" in p.read_text()
               or "from oneplus_reservations" in p.read_text()]  # fmt: skip
    assert imports == [], imports
