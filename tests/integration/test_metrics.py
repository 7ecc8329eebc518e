"""Prometheus metrics, scraped over HTTP from the endpoint a worker serves, after real routing.

A private registry per test, so counts start at zero; the Router reports through its hooks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent_router import Router, Settings, errors
from agent_router.domain import BudgetName
from agent_router.hooks import RouterHooks
from agent_router.outbox import RecordingPublisher
from agent_router.settings import ModelSpec
from agent_router.turn import Turn
from agent_router.worker import metrics
from agent_router.worker.embedded import SweeperThread
from tests.integration.helpers import start_waiting

CLI = str(Path(sys.executable).parent / "agent-router")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metered(settings: Settings, registry: CollectorRegistry) -> Iterator[Router]:
    r = Router(settings, publisher=RecordingPublisher(), hooks=metrics.PrometheusHooks(registry))
    yield r
    r.close()


@contextmanager
def served(router: Router, registry: CollectorRegistry) -> Iterator[Callable[[], str]]:
    """The metrics endpoint, served once; yields a function that scrapes it over HTTP."""
    server = metrics.serve(0, reads=lambda: router.reads, registry=registry, addr="127.0.0.1")

    def scrape() -> str:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return bytes(response.read()).decode()

    try:
        yield scrape
    finally:
        server.shutdown()
        server.server_close()


def sample(text: str, name: str) -> float:
    """The value of one sample line, 0 when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


SCHEDULED_DEPTH = 'agent_router_mailbox_depth{agent_state="scheduled"}'


def routed_and_ended(router: Router) -> None:
    team = router.create_team()
    router.create_agent(team.id, role="UI Operator")
    router.send(team.id, to="UI Operator_1", content="task 1")  # triggered_new_turn
    router.send(team.id, to="UI Operator_1", content="task 2")  # coalesced
    with pytest.raises(errors.UnknownAgentError):
        router.send(team.id, to="Nobody_1", content="hello")  # rejected
    turn = router.claim_turn(team.id, "UI Operator_1")
    assert turn is not None
    turn.drain()
    router.send(team.id, to="UI Operator_1", content="steer")  # injected_inline
    turn.append_assistant({"role": "assistant", "content": "done"})
    assert turn.end().follow_up  # the steer is still pending: one follow-up


def test_scrape_after_routing_counts_outcomes_turns_and_follow_ups(
    metered: Router, registry: CollectorRegistry
) -> None:
    router = metered
    with served(router, registry) as scrape:
        # Gauges read from the database cover every team in it (PostgreSQL is shared by tests).
        depth_before = sample(scrape(), SCHEDULED_DEPTH)
        routed_and_ended(router)
        text = scrape()
    for line in (
        'agent_router_messages_routed_total{outcome="triggered_new_turn"} 1.0',
        'agent_router_messages_routed_total{outcome="coalesced"} 1.0',
        'agent_router_messages_routed_total{outcome="injected_inline"} 1.0',
        'agent_router_messages_routed_total{outcome="rejected"} 1.0',
        'agent_router_turns_started_total{trigger="new"} 1.0',
        'agent_router_turn_duration_seconds_count{status="ended"} 1.0',
        "agent_router_follow_ups_total 1.0",
        "agent_router_recoveries_total 0.0",
    ):
        assert line in text, line
    # Mailbox depth is read from the database: the steer waits for the follow-up turn.
    assert sample(text, SCHEDULED_DEPTH) == depth_before + 1


def test_a_failing_hook_never_fails_routing(settings: Settings) -> None:
    class Broken(RouterHooks):
        def after_route(self, team_id: int, sender: str, delivery: object) -> None:
            raise RuntimeError("monitoring is down")

        def after_claim(self, turn: Turn) -> None:
            raise RuntimeError("monitoring is down")

    router = Router(settings, publisher=RecordingPublisher(), hooks=Broken())
    try:
        team = router.create_team()
        delivery = router.send(team.id, to="Team Leader", content="hi")
        assert delivery.outcome.value == "triggered_new_turn"
        assert router.claim_turn(team.id, "Team Leader") is not None
    finally:
        router.close()


def test_labels_start_at_zero_and_no_created_series(
    metered: Router, registry: CollectorRegistry
) -> None:
    with served(metered, registry) as scrape:
        text = scrape()
    for line in (
        'agent_router_messages_routed_total{outcome="rejected"} 0.0',
        'agent_router_messages_routed_total{outcome="resolved"} 0.0',
        'agent_router_turns_started_total{trigger="recovery"} 0.0',
        'agent_router_turn_duration_seconds_count{status="failed"} 0.0',
        'agent_router_wait_duration_seconds_count{outcome="suspended"} 0.0',
        'agent_router_sweep_repairs_total{kind="taken_over"} 0.0',
        "agent_router_sweeps_total 0.0",
        'agent_router_budgets_exhausted_total{budget="sub_agents_created"} 0.0',
    ):
        assert line in text, line
    # No `_created` series (a label value such as sub_agents_created is not one).
    assert not [n for n in text.split() if n.split("{")[0].endswith("_created")]


def test_cluster_gauges_read_from_the_database(
    metered: Router, registry: CollectorRegistry
) -> None:
    router = metered
    with served(router, registry) as scrape:
        before = scrape()
        team = router.create_team()
        router.create_agent(team.id, role="UI Operator")
        start_waiting(router, team.id, "UI Operator_1", "Team Leader")  # one open question
        router.send(team.id, to="UI Operator_1", content="later", wake=False)  # pending
        time.sleep(0.05)
        after = scrape()
    name = "agent_router_open_questions"
    assert sample(after, name) == sample(before, name) + 1
    assert sample(after, "agent_router_oldest_pending_message_age_seconds") > 0
    # The recording publisher published every turn task: nothing left in the outbox.
    assert sample(after, "agent_router_outbox_unpublished") == sample(
        before, "agent_router_outbox_unpublished"
    )


def test_sweeper_passes_are_counted(metered: Router, registry: CollectorRegistry) -> None:
    hooks = metrics.PrometheusHooks(CollectorRegistry())
    with SweeperThread(metered, period=0.05, first_after=0.0, on_report=hooks.record_sweep) as s:
        deadline = time.monotonic() + 30
        while s.passes < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert hooks.sweeps._value.get() >= 2


def test_the_endpoint_binds_loopback_by_default(registry: CollectorRegistry) -> None:
    server = metrics.serve(0, registry=registry)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_command_serves_the_cluster_gauges_once(sqlite_url: str) -> None:
    router = Router(Settings(database_url=sqlite_url), publisher=None)
    router.create_schema()
    team = router.create_team()
    router.send(team.id, to="Team Leader", content="go")  # no publisher: stays in the outbox
    router.close()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    cmd = [CLI, "metrics", "--database-url", sqlite_url, "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith(f"agent-router metrics on http://127.0.0.1:{port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = bytes(response.read()).decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert sample(text, "agent_router_outbox_unpublished") == 1
    assert sample(text, 'agent_router_mailbox_depth{agent_state="scheduled"}') == 1
    assert sample(text, 'agent_router_agents{agent_state="scheduled"}') == 1
    # Only the gauges: the counters are each worker's own.
    assert "agent_router_messages_routed_total" not in text


def test_scrape_counts_tokens_cost_and_spent_budgets(
    settings: Settings, registry: CollectorRegistry
) -> None:
    priced = settings.model_copy(update={"models": {"m": ModelSpec(input=1.0, output=4.0)}})
    router = Router(priced, publisher=RecordingPublisher(), hooks=metrics.PrometheusHooks(registry))
    try:
        team = router.create_team(budget={BudgetName.MODEL_CALLS: 2})
        router.send(team.id, to="Team Leader", content="go")
        turn = router.claim_turn(team.id, "Team Leader")
        assert turn is not None
        for prompt, completion, cached in ((1000, 100, 200), (3000, 500, 0)):
            turn.charge_model_call()
            turn.record_usage(model="m", prompt_tokens=prompt, completion_tokens=completion,
                              cached_tokens=cached)  # fmt: skip
        with pytest.raises(errors.BudgetExhaustedError):
            turn.charge_model_call()
        with served(router, registry) as scrape:
            text = scrape()
    finally:
        router.close()
    for line in (
        'agent_router_model_calls_total{model="m"} 2.0',
        'agent_router_tokens_total{kind="prompt",model="m"} 4000.0',
        'agent_router_tokens_total{kind="completion",model="m"} 600.0',
        'agent_router_tokens_total{kind="cached",model="m"} 200.0',
        'agent_router_budgets_exhausted_total{budget="model_calls"} 1.0',
    ):
        assert line in text, line
    assert sample(text, 'agent_router_cost_usd_total{model="m"}') == pytest.approx(
        (4000 * 1.0 + 600 * 4.0) / 1e6
    )
