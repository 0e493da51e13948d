"""`python -m oneplus_bus.health <service>`: is this service up? Exit 0 when it answers a NATS micro PING.

A service started with ONEPLUS_HEALTH_DIR set writes `<dir>/<service>.json` (its micro service's name, instance id
and inbox prefix) once its streams, buckets, subscribers and ops endpoints are up, and removes it when it stops.
The check then pings that very instance (`$SRV.PING.oneplus-<service>.<id>`) over the service's own NATS_URL, so a
replica that hangs or lost NATS fails although its siblings answer. Without ONEPLUS_HEALTH_DIR it pings any
instance of the service. Used by compose.yaml's health checks and deploy/k8s's exec probes.

Exit 0: answered; 1: not (yet) started, not answering, or NATS unreachable (one line on stderr says which).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .settings import nats_servers

PREFIX = "oneplus-"


class Unhealthy(Exception):
    """Why the service is not healthy, in one line."""


@dataclass(frozen=True)
class Instance:
    name: str  # the micro service's name, oneplus-<service>
    id: str | None  # None: any instance
    inbox_prefix: str


def health_dir() -> Path | None:
    raw = os.environ.get("ONEPLUS_HEALTH_DIR", "").strip()
    return Path(raw) if raw else None


def health_file(directory: Path, service: str) -> Path:
    return directory / f"{service}.json"


def write_health_file(service: str, instance_id: str, inbox_prefix: str) -> Path | None:
    """Called by a started service: where a health check finds it (None: ONEPLUS_HEALTH_DIR is not set)."""
    directory = health_dir()
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = health_file(directory, service)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"name": PREFIX + service, "id": instance_id, "inbox_prefix": inbox_prefix}))
    tmp.replace(path)
    return path


def remove_health_file(service: str) -> None:
    directory = health_dir()
    if directory is not None:
        with contextlib.suppress(FileNotFoundError):
            health_file(directory, service).unlink()


def instance_of(service: str) -> Instance:
    directory = health_dir()
    default_inbox = os.environ.get("ONEPLUS_INBOX_PREFIX", "_INBOX")
    if directory is None:
        return Instance(PREFIX + service, None, default_inbox)
    path = health_file(directory, service)
    try:
        data = json.loads(path.read_text())
        return Instance(str(data["name"]), str(data["id"]), str(data.get("inbox_prefix") or default_inbox))
    except FileNotFoundError:
        raise Unhealthy(f"{service} has not started (no {path})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise Unhealthy(f"{path} is not a health file: {exc}") from None


async def check(service: str, nats_url: str, timeout: float = 3.0) -> str:
    """The answering instance's name and id; Unhealthy when none answers."""
    import nats
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    inst = instance_of(service)
    subject = f"$SRV.PING.{inst.name}" + (f".{inst.id}" if inst.id else "")

    async def quiet(exc: Exception) -> None:
        return None

    try:
        servers = nats_servers(nats_url)
        nc = await asyncio.wait_for(
            nats.connect(
                servers=servers,
                connect_timeout=timeout,
                allow_reconnect=False,
                max_reconnect_attempts=1,  # each server once: a probe answers in seconds, not after 60 retries
                reconnect_time_wait=0.1,
                inbox_prefix=inst.inbox_prefix,
                error_cb=quiet,
            ),
            timeout * (len(servers) + 1),
        )
    except ValueError:
        raise
    except Exception as exc:
        raise Unhealthy(f"cannot reach NATS: {exc or type(exc).__name__}") from None
    try:
        msg = await nc.request(subject, b"", timeout=timeout)
    except NoRespondersError:
        raise Unhealthy(f"nothing answers {subject}: the service is not connected to NATS") from None
    except NatsTimeout:
        raise Unhealthy(f"{inst.name} did not answer {subject} within {timeout}s") from None
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    try:
        pong = json.loads(msg.data)
        return f"{pong['name']} {pong['id']}"
    except (ValueError, KeyError, TypeError):
        raise Unhealthy(f"{subject} answered something that is not a PING reply: {msg.data[:80]!r}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oneplus_bus.health", description=__doc__.splitlines()[0])
    p.add_argument("service", help="intake, topology-registry, placement-solver, preemption or node-executor")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for NATS and for the answer")
    a = p.parse_args(argv)
    try:
        who = asyncio.run(check(a.service, os.environ.get("NATS_URL", "nats://127.0.0.1:4222"), a.timeout))
    except (Unhealthy, ValueError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {who}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
