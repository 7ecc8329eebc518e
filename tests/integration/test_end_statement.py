"""On PostgreSQL the common end of a turn is one statement. It must write exactly what the
general way writes: the same turn, agent state, ledger events, outbox row and transcript, ended
or failed, with wake mail pending or not; and every end it does not take (a stop requested, a
question waiting, a tool call of the last assistant message without its result, a stale turn)
must come out of the general way unchanged. Each case is ended twice, in two teams built
alike: once as it is, once with the one statement switched off. A message routed while the
statement waits for the agent's lock is never missed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import Router, Turn
from agent_router.domain import AgentState, RouteOutcome
from agent_router.errors import AgentRouterError
from agent_router.store import end_statement, turns
from agent_router.store.models import TurnRow

from .helpers import (
    assistant,
    start_running,
    statements_in_autocommit,
    tool_call,
    until_lock_waiters,
)

#: How ``Engineer_1``'s running turn is left before it ends, and whether the one statement
#: ends it (the rest go the general way).
SETUPS = {
    "final answer": True,
    "no assistant message": True,
    "wake mail pending": True,
    "quiet mail pending": True,
    "host-owned, wake mail pending": True,
    "tool calls answered": True,
    "tool call open": False,
    "stop requested": False,
    "question waiting": False,
    "already ended": False,
}


def _team(router: Router, setup: str) -> tuple[int, Turn]:
    """A team whose ``Engineer_1`` runs a turn left as ``setup`` says; the team and the turn."""
    team = router.create_team().id
    runner = "chat.engineer_turn" if setup.startswith("host-owned") else None
    router.create_agent(team, role="Engineer", runner=runner)
    turn = start_running(router, team, "Engineer_1")
    if setup != "no assistant message":
        calls = [tool_call("call-1")] if setup.startswith("tool call") else []
        turn.append_assistant(assistant(None if calls else "done", *calls))
    if setup == "tool calls answered":
        turn.append_tool_result("call-1", "ok")
    if "mail pending" in setup:
        wake = not setup.startswith("quiet")
        router.send(team, to="Engineer_1", content="and this", sender="Team Leader", wake=wake)
    if setup == "stop requested":
        router.stop(team, "Engineer_1", reason="enough")
    if setup == "question waiting":
        turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
        turn.ask("Team Leader", "which one?", tool_call_id="ask-1")
    if setup == "already ended":
        turn.end()
    return team, turn


def _ended(router: Router, team: int, turn: Turn, *, failed: bool) -> dict[str, Any]:
    """What ending ``turn`` returned and wrote, without ids and times."""
    ledger_before = len(router.ledger(team))
    outbox_before = len(router.outbox(team))
    transcript_before = len(router.transcript(team, "Engineer_1"))
    try:
        end = turn.end(failed=failed, error="the model failed" if failed else None)
        returned: Any = (end.follow_up, end.state, end.epoch, end.synthetic_results)
    except AgentRouterError as refused:
        returned = type(refused).__name__
    a = router.agent(team, "Engineer_1")
    with router.store.engine.connect() as conn:
        turn_rows = conn.execute(
            sa.select(TurnRow.epoch, TurnRow.trigger, TurnRow.status, TurnRow.error)
            .where(TurnRow.agent_id == turn.agent_id)
            .order_by(TurnRow.id)
        ).all()
        ended_at = conn.execute(
            sa.select(TurnRow.ended_at.is_not(None)).where(TurnRow.id == turn.record.id)
        ).scalar_one()
    return {
        "returned": returned,
        "agent": (a.state, a.epoch, a.pending_trigger, a.suspended, a.mailbox_depth),
        "turns": [tuple(r) for r in turn_rows],
        "ended_at": ended_at,
        "ledger": [
            (e.action, e.agent_name, e.epoch, e.turn_id == turn.record.id, e.detail)
            for e in router.ledger(team)[ledger_before:]
        ],
        "outbox": [
            (e.kind, e.epoch, {**e.payload, "team_id": e.payload["team_id"] == team})
            for e in router.outbox(team)[outbox_before:]
        ],
        "transcript": router.transcript(team, "Engineer_1")[transcript_before:],
    }


@pytest.mark.parametrize("failed", [False, True], ids=["ended", "failed"])
@pytest.mark.parametrize("setup", list(SETUPS))
def test_the_one_statement_ends_as_the_general_way_ends(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, setup: str, failed: bool
) -> None:
    written = []
    for general in (False, True):
        team, turn = _team(pg_router, setup)
        with monkeypatch.context() as patch:
            if general:
                patch.setattr(end_statement, "eligible", lambda settings: False)
            written.append(_ended(pg_router, team, turn, failed=failed))
    fast, general_way = written
    assert fast == general_way
    if setup == "already ended":
        assert fast["returned"] == "StaleTurnError"
    if setup == "wake mail pending" or (setup.startswith("host-owned") and not failed):
        assert fast["returned"][0] is True and len(fast["outbox"]) == 1
    if setup.startswith("host-owned") and fast["outbox"]:
        assert fast["outbox"][0][2]["task"] == "chat.engineer_turn"


@pytest.mark.parametrize("setup", list(SETUPS))
def test_the_common_end_is_one_statement(pg_router: Router, setup: str) -> None:
    """The common end is one statement, its own transaction (autocommit: no BEGIN, no
    COMMIT); any other end runs that statement, which writes nothing, then the general way in
    a transaction."""
    _, turn = _team(pg_router, setup)
    with statements_in_autocommit(pg_router) as seen:
        try:
            turn.end()
        except AgentRouterError:
            assert setup == "already ended"
    (statement, autocommit), *general = seen
    assert statement.lstrip().startswith('WITH "old" AS MATERIALIZED')
    assert "UPDATE ar_turns" in statement and autocommit
    if SETUPS[setup]:
        # Nothing else but, after a follow-up's turn task was published, its outbox mark.
        assert [
            s for s, _ in general if not s.startswith("UPDATE ar_outbox SET published_at")
        ] == []
    else:
        assert general and not any(a for _, a in general)


def _queued(
    router: Router, agent_id: int, first: Callable[[], Any], second: Callable[[], Any]
) -> tuple[Any, Any]:
    """Run ``first`` and then ``second`` in threads while another transaction holds the
    agent's row locked, each waiting for the lock in that order, then release it: ``first``
    takes the lock first. Their results."""
    results: dict[str, Any] = {}

    def run(name: str, call: Callable[[], Any]) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.__setitem__(name, call()))
        thread.start()
        return thread

    holder = sa.create_engine(router.settings.database_url)
    try:
        with holder.connect() as conn:
            conn.execute(
                sa.text("SELECT 1 FROM ar_agents WHERE id = :id FOR UPDATE"), {"id": agent_id}
            )
            threads = [run("first", first)]
            until_lock_waiters(conn, 1)
            threads.append(run("second", second))
            until_lock_waiters(conn, 2)
            conn.rollback()
            for thread in threads:
                thread.join(30)
    finally:
        holder.dispose()
    assert set(results) == {"first", "second"}
    return results["first"], results["second"]


@pytest.mark.parametrize("first", ["send", "end"])
def test_a_message_routed_while_the_end_waits_for_the_lock_gets_one_turn(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """The end's statement and a send queue for the agent's lock, in both orders, 20 times
    each. A send that takes the lock first commits its message after the end's statement
    began, so the statement's snapshot does not show it: the statement writes nothing and the
    general way ends the turn with the one follow-up. An end first completes the agent, and
    the send then starts its turn. Either way exactly one turn is enqueued for the message."""
    general_ends: list[int] = []
    end_turn = turns.end_turn

    def counted(*args: Any, **kwargs: Any) -> Any:
        general_ends.append(1)
        return end_turn(*args, **kwargs)

    monkeypatch.setattr(turns, "end_turn", counted)
    for i in range(20):
        team, turn = _team(pg_router, "final answer")
        outbox_before = len(pg_router.outbox(team))

        def send(team: int = team, i: int = i) -> Any:
            return pg_router.send(team, to="Engineer_1", content=f"steer {i}", sender="user")

        calls: dict[str, Callable[[], Any]] = {"send": send, "end": turn.end}
        other = "end" if first == "send" else "send"
        results = dict(
            zip(
                [first, other],
                _queued(pg_router, turn.agent_id, calls[first], calls[other]),
                strict=True,
            )
        )
        end, delivery = results["end"], results["send"]
        enqueued = [
            e for e in pg_router.outbox(team)[outbox_before:] if e.agent_id == turn.agent_id
        ]
        assert len(enqueued) == 1
        assert pg_router.agent(team, "Engineer_1").state is AgentState.SCHEDULED
        if first == "send":
            assert delivery.outcome is RouteOutcome.INJECTED_INLINE and end.follow_up
        else:
            assert delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN and not end.follow_up
        nxt = pg_router.claim_turn(team, "Engineer_1")
        assert nxt is not None and [m.id for m in nxt.drain()] == [delivery.message_id]
    # The statement gave way to the general way exactly when the send went first.
    assert len(general_ends) == (20 if first == "send" else 0)
