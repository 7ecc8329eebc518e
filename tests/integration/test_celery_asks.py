"""Blocking asks through a real Celery worker on Redis + PostgreSQL: a single worker slot and two
sub-agents that both ask the lead. A blocked ask holds the slot for at most
``ask_block_seconds``; then it suspends and frees it, so the lead can run and answer both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from agent_router import (
    AgentState,
    MessageType,
    QuestionStatus,
    RouteOutcome,
    Settings,
    TurnStatus,
    TurnTrigger,
)
from agent_router.agents.llm import directive
from agent_router.formats import parse
from agent_router.ops.checks import check_team
from agent_router.ops.demo import wait_quiescent
from agent_router.worker import runtime
from agent_router.worker.runtime import Runtime
from agent_router.worker.threaded import thread_worker

TIMEOUT = 60.0


@pytest.fixture
def one_slot_worker(celery_settings: Settings, celery_app: Celery) -> Iterator[Runtime]:
    settings = celery_settings.model_copy(
        update={
            "ask_block_seconds": 0.3,
            "scripted_write_seconds": 0.0,
        }
    )
    rt = runtime.configure(settings, app=celery_app)
    try:
        with thread_worker(celery_app, concurrency=1, queues=[settings.queue]):
            yield rt
    finally:
        runtime.reset()


def test_two_askers_and_the_lead_share_one_worker_slot(one_slot_worker: Runtime) -> None:
    router = one_slot_worker.router
    team = router.create_team()
    names = [router.create_agent(team.id, role=r).display_name for r in ("UI Operator", "Designer")]
    for name in names:
        router.send(
            team.id,
            to=name,
            content=f"Start.\n{directive('ask_master', question=f'{name}: go ahead?')}",
            sender="user",
            type=MessageType.TASK,
        )
    wait_quiescent(router, team.id, timeout=TIMEOUT)

    messages = router.messages(team.id)
    asks = [m for m in messages if m.type is MessageType.ASK]
    assert sorted(m.source_name for m in asks) == sorted(names)
    for ask in asks:
        question = router.question(ask.question_id or 0)
        assert question.status is QuestionStatus.ANSWERED
        answer = next(m for m in messages if m.id == question.answer_message_id)
        assert answer.source_name == "Team Leader" and answer.outcome is RouteOutcome.RESOLVED
        (result,) = [
            e
            for e in router.transcript(team.id, ask.source_name)
            if e.get("tool_call_id") == question.tool_call_id
        ]
        assert parse(result["content"]).message_id == answer.id
    # With one slot, at least one asker had to give its slot up and continue later.
    turns = [t for name in names for t in router.store.reads.turns(router.agent(team.id, name).id)]
    assert any(t.status is TurnStatus.SUSPENDED for t in turns)
    assert any(t.trigger is TurnTrigger.CONTINUATION for t in turns)
    assert all(router.agent(team.id, n).state is AgentState.COMPLETED for n in names)
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report.violations


@pytest.fixture
def two_slot_worker(celery_settings: Settings, celery_app: Celery) -> Iterator[Runtime]:
    """Two slots; an ask holds its slot for ten minutes while the agent asked is at work, a
    fraction of a second while it is not."""
    settings = celery_settings.model_copy(
        update={"ask_block_seconds": 600.0, "ask_grace_seconds": 0.3, "scripted_write_seconds": 0.0}
    )
    rt = runtime.configure(settings, app=celery_app)
    try:
        with thread_worker(celery_app, concurrency=2, queues=[settings.queue]):
            yield rt
    finally:
        runtime.reset()


def test_asks_to_a_queued_lead_free_their_slots_and_each_is_answered_once(
    two_slot_worker: Runtime,
) -> None:
    """Four sub-agents ask their lead at once; the lead's turn is queued behind them on a worker
    of two slots. Blocking until ``ask_block_seconds`` would hold both slots for ten minutes;
    the asks give them up after the grace instead, the lead runs and answers each, and each
    asker continues exactly once with its answer."""
    router = two_slot_worker.router
    team = router.create_team()
    roles = ("UI Operator", "Designer", "Engineer", "Researcher")
    names = [router.create_agent(team.id, role=r).display_name for r in roles]
    for name in names:
        router.send(
            team.id,
            to=name,
            content=f"Start.\n{directive('ask_master', question=f'{name}: go ahead?')}",
            sender="user",
            type=MessageType.TASK,
        )
    wait_quiescent(router, team.id, timeout=TIMEOUT)

    messages = router.messages(team.id)
    asks = [m for m in messages if m.type is MessageType.ASK]
    assert sorted(m.source_name for m in asks) == sorted(names)
    for ask in asks:
        question = router.question(ask.question_id or 0)
        assert question.status is QuestionStatus.ANSWERED
        results = [
            e
            for e in router.transcript(team.id, ask.source_name)
            if e.get("tool_call_id") == question.tool_call_id
        ]
        assert len(results) == 1
        assert parse(results[0]["content"]).message_id == question.answer_message_id
    for name in names:
        turns = router.store.reads.turns(router.agent(team.id, name).id)
        suspended = [t for t in turns if t.status is TurnStatus.SUSPENDED]
        continued = [t for t in turns if t.trigger is TurnTrigger.CONTINUATION]
        assert len(continued) == len(suspended) <= 1
        assert router.agent(team.id, name).state is AgentState.COMPLETED
    report = check_team(router, team.id, quiescent=True)
    assert report.ok, report.violations
