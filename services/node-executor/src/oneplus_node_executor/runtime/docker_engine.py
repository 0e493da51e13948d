"""Talking to the engine: its errors in the executor's terms, and getting a job's image onto the node."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiodocker
import aiohttp

from .base import EngineUnavailable, LaunchFailed


def unreachable(url: str, doing: str, detail: str) -> EngineUnavailable:
    return EngineUnavailable(f"container engine at {url} is unreachable ({doing}): {detail}")


@asynccontextmanager
async def engine_errors(url: str, doing: str) -> AsyncIterator[None]:
    """Turn 'cannot reach the engine' into EngineUnavailable; API answers (404, 409, 500) stay DockerError."""
    try:
        yield
    except aiodocker.DockerError as e:
        if e.status == 900:  # aiodocker's code for a refused or missing socket
            raise unreachable(url, doing, str(e.message)) from e
        raise
    except TimeoutError as e:  # before OSError: TimeoutError is one
        raise unreachable(url, doing, "no answer in time") from e
    except (aiohttp.ClientError, OSError) as e:
        raise unreachable(url, doing, str(e) or type(e).__name__) from e


def image_reference(image: str) -> str:
    """`busybox` → `busybox:latest`: without a tag the pull API would fetch every tag of the repository."""
    last = image.rsplit("/", 1)[-1]
    return image if (":" in last or "@" in last) else image + ":latest"


async def image_present(docker: aiodocker.Docker, url: str, image: str) -> bool:
    try:
        async with engine_errors(url, "inspecting an image"):
            await docker.images.inspect(image)
        return True
    except aiodocker.DockerError as e:
        if e.status == 404:
            return False
        raise LaunchFailed(f"inspecting image {image} failed: {e.message}") from e


async def ensure_image(
    docker: aiodocker.Docker, url: str, image: str, policy: str, *, node: str | None, pull_timeout_s: float
) -> None:
    """Honour the job's pull policy (Always, IfNotPresent, Never); a missing image is a LaunchFailed naming it."""
    ref = image_reference(image)
    present = await image_present(docker, url, ref)
    if policy == "Never":
        if not present:
            raise LaunchFailed(f"image {ref} not found on node {node} (pull_policy=Never)")
        return
    if policy == "IfNotPresent" and present:
        return
    try:
        async with engine_errors(url, "pulling an image"):
            try:
                await docker.images.pull(ref, timeout=pull_timeout_s)
            except TimeoutError as e:
                raise LaunchFailed(f"pulling image {ref} timed out after {pull_timeout_s:g} s") from e
    except aiodocker.DockerError as e:
        if policy == "Always":
            raise LaunchFailed(f"pulling image {ref} failed (pull_policy=Always): {e.message}") from e
        raise LaunchFailed(f"image {ref} not found on node {node} and pulling it failed: {e.message}") from e
