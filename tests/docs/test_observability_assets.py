"""The Grafana dashboard (``examples/grafana-dashboard.json``) and the alert rules on the
Observability page query only metrics and labels the ``Prometheus`` hook exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML, MkDocs' dependency
from prometheus_client import CollectorRegistry

from idempotency_middleware import MemoryStore, idempotent
from idempotency_middleware.observability import Prometheus
from idempotency_middleware.observability.conventions import (
    ATTEMPT_LABELS,
    STORE_CALL_LABELS,
    WAIT_LABELS,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "examples" / "grafana-dashboard.json"
ALERTS = ROOT / "docs" / "snippets" / "operating-observability-4.yaml"
METRIC = re.compile(r"\bidempotency_[a-z_]+")
# label="value", label=~"...", label!="..." inside a selector's braces.
MATCHER = re.compile(r"([a-z_]+)\s*(?:=~|!=|!~|=)\s*\"")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")


# The series a metric family of each type exports (prometheus_client's text format).
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported() -> set[str]:
    """The series names a Prometheus hook exports (a family's, with its type's suffixes)."""
    registry = CollectorRegistry()

    @idempotent(
        store=MemoryStore(), key=lambda order: order, on_event=Prometheus(registry=registry)
    )
    def charge(order: str) -> str:
        return order

    charge("order-1")
    return {
        family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]
    }


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [
        variable["query"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    return queries


def alert_queries() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


LABELS = {*ATTEMPT_LABELS, *STORE_CALL_LABELS, *WAIT_LABELS, "le"}


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_queried_is_one_the_library_exports(source: str) -> None:
    queries = dashboard_queries() if source == "dashboard" else alert_queries()
    queried = {name for query in queries for name in METRIC.findall(query)}
    assert queried
    assert queried <= exported()


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_label_queried_is_one_the_library_exports(source: str) -> None:
    queries = dashboard_queries() if source == "dashboard" else alert_queries()
    labels = {label for query in queries for label in MATCHER.findall(query)}
    labels |= {
        label.strip()
        for query in queries
        for group in GROUPING.findall(query)
        for label in group.split(",")
    }
    labels |= {
        found.group(1)
        for query in queries
        for found in re.finditer(r"label_values\([a-z_]+,\s*([a-z_]+)\)", query)
    }
    assert labels <= LABELS | {"store"}


def test_the_dashboard_shows_replays_conflicts_reuses_and_store_failures_per_route() -> None:
    queries = "\n".join(dashboard_queries())
    for outcome in ("replayed", "conflict", "mismatch"):
        assert f'outcome="{outcome}"' in queries
    assert "error_type" in queries
    assert "idempotency_breaker_open" in queries
