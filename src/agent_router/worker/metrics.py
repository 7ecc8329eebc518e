"""Prometheus metrics of a worker: a :class:`~agent_router.hooks.RouterHooks` that counts what the
Router does (and what its sweeper timer repairs), plus a collector of cluster-wide gauges read
from the database at scrape time.

Served by ``agent-router worker`` on ``Settings.metrics_port``. Counters live in the worker
process: use the threads pool (the default) or one scrape target per process; a ``sum()`` over
workers is the deployment's total. The cluster gauges are the same from every process, so one
process serves them: ``agent-router metrics`` (or a worker with ``metrics_cluster_gauges``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent_router.domain import (
    AgentState,
    BudgetName,
    RouteOutcome,
    SweepStep,
    TurnTrigger,
    WaitOutcome,
)
from agent_router.hooks import RouterHooks
from agent_router.logfields import get_logger
from agent_router.store.quarantine import QUARANTINE_AFTER

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from agent_router.domain import Delivery, EndOfTurn, TokenUsage
    from agent_router.errors import AgentRouterError
    from agent_router.store import Reads
    from agent_router.sweeper import SweepReport
    from agent_router.turn import Turn

logger = get_logger(__name__)

#: Turns last from seconds (a scripted reply) to an hour (``max_turn_seconds``).
TURN_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)
#: A blocked ask ends within ``ask_block_seconds`` (30 s by default), then suspends.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
#: The repairs a sweeper pass reports (fields of ``SweepReport``).
SWEEP_KINDS = ("republished", "taken_over", "reenqueued", "expired", "jobs_reported")


@dataclass(frozen=True)
class _Metric:
    """One counter or histogram of :class:`PrometheusHooks`. ``zero``: values of its one label
    that exist from the start at 0, so that rate() and alerts see a series before the first
    event of its kind (a first rejection, a first recovery)."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    zero: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None  # a histogram's; None: a counter

    def make(self, registry: CollectorRegistry) -> Counter | Histogram:
        metric: Counter | Histogram
        if self.buckets is None:
            metric = Counter(self.name, self.help, self.labels, registry=registry)
        else:
            metric = Histogram(
                self.name, self.help, self.labels, buckets=self.buckets, registry=registry
            )
        for value in self.zero:
            metric.labels(value)
        return metric


#: The metrics of :class:`PrometheusHooks`, by the attribute that holds each.
_METRICS = {
    "routed": _Metric(
        "agent_router_messages_routed",
        "Messages routed, by outcome (rejected: refused sends).",
        ("outcome",),
        zero=tuple(outcome.value for outcome in RouteOutcome),
    ),
    "turns_started": _Metric(
        "agent_router_turns_started",
        "Turns claimed by a worker, by trigger.",
        ("trigger",),
        zero=tuple(trigger.value for trigger in TurnTrigger),
    ),
    "turn_seconds": _Metric(
        "agent_router_turn_duration_seconds",
        "From claim to end-of-turn hook, by how the turn ended (ended, failed).",
        ("status",),
        zero=("ended", "failed"),
        buckets=TURN_BUCKETS,
    ),
    "wait_seconds": _Metric(
        "agent_router_wait_duration_seconds",
        "How long a blocked ask held its worker, by outcome (resolved, suspended).",
        ("outcome",),
        zero=tuple(wait.value for wait in WaitOutcome),
        buckets=WAIT_BUCKETS,
    ),
    "follow_ups": _Metric(
        "agent_router_follow_ups", "Follow-up turns fired by the end-of-turn hook."
    ),
    "recoveries": _Metric(
        "agent_router_recoveries",
        "Recovery turns started after a dead worker's turn was taken over.",
    ),
    "sweeps": _Metric(
        "agent_router_sweeps",
        "Sweeper passes this process ran (its timer; beat's task passes are not counted).",
    ),
    "sweep_repairs": _Metric(
        "agent_router_sweep_repairs",
        "What sweeper passes of this process repaired, by kind (republished, taken_over, "
        "reenqueued, expired, jobs_reported).",
        ("kind",),
        zero=SWEEP_KINDS,
    ),
    "sweep_failures": _Metric(
        "agent_router_sweep_failures",
        "Repairs of sweeper passes of this process that failed for one agent, by step "
        "(republish, take_over, reenqueue, expire, poll_job): each is ledgered sweep_failed, "
        "the agent left alone for a while, and the pass went on for the others.",
        ("step",),
        zero=tuple(step.value for step in SweepStep),
    ),
    # Usage: model calls, tokens and cost per model; teams stopped per budget.
    "model_calls": _Metric(
        "agent_router_model_calls", "Model calls whose usage was recorded, by model.", ("model",)
    ),
    "tokens": _Metric(
        "agent_router_tokens",
        "Tokens used by model calls, by model and kind (prompt, completion, cached; "
        "cached tokens are part of the prompt tokens).",
        ("model", "kind"),
    ),
    "cost": _Metric(
        "agent_router_cost_usd",
        "What model calls cost in US dollars, by the price table, by model.",
        ("model",),
    ),
    "budgets_exhausted": _Metric(
        "agent_router_budgets_exhausted",
        "Teams stopped because a budget was spent, by budget.",
        ("budget",),
        zero=tuple(budget.value for budget in BudgetName),
    ),
}


class PrometheusHooks(RouterHooks):
    """Counts routing outcomes, turn starts, follow-ups, recoveries; times turns and waits."""

    routed: Counter
    turns_started: Counter
    turn_seconds: Histogram
    wait_seconds: Histogram
    follow_ups: Counter
    recoveries: Counter
    sweeps: Counter
    sweep_repairs: Counter
    sweep_failures: Counter
    model_calls: Counter
    tokens: Counter
    cost: Counter
    budgets_exhausted: Counter

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        for attribute, metric in _METRICS.items():
            setattr(self, attribute, metric.make(registry))

    def record_sweep(self, report: SweepReport) -> None:
        """Count one sweeper pass and what it repaired."""
        self.sweeps.inc()
        for kind in SWEEP_KINDS:
            self.sweep_repairs.labels(kind=kind).inc(getattr(report, kind))
        for failure in report.failures:
            self.sweep_failures.labels(step=failure.step.value).inc()

    def after_route(self, team_id: int, sender: str, delivery: Delivery) -> None:
        if not delivery.duplicate:
            self.routed.labels(outcome=delivery.outcome.value).inc()

    def after_reject(self, team_id: int | None, sender: str, error: AgentRouterError) -> None:
        self.routed.labels(outcome="rejected").inc()

    def after_claim(self, turn: Turn) -> None:
        self.turns_started.labels(trigger=turn.trigger.value).inc()
        if turn.trigger is TurnTrigger.RECOVERY:
            self.recoveries.inc()

    def after_wait(self, turn: Turn, outcome: WaitOutcome, seconds: float) -> None:
        self.wait_seconds.labels(outcome=outcome.value).observe(seconds)

    def after_end_turn(self, turn: Turn, end: EndOfTurn, seconds: float, *, failed: bool) -> None:
        status = "failed" if failed else "ended"
        self.turn_seconds.labels(status=status).observe(max(seconds, 0.0))
        if end.follow_up:
            self.follow_ups.inc()

    def after_model_call(self, turn: Turn, model: str | None, usage: TokenUsage) -> None:
        name = model or "unknown"
        self.model_calls.labels(model=name).inc()
        self.tokens.labels(model=name, kind="prompt").inc(usage.prompt_tokens)
        self.tokens.labels(model=name, kind="completion").inc(usage.completion_tokens)
        self.tokens.labels(model=name, kind="cached").inc(usage.cached_tokens)
        self.cost.labels(model=name).inc(usage.cost_usd)

    def after_budget_exhausted(self, team_id: int, budget: BudgetName) -> None:
        self.budgets_exhausted.labels(budget=budget.value).inc()


class ClusterCollector(Collector):
    """Gauges of the whole deployment, read from the database at each scrape: pending messages
    and agents by agent state, the age of the oldest pending message, open questions and
    unpublished outbox rows. Every process would read the same figures, so exactly one serves
    them (``agent-router metrics``, or the worker with ``metrics_cluster_gauges``): a ``sum()``
    over scrape targets stays right."""

    def __init__(self, reads: Callable[[], Reads]) -> None:
        self._reads = reads

    def describe(self) -> Iterator[Metric]:
        # Registration asks for the names; answering without a database read keeps a worker's
        # start-up free of queries (and of building the runtime before the pool forks).
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "agent_router_mailbox_depth",
                "Pending (undelivered) messages, by the target agent's state.",
                labels=["agent_state"],
            ),
            GaugeMetricFamily("agent_router_agents", "Agents, by state.", labels=["agent_state"]),
            GaugeMetricFamily(
                "agent_router_oldest_pending_message_age_seconds",
                "Age of the oldest message still pending in any mailbox (0 when none is).",
            ),
            GaugeMetricFamily("agent_router_open_questions", "Questions not yet resolved."),
            GaugeMetricFamily(
                "agent_router_outbox_unpublished",
                "Outbox rows (turn tasks) not yet published to the broker.",
            ),
            GaugeMetricFamily(
                "agent_router_quarantined_agents",
                "Agents a sweeper repair kept failing for (quarantined: left alone, with "
                "backoff, until a repair succeeds); `agent-router check` names them.",
            ),
        )

    def collect(self) -> Iterator[Metric]:
        depth, agents, oldest, questions, outbox, quarantined = self._families()
        try:
            reads = self._reads()
            counts = reads.state_counts()
            figures = reads.cluster_figures()
            held = reads.quarantined()
        except Exception:  # a scrape must not fail because the database is away
            logger.warning("cluster gauges not read", exc_info=True, extra={"action": "metrics"})
            return
        for state in AgentState:
            n_agents, pending = counts.get(state, (0, 0))
            depth.add_metric([state.value], pending)
            agents.add_metric([state.value], n_agents)
        oldest.add_metric([], figures[0])
        questions.add_metric([], figures[1])
        outbox.add_metric([], figures[2])
        quarantined.add_metric([], sum(q.failures >= QUARANTINE_AFTER for q in held))
        yield from (depth, agents, oldest, questions, outbox, quarantined)


#: The earlier name of :class:`ClusterCollector`.
MailboxCollector = ClusterCollector


class _Default:
    lock = threading.Lock()
    hooks: PrometheusHooks | None = None


def default_hooks() -> PrometheusHooks:
    """The process's hooks on the default registry (metrics can be registered only once)."""
    with _Default.lock:
        if _Default.hooks is None:
            _Default.hooks = PrometheusHooks()
        return _Default.hooks


def serve(
    port: int,
    *,
    reads: Callable[[], Reads] | None = None,
    registry: CollectorRegistry = REGISTRY,
    addr: str = "127.0.0.1",
) -> WSGIServer:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread; with ``reads``
    (what gives a router's :attr:`~agent_router.router.Router.reads`, called at each scrape),
    the cluster gauges are read from them. ``addr`` is loopback unless the deployment says
    otherwise (``Settings.metrics_address``). Returns the server (``shutdown()`` stops it)."""
    # Counters get no `_created` series: one per label set, and no dashboard reads them.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    if registry is REGISTRY:
        default_hooks()  # registered now, so a scrape before the first turn lists them too
    if reads is not None:
        registry.register(ClusterCollector(reads))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    logger.info("metrics served", extra={"action": "metrics", "port": server.server_port})
    return server
