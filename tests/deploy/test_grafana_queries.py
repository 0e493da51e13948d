"""The Grafana dashboard (deploy/grafana/oneplus.json) asks only for metrics the services export, by the labels
they have: a renamed metric or label fails here, not on an operator's empty panel."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faststream.prometheus.container import MetricsContainer
from oneplus_intake.metrics import IntakeMetrics
from oneplus_placement_solver.metrics import SolverMetrics
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "oneplus.json"
# A metric defined in the code: Counter("oneplus_x", ...), Gauge(...), Histogram(...), GaugeMetricFamily(...).
DEFINED = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|GaugeMetricFamily|CounterMetricFamily)\(\s*\"(oneplus_[a-z0-9_]+)\"", re.S
)
SUFFIXES = {
    "Counter": ("_total", "_created"),
    "CounterMetricFamily": ("_total",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("_sum", "_count", "_created"),
    "Gauge": ("",),
    "GaugeMetricFamily": ("",),
}
METRIC = re.compile(r"\b((?:oneplus|faststream)_[a-z0-9_]+)\b")
BY = re.compile(r"\bby\s*\(([^)]*)\)\s*\(([^()]*(?:\([^()]*\))?[^()]*)\)")
SCRAPE_LABELS = {"job", "instance", "le"}  # Prometheus adds the first two; histograms have le


def exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from exprs(value)


def exported() -> set[str]:
    """Every sample name the platform's code can export: its own metrics (from their definitions) and FastStream's."""
    names: set[str] = set()
    for path in [*ROOT.glob("services/*/src/**/*.py"), *ROOT.glob("libs/*/src/**/*.py")]:
        for kind, name in DEFINED.findall(path.read_text(encoding="utf-8")):
            base = name.removesuffix("_total") if kind.startswith("Counter") else name
            names |= {base + suffix for suffix in SUFFIXES[kind]}
    registry = CollectorRegistry()
    MetricsContainer(registry, custom_label_names=())  # FastStream's middleware metrics, prefix faststream
    for metric in registry.collect():  # no samples before a first message: names from the metric's type
        kind = {"counter": "Counter", "histogram": "Histogram", "summary": "Summary"}.get(metric.type, "Gauge")
        names |= {metric.name + suffix for suffix in SUFFIXES[kind]}
    return names


def labels_of_solver_and_intake() -> dict[str, set[str]]:
    """The label names of the solver's and the intake's metrics, from the real objects."""
    registry = CollectorRegistry()
    solver, intake = SolverMetrics(registry), IntakeMetrics(registry, rows=lambda: [])
    solver.pending.labels("q", "0", "None").set(1)
    solver.wait.labels("q").observe(1)
    solver.placed.labels("node", "true").inc()
    solver.conflicts.labels("taken").inc()
    intake.submission("accepted", "cli:JobSpec")
    intake.http.labels("/v1/jobs", "POST", "201").inc()
    out: dict[str, set[str]] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    names = exported()
    queried = {m for e in exprs(json.loads(DASHBOARD.read_text())) for m in METRIC.findall(e)}
    assert queried, "the dashboard has queries"
    missing = sorted(queried - names)
    assert not missing, f"the dashboard asks for metrics no service exports: {missing}"
    # What the issue asked a Prometheus user to find: jobs by state, submissions, HTTP requests.
    assert {"oneplus_jobs", "oneplus_submissions_total", "oneplus_http_requests_total"} <= queried


def test_the_labels_the_dashboard_groups_by_exist() -> None:
    labels = labels_of_solver_and_intake()
    checked = 0
    for expr in exprs(json.loads(DASHBOARD.read_text())):
        for by, inner in BY.findall(expr):
            for metric in METRIC.findall(inner):
                if metric not in labels:
                    continue  # another service's metric: its name is checked above
                wanted = {label.strip() for label in by.split(",") if label.strip()} - SCRAPE_LABELS
                assert wanted <= labels[metric], f"{expr}: {metric} has labels {sorted(labels[metric])}"
                checked += 1
    assert checked >= 5


def test_a_renamed_metric_would_be_caught() -> None:
    names = exported()
    assert "oneplus_pending_jobs" in names and "oneplus_gangs_placed_total" in names
    assert "oneplus_pending_job" not in names
