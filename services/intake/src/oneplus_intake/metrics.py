"""The intake's Prometheus metrics (in its service's registry; docs/observability.md lists them): submissions by
outcome, reason and source, HTTP requests by route and code, and jobs by state and queue from its hot view.

Every label takes a bounded set of values: a source is its kind (cli, sbatch, http, nats, mlflow, cloudevent,
other), never a CloudEvent's free-form URI; a route is the route's pattern (`/v1/jobs/{job_id}`), never the path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from oneplus_stores.archive import JobRow

SOURCE_KINDS = ("cli", "sbatch", "http", "nats", "mlflow", "cloudevent")
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
REFUSALS = {400: "unreadable", 401: "unauthenticated", 403: "wrong_team", 422: "cannot_run"}


def source_kind(source: str) -> str:
    """`cli:PyTorchJob` → cli, `sbatch` → sbatch, a CloudEvent's `https://ci.example/x` → cloudevent."""
    head = source.split(":", 1)[0].strip().lower()
    if head in SOURCE_KINDS:
        return head
    if head.startswith("mlflow"):
        return "mlflow"
    if "/" in source or ":" in source:
        return "cloudevent"  # a CloudEvent's source is a URI reference
    return "other"


def refusal_reason(status: int, exc: BaseException | None = None) -> str:
    """A refusal's bounded reason: the queue config's own words when it refused, else the status's."""
    name = type(exc).__name__ if exc is not None else ""
    if name == "UnknownQueue":
        return "unknown_queue"
    if name == "UnknownPriorityClass":
        return "unknown_priority_class"
    if name == "QueueConfigError":
        return "queue"
    if name == "ValidationError":
        return "invalid_spec"
    if name == "ArrayError":
        return "array"
    if name == "SiteMapError":
        return "site"
    return REFUSALS.get(status, f"http_{status}")


class JobsByState(Collector):
    """`oneplus_jobs{state, queue}` counted at scrape time from the intake's copy of the hot view: every live job,
    and the finished ones not yet moved to the archive (ONEPLUS_MIN_JOB_AGE_S)."""

    def __init__(self, rows: Callable[[], Iterable[JobRow] | None]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "oneplus_jobs",
            "Jobs in the hot view by state and queue: live ones, and finished ones until they move to the archive",
            labels=["state", "queue"],
        )
        counts: dict[tuple[str, str], int] = {}
        for row in self.rows() or ():
            key = (row.state, row.queue or "")
            counts[key] = counts.get(key, 0) + 1
        for (state, queue), n in sorted(counts.items()):
            family.add_metric([state, queue], n)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected on demand: nothing to check at registration


class IntakeMetrics:
    def __init__(self, registry: CollectorRegistry, rows: Callable[[], Iterable[JobRow] | None] | None = None) -> None:
        self.submissions = Counter(
            "oneplus_submissions",
            "Job submissions by outcome (accepted, duplicate: a retry of an accepted one, refused), the reason of a "
            "refusal (unreadable, wrong_team, cannot_run, unknown_queue, unknown_priority_class, queue, "
            "invalid_spec; none otherwise) and the source's kind (cli, sbatch, http, nats, mlflow, cloudevent, other)",
            ["outcome", "reason", "source"],
            registry=registry,
        )
        self.http = Counter(
            "oneplus_http_requests",
            "HTTP requests the intake answered, by route pattern (unmatched: no route), method and status code",
            ["route", "method", "code"],
            registry=registry,
        )
        if rows is not None:
            registry.register(JobsByState(rows))

    def submission(self, outcome: str, source: str, reason: str = "none") -> None:
        self.submissions.labels(outcome, reason, source_kind(source)).inc()

    def middleware(self) -> Any:
        """An aiohttp middleware counting each request once, by its route's pattern."""

        @web.middleware
        async def count(request: web.Request, handler: Any) -> web.StreamResponse:
            code = 500
            try:
                response: web.StreamResponse = await handler(request)
                code = response.status
                return response
            except web.HTTPException as exc:
                code = exc.status
                raise
            finally:
                resource = request.match_info.route.resource
                route = resource.canonical if resource is not None else "unmatched"
                method = request.method if request.method in METHODS else "other"
                self.http.labels(route, method, str(code)).inc()

        return count
