"""The Grafana dashboard and the Prometheus alert rules in compose/ query only metrics the code
exports, under the names it exports them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from agent_router.store import Reads
from agent_router.worker import metrics

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
NAME = re.compile(r"\bagent_router_[a-z_]+")


def exported() -> set[str]:
    """Every sample name a worker's counters and the cluster exporter can expose."""
    registry = CollectorRegistry()
    metrics.PrometheusHooks(registry)

    def no_reads() -> Reads:
        raise AssertionError("describe() reads no database")

    registry.register(metrics.ClusterCollector(no_reads))
    names: set[str] = set()
    for family in registry.collect():
        names |= {s.name for s in family.samples} or {family.name}
    for family in metrics.ClusterCollector(no_reads).describe():
        names.add(family.name)
    return names


def expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [e for k, v in node.items() for e in ([v] if k == "expr" else expressions(v))]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    return []


def test_dashboard_and_alerts_use_exported_metrics() -> None:
    dashboard = json.loads((COMPOSE / "grafana" / "agent-router.json").read_text())
    alerts = yaml.safe_load((COMPOSE / "prometheus" / "alerts.yml").read_text())
    exprs = expressions(dashboard) + expressions(alerts)
    assert len(exprs) >= 15
    used = {name for expr in exprs for name in NAME.findall(expr)}
    known = exported()
    assert used - known == set(), sorted(known)
    # Each cluster gauge is on the dashboard.
    for gauge in metrics.ClusterCollector(lambda: None).describe():  # type: ignore[arg-type,return-value]
        assert gauge.name in used, gauge.name
    rules = [r["alert"] for g in alerts["groups"] for r in g["rules"]]
    assert "AgentRouterMessagesStuck" in rules and "AgentRouterOutboxBacklog" in rules
