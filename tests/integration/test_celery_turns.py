"""Agent turns as Celery tasks, with real workers: Redis + PostgreSQL (in-process testing worker
and an ``agent-router worker`` subprocess, also on RabbitMQ), and the embedded mode (SQLite +
memory://)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from agent_router import (
    Agent,
    AgentState,
    LedgerAction,
    MessageStatus,
    MessageType,
    QuestionStatus,
    RouteOutcome,
    Router,
    Settings,
    TurnStatus,
    TurnTrigger,
)
from agent_router.agents.llm import Model, ScriptedModel
from agent_router.broker import create_app
from agent_router.constants import RUN_AGENT_TURN
from agent_router.formats import parse
from agent_router.ops.checks import check_team
from agent_router.ops.cli import embedded_worker
from agent_router.ops.demo import (
    RACE,
    STEER,
    WRAP_UP,
    DemoResult,
    run_scenarios,
    setup_team,
    wait_quiescent,
    wait_until,
)
from agent_router.outbox import RecordingPublisher
from agent_router.worker import runtime
from agent_router.worker.runtime import Runtime

TIMEOUT = 60.0


def assert_scenarios(router: Router, result: DemoResult) -> None:
    """The demo's own checks, and the same facts read again from transcripts and the ledger."""
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert not failed, failed
    assert result.ok and len(result.checks) == 9
    team_id = result.team_id
    assert check_team(router, team_id, quiescent=True).ok

    ui = router.agent(team_id, "UI Operator_1")
    engineer = router.agent(team_id, "Full-Stack Engineer_1")
    messages = router.messages(team_id)
    by_content = {m.content: m for m in messages}
    steer, wrap, race = by_content[STEER], by_content[WRAP_UP], by_content[RACE]
    # Everything the sub-agents got from the lead, the lead sent with its tools.
    assert steer.source_name == wrap.source_name == "Team Leader"
    assert steer.outcome is RouteOutcome.INJECTED_INLINE
    assert wrap.outcome is RouteOutcome.INJECTED_INLINE
    assert race.outcome is RouteOutcome.INJECTED_INLINE

    ui_turns = router.store.reads.turns(ui.id)
    assert [t.trigger for t in ui_turns] == [
        TurnTrigger.NEW,
        TurnTrigger.NEW,
        TurnTrigger.FOLLOW_UP,
    ]
    assert [t.status for t in ui_turns] == [TurnStatus.ENDED, TurnStatus.ENDED, TurnStatus.STOPPED]
    assert ui.state is AgentState.IDLE
    # 3.1: the steer entered the first turn's transcript and the model answered it there.
    transcript = router.transcript(team_id, ui.display_name)
    assert transcript[0]["role"] == "system"  # the role's prompt, snapshotted at creation
    steer_at = next(i for i, e in enumerate(transcript) if STEER in str(e.get("content")))
    assert transcript[steer_at]["role"] == "user"
    assert transcript[steer_at + 1]["role"] == "assistant"
    assert "Understood" in transcript[steer_at + 1]["content"]
    # 3.4: the race message came after the final reply of its turn, and the follow-up drained it.
    race_at = next(i for i, e in enumerate(transcript) if RACE in str(e.get("content")))
    assert transcript[race_at - 1]["role"] == "assistant"
    assert "Wrapped up early" in transcript[race_at - 1]["content"]
    assert race.consumed_turn_id == ui_turns[2].id

    # 3.2 and 3.5: each answer is the tool result of the call that asked, exactly once.
    asks = [m for m in messages if m.type is MessageType.ASK]
    assert [(m.source_name, m.target_name) for m in asks] == [
        ("Full-Stack Engineer_1", "Team Leader"),
        ("UI Operator_1", "Full-Stack Engineer_1"),
    ]
    for ask in asks:
        question = router.question(ask.question_id or 0)
        assert question.status is QuestionStatus.ANSWERED and not question.waiting
        answer = next(m for m in messages if m.id == question.answer_message_id)
        assert answer.outcome is RouteOutcome.RESOLVED
        asker = router.store.reads.agent_by_id(question.asker_agent_id)
        results = [
            e
            for e in router.transcript(team_id, asker.display_name)
            if e.get("tool_call_id") == question.tool_call_id
        ]
        assert len(results) == 1 and parse(results[0]["content"]).content == answer.content

    # 3.3: the engineer's second task started a new turn after the first ended.
    engineer_turns = router.store.reads.turns(engineer.id)
    assert [t.trigger for t in engineer_turns] == [TurnTrigger.NEW, TurnTrigger.NEW]
    assert engineer_turns[0].ended_at is not None
    assert engineer_turns[0].ended_at <= engineer_turns[1].started_at

    ledger = router.ledger(team_id)
    # The lead may get follow-ups too (a report landing after its last drain); among the
    # sub-agents only the 3.4 race causes one.
    follow_ups = [
        e
        for e in ledger
        if e.action is LedgerAction.FOLLOW_UP and e.agent_id in (ui.id, engineer.id)
    ]
    assert [e.agent_name for e in follow_ups] == ["UI Operator_1"]
    reports = [
        m for m in messages if m.type is MessageType.OUTPUT and m.subtype is not None and m.wake
    ]
    assert len(reports) == 4  # one completion report per sub-agent turn but the stopped one
    created = [e.detail["display_name"] for e in ledger if e.action is LedgerAction.AGENT_CREATED]
    assert created == ["UI Operator_1", "Full-Stack Engineer_1"]


def test_demo_scenarios_with_inprocess_worker(inproc_worker: Runtime) -> None:
    router = inproc_worker.router
    result = run_scenarios(router, setup_team(router), timeout=TIMEOUT)
    assert_scenarios(router, result)


@pytest.mark.parametrize("broker_url", ["redis", "rabbitmq"], indirect=True)
def test_demo_scenarios_with_subprocess_worker(subprocess_worker: Runtime) -> None:
    """An ``agent-router worker`` process on each production broker (Redis and RabbitMQ)."""
    router = subprocess_worker.router
    result = run_scenarios(router, setup_team(router), timeout=TIMEOUT)
    assert_scenarios(router, result)


def test_demo_scenarios_embedded(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'embedded.db'}",
        broker_url="memory://",
        queue=f"agent_router.test.{tmp_path.name}",
        work_seconds=0.1,
        scripted_write_seconds=1.0,
    )
    app = create_app(settings)
    rt = runtime.configure(settings, app=app)
    try:
        rt.router.create_schema()
        with embedded_worker(app, concurrency=8):
            result = run_scenarios(rt.router, setup_team(rt.router), timeout=TIMEOUT)
        assert_scenarios(rt.router, result)
    finally:
        runtime.reset()


def test_duplicate_delivery_runs_one_turn(inproc_worker: Runtime) -> None:
    # A router that records instead of publishing: the test delivers the task itself, twice.
    recorder = RecordingPublisher()
    router = Router(inproc_worker.router.settings, publisher=recorder)
    try:
        team = router.create_team()
        agent = router.create_agent(team.id, role="Full-Stack Engineer")
        delivery = router.send(
            team.id, to=agent.display_name, content="Fix the build.", type=MessageType.TASK
        )
        assert delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN
        (entry,) = recorder.entries
        for _ in range(2):
            inproc_worker.app.send_task(RUN_AGENT_TURN, args=(entry.agent_id, entry.epoch))
        wait_until(
            lambda: any(
                e.action is LedgerAction.CLAIM_REFUSED and e.agent_id == agent.id
                for e in router.ledger(team.id)
            ),
            "the second delivery to be refused",
            timeout=TIMEOUT,
        )
        wait_quiescent(router, team.id, timeout=TIMEOUT)

        turns = router.store.reads.turns(agent.id)
        assert len(turns) == 1 and turns[0].epoch == entry.epoch
        refused = [
            e
            for e in router.ledger(team.id)
            if e.action is LedgerAction.CLAIM_REFUSED and e.agent_id == agent.id
        ]
        assert len(refused) == 1 and refused[0].epoch == entry.epoch
        entries = router.store.reads.transcript_entries(agent.id)
        assert [e["message_id"] for e in entries].count(delivery.message_id) == 1
        assert check_team(router, team.id, quiescent=True).ok
    finally:
        router.close()


class FailsOnce:
    """A model factory: the first call of the named agent's first turn waits for ``go``, then
    raises; everything else is the scripted model."""

    def __init__(self, name: str, settings: Settings) -> None:
        self.name = name
        self.settings = settings
        self.in_call = threading.Event()
        self.go = threading.Event()
        self.failed = False

    def __call__(self, agent: Agent) -> Model:
        scripted = ScriptedModel.for_agent(agent)
        if agent.display_name != self.name or self.failed:
            return scripted
        outer = self

        class Failing:
            def complete(
                self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
            ) -> dict[str, Any]:
                outer.failed = True
                outer.in_call.set()
                assert outer.go.wait(TIMEOUT)
                raise RuntimeError("model provider returned 500")

        return Failing()


def test_failed_turn_ends_tells_lead_and_follows_up(inproc_worker: Runtime) -> None:
    router = inproc_worker.router
    team = router.create_team()
    agent = router.create_agent(team.id, role="Full-Stack Engineer")
    models = FailsOnce(agent.display_name, router.settings)
    runtime.configure(router.settings, app=inproc_worker.app, models=models)
    router = runtime.current().router

    router.send(team.id, to=agent.display_name, content="Migrate the DB.", type=MessageType.TASK)
    assert models.in_call.wait(TIMEOUT)
    # Arrives while the failing model call is in flight: pending when the turn fails.
    late = router.send(team.id, to=agent.display_name, content="Also vacuum it.")
    assert late.outcome is RouteOutcome.INJECTED_INLINE
    models.go.set()
    wait_until(
        lambda: (
            len(router.store.reads.turns(agent.id)) == 2
            and router.agent(team.id, agent.display_name).state.value == "completed"
        ),
        "the follow-up turn to finish",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team.id, timeout=TIMEOUT)

    first, second = router.store.reads.turns(agent.id)
    assert first.status is TurnStatus.FAILED
    assert (second.trigger, second.status) == (TurnTrigger.FOLLOW_UP, TurnStatus.ENDED)
    assert router.agent(team.id, agent.display_name).state.value == "completed"
    ledger = router.ledger(team.id)
    ended = next(e for e in ledger if e.action is LedgerAction.TURN_ENDED and e.turn_id == first.id)
    assert ended.detail["failed"] is True and "500" in ended.detail["error"]
    assert [e.turn_id for e in ledger if e.action is LedgerAction.FOLLOW_UP] == [first.id]
    (late_msg,) = [m for m in router.messages(team.id) if m.id == late.message_id]
    assert late_msg.status is MessageStatus.DELIVERED
    assert late_msg.consumed_turn_id == second.id

    notices = [
        m
        for m in router.messages(team.id)
        if m.type is MessageType.NOTICE and m.source_name == "system"
    ]
    assert len(notices) == 1
    assert notices[0].target_name == team.lead.display_name
    assert f"turn {first.id} failed" in notices[0].content
    # The guarantees held; the check reports the turn that failed on purpose, and nothing else.
    report = check_team(router, team.id, quiescent=True)
    assert report.violations == []
    assert len(report.failures) == 1 and f"turn {first.id} failed" in report.failures[0]


@pytest.mark.slow
def test_burst_of_100_messages_starts_one_turn(inproc_worker: Runtime) -> None:
    router = inproc_worker.router
    team = router.create_team()
    agent = router.create_agent(team.id, role="Full-Stack Engineer")
    deliveries = [
        router.send(team.id, to=agent.display_name, content=f"burst message {i}")
        for i in range(100)
    ]
    assert deliveries[0].outcome is RouteOutcome.TRIGGERED_NEW_TURN
    assert all(d.outcome is not RouteOutcome.TRIGGERED_NEW_TURN for d in deliveries[1:])
    wait_quiescent(router, team.id, timeout=TIMEOUT)

    turns = router.store.reads.turns(agent.id)
    assert 1 <= len(turns) <= 2, turns
    assert turns[0].trigger is TurnTrigger.NEW
    assert all(t.trigger is TurnTrigger.FOLLOW_UP for t in turns[1:])
    ids = [d.message_id for d in deliveries]
    in_transcript = [
        e["message_id"]
        for e in router.store.reads.transcript_entries(agent.id)
        if e["message_id"] is not None
    ]
    assert in_transcript == ids  # each once, in acceptance (seq) order
    assert check_team(router, team.id, quiescent=True).ok
