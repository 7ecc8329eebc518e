"""OpenTelemetry spans from the Router's hooks, recorded by the SDK's in-memory exporter: one
span per message routed, per turn, per model call and per tool call, a turn linked to the
message that woke it, a message sent and a call made from inside a turn children of that
turn's span."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_router import Router, Settings, errors
from agent_router.domain import ToolOutcome, ToolRun
from agent_router.hooks import HookChain
from agent_router.outbox import RecordingPublisher
from agent_router.worker import runtime
from agent_router.worker.tracing import TracingHooks
from tests.integration.helpers import assistant, tool_call


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traced(sqlite_url: str, exporter: InMemorySpanExporter) -> Iterator[Router]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    router = Router(
        Settings(database_url=sqlite_url),
        publisher=RecordingPublisher(),
        hooks=TracingHooks(tracer_provider=provider),
    )
    router.create_schema()
    yield router
    router.close()


def attrs(span: ReadableSpan) -> dict[str, object]:
    return {k.removeprefix("agent_router."): v for k, v in (span.attributes or {}).items()}


def test_route_and_turn_spans_are_linked(traced: Router, exporter: InMemorySpanExporter) -> None:
    team = traced.create_team().id
    traced.create_agent(team, role="UI Operator")
    woke = traced.send(team, to="UI Operator_1", content="Build the login page.")
    turn = traced.claim_turn(team, "UI Operator_1")
    assert turn is not None
    turn.drain()
    report = traced.send(team, to="Team Leader", content="Half done.", sender="UI Operator_1")
    turn.append_assistant(assistant("Done."))
    turn.end()
    traced.terminate(team, "UI Operator_1", reason="done")
    with pytest.raises(errors.AgentTerminatedError):
        traced.send(team, to="UI Operator_1", content="Too late.")

    spans = exporter.get_finished_spans()
    routes = [s for s in spans if s.name == "agent_router.route"]
    [turn_span] = [s for s in spans if s.name == "agent_router.turn"]
    by_message = {attrs(s).get("message_id"): s for s in routes}

    first = by_message[woke.message_id]
    assert attrs(first) | {"team_id": team} == {
        "team_id": team, "sender": "user", "target": "UI Operator_1",
        "outcome": "triggered_new_turn", "message_id": woke.message_id, "epoch": 1,
        "duplicate": False,
    }  # fmt: skip
    assert first.parent is None

    assert attrs(turn_span)["agent"] == "UI Operator_1"
    assert attrs(turn_span)["turn_id"] == turn.id
    assert attrs(turn_span)["trigger"] == "new"
    assert attrs(turn_span)["state"] == "completed"
    assert attrs(turn_span)["failed"] is False
    # The turn links to the route span of the message that woke it.
    assert [link.context.span_id for link in turn_span.links] == [first.context.span_id]

    # Sent from inside the turn: a child of the turn's span.
    inner = by_message[report.message_id]
    assert inner.parent is not None and inner.parent.span_id == turn_span.context.span_id
    assert inner.context.trace_id == turn_span.context.trace_id

    [rejected] = [s for s in routes if attrs(s)["outcome"] == "rejected"]
    assert rejected.status.status_code is StatusCode.ERROR


def test_a_suspended_turn_ends_its_span_and_wakers_are_bounded(
    traced: Router, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn that suspends in a wait has no end-of-turn hook: its span ends at the wait, and
    the hooks keep nothing of it. Route spans kept for turns claimed elsewhere are bounded."""
    from agent_router.worker import tracing

    hooks = traced.hooks.hooks[0] if isinstance(traced.hooks, HookChain) else traced.hooks
    assert isinstance(hooks, TracingHooks)
    team = traced.create_team().id
    traced.create_agent(team, role="Engineer")
    traced.send(team, to="Engineer_1", content="Ask the lead.")
    turn = traced.claim_turn(team, "Engineer_1")
    assert turn is not None
    turn.drain()
    turn.append_assistant(assistant(None, tool_call("q1", "ask_master")))
    question = turn.ask("Team Leader", "which?", tool_call_id="q1")
    assert turn.wait_for(question, block_seconds=0.01).value == "suspended"
    [span] = [s for s in exporter.get_finished_spans() if s.name == "agent_router.turn"]
    assert attrs(span)["suspended"] is True and attrs(span)["turn_id"] == turn.id
    assert hooks._turns == {}

    monkeypatch.setattr(tracing, "WAKERS_KEPT", 5)
    for n in range(8):
        name = traced.create_agent(team, role="Writer").display_name
        traced.send(team, to=name, content=f"task {n}")
    assert len(hooks._wakers) == 5


def test_tracing_is_off_unless_configured(sqlite_url: str) -> None:
    def kinds(settings: Settings) -> set[str]:
        chain = runtime.default_hooks(settings)
        assert isinstance(chain, HookChain)
        return {type(h).__name__ for h in chain.hooks}

    assert "TracingHooks" not in kinds(Settings(database_url=sqlite_url))
    assert "TracingHooks" in kinds(Settings(database_url=sqlite_url, tracing=True))


def test_model_calls_and_tool_calls_are_spans_of_their_turn(
    traced: Router, exporter: InMemorySpanExporter
) -> None:
    """A model call recorded with how long it took, and a tool result kept with how its call
    ran: each a span, a child of its turn's span, from when the call began to when it ended."""
    team = traced.create_team().id
    traced.create_agent(team, role="Engineer")
    traced.send(team, to="Engineer_1", content="Run the tests.")
    turn = traced.claim_turn(team, "Engineer_1")
    assert turn is not None
    turn.drain()
    turn.record_usage(model="gpt-test", prompt_tokens=900, completion_tokens=40, seconds=1.5)
    turn.record_usage(model="gpt-test", prompt_tokens=950, completion_tokens=10)  # no duration
    turn.append_assistant(assistant(None, tool_call("c1", "shell__run_tests")))
    run = ToolRun(tool="shell__run_tests", server="shell", outcome=ToolOutcome.ERROR, seconds=0.25)
    turn.append_tool_result("c1", '{"ok": false, "error": "3 failed"}', run=run)
    turn.append_assistant(assistant("Tests fail."))
    turn.end()

    spans = exporter.get_finished_spans()
    [turn_span] = [s for s in spans if s.name == "agent_router.turn"]
    [model] = [s for s in spans if s.name == "agent_router.model_call"]
    [tool] = [s for s in spans if s.name == "agent_router.tool_call"]
    for span in (model, tool):
        assert span.parent is not None and span.parent.span_id == turn_span.context.span_id
        assert attrs(span)["agent"] == "Engineer_1" and attrs(span)["turn_id"] == turn.id
    assert model.end_time is not None and model.start_time is not None
    assert model.end_time - model.start_time == 1_500_000_000
    assert attrs(model)["model"] == "gpt-test"
    assert (attrs(model)["prompt_tokens"], attrs(model)["completion_tokens"]) == (900, 40)
    assert model.status.status_code is StatusCode.UNSET
    assert tool.end_time is not None and tool.start_time is not None
    assert tool.end_time - tool.start_time == 250_000_000
    assert (attrs(tool)["tool"], attrs(tool)["server"], attrs(tool)["outcome"]) == (
        "shell__run_tests", "shell", "error"
    )  # fmt: skip
    assert tool.status.status_code is StatusCode.ERROR
