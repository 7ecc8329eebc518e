"""OpenTelemetry spans of routing and turns, from the Router's hooks. Optional: it needs the
``otel`` extra (``opentelemetry-api``) and is off unless ``AGENT_ROUTER_TRACING`` is set; the
spans go to whatever tracer provider the process configured (the SDK and an exporter, e.g.
through the standard ``OTEL_*`` variables and ``opentelemetry-instrument``).

- ``agent_router.turn``: one span per turn, from its claim to its end-of-turn hook (or the wait
  it suspended in), with the agent, team, turn id, epoch, trigger and how it ended (an error
  status when it failed). A turn started by a message links to that message's route span.
- ``agent_router.route``: one span per message routed (or refused), with sender, receiver,
  outcome and message id; a message sent from inside a turn is a child of that turn's span.
- ``agent_router.model_call`` and ``agent_router.tool_call``: one span per model call (model,
  tokens, cost) and per tool call (tool, server, outcome) of a turn, children of its span, from
  when the call started to when it ended.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import UTC
from typing import TYPE_CHECKING, Any

from agent_router.domain import RouteOutcome, WaitOutcome
from agent_router.hooks import RouterHooks, route_fields

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, TracerProvider

    from agent_router.domain import CallSpan, Delivery, EndOfTurn
    from agent_router.errors import AgentRouterError
    from agent_router.turn import Turn

PREFIX = "agent_router."
#: Route spans kept to link the turns they wake. A route's turn is often claimed by another
#: process, so most entries of a sender's process are never taken: the oldest go first.
WAKERS_KEPT = 10_000


class TracingHooks(RouterHooks):
    """Router hooks that record spans; ``tracer_provider`` defaults to the global one."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = trace.get_tracer("agent_router", tracer_provider=tracer_provider)
        self._lock = threading.Lock()
        # Open turn spans by (team, agent), and the route span that woke an agent, to link.
        self._turns: dict[tuple[int, str], Span] = {}
        self._wakers: OrderedDict[tuple[int, str], SpanContext] = OrderedDict()

    def after_route(self, team_id: int, sender: str, delivery: Delivery) -> None:
        with self._lock:
            parent = self._turns.get((team_id, sender))
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(
            "agent_router.route",
            context=context,
            attributes=_attributes(
                **route_fields(team_id, sender, delivery),
                epoch=delivery.epoch,
                duplicate=delivery.duplicate,
            ),
        )
        span.end()
        if delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN:
            key = (team_id, delivery.target)
            with self._lock:
                self._wakers[key] = span.get_span_context()
                self._wakers.move_to_end(key)
                while len(self._wakers) > WAKERS_KEPT:
                    self._wakers.popitem(last=False)

    def after_reject(self, team_id: int | None, sender: str, error: AgentRouterError) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.tracer.start_span(
            "agent_router.route",
            attributes=_attributes(team_id=team_id, sender=sender, outcome="rejected"),
        )
        span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()

    def after_claim(self, turn: Turn) -> None:
        from opentelemetry.trace import Link

        key = (turn.team_id, turn.display_name)
        with self._lock:
            waker = self._wakers.pop(key, None)
        span = self.tracer.start_span(
            "agent_router.turn",
            links=[Link(waker)] if waker is not None else None,
            attributes=_attributes(
                team_id=turn.team_id,
                agent=turn.display_name,
                agent_id=turn.agent_id,
                turn_id=turn.id,
                epoch=turn.epoch,
                trigger=turn.trigger.value,
            ),
        )
        with self._lock:
            self._turns[key] = span

    def after_wait(self, turn: Turn, outcome: WaitOutcome, seconds: float) -> None:
        key = (turn.team_id, turn.display_name)
        with self._lock:
            # A suspended turn ends here: no end-of-turn hook follows (its continuation is a
            # turn of its own, maybe in another process).
            suspended = outcome is WaitOutcome.SUSPENDED
            span = self._turns.pop(key, None) if suspended else self._turns.get(key)
        if span is not None:
            span.add_event("wait", _attributes(outcome=outcome.value, seconds=round(seconds, 3)))
            if suspended:
                span.set_attributes(_attributes(suspended=True))
                span.end()

    def after_call(self, turn: Turn, span: CallSpan) -> None:
        from opentelemetry.trace import Status, StatusCode

        with self._lock:
            parent = self._turns.get((turn.team_id, turn.display_name))
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        start = round(span.started.replace(tzinfo=UTC).timestamp() * 1e9)
        recorded = self.tracer.start_span(
            f"agent_router.{span.kind}_call",
            context=context,
            start_time=start,
            attributes=_attributes(
                team_id=turn.team_id,
                agent=turn.display_name,
                turn_id=turn.id,
                **{span.kind: span.name},
                **span.fields,
            ),
        )
        if span.fields.get("outcome") == "error":
            recorded.set_status(Status(StatusCode.ERROR, "the tool call failed"))
        recorded.end(end_time=start + round(span.seconds * 1e9))

    def after_end_turn(self, turn: Turn, end: EndOfTurn, seconds: float, *, failed: bool) -> None:
        from opentelemetry.trace import Status, StatusCode

        with self._lock:
            span = self._turns.pop((turn.team_id, turn.display_name), None)
        if span is None:
            return
        span.set_attributes(
            _attributes(state=end.state.value, follow_up=end.follow_up, failed=failed)
        )
        if failed:
            span.set_status(Status(StatusCode.ERROR, "the turn failed"))
        span.end()


def _attributes(**values: Any) -> dict[str, Any]:
    return {PREFIX + k: v for k, v in values.items() if v is not None}
