"""On PostgreSQL a turn's transcript append (the model's reply, a tool result) is one statement.
It must write and refuse exactly as the general way does: the same transcript and ledger for
every case, appended or refused (a tool call still open, a result for no open call, a stale
turn). Each case is appended twice, in two teams built alike: once as it is, once with the one
statement switched off. An answer appending its tool result while the statement waits for the
agent's lock never makes the two collide."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import MessageType, Router, Turn
from agent_router.errors import AgentRouterError
from agent_router.store import append_statement, routing, turns

from .helpers import (
    assistant,
    start_running,
    statements_in_autocommit,
    tool_call,
    until_lock_waiters,
)


def _nothing(turn: Turn) -> None:
    pass


def _reply(turn: Turn) -> None:
    turn.append_assistant(assistant("done"))


def _calls(turn: Turn) -> None:
    turn.append_assistant(assistant(None, tool_call("call-1"), tool_call("call-2")))


def _one_answered(turn: Turn) -> None:
    _calls(turn)
    turn.append_tool_result("call-1", "a")


def _both_answered(turn: Turn) -> None:
    _one_answered(turn)
    turn.append_tool_result("call-2", "b")


def _ended(turn: Turn) -> None:
    _reply(turn)
    turn.end()


def _result(call_id: Any, content: str) -> Callable[[Turn], None]:
    def append(turn: Turn) -> None:
        turn.append_tool_result(call_id, content)

    return append


#: How ``Engineer_1``'s running turn is left, what is then appended, and whether the one
#: statement appends it (the rest go the general way, which refuses them).
CASES: dict[str, tuple[Callable[[Turn], None], Callable[[Turn], None], bool]] = {
    "a reply, nothing before": (_nothing, _reply, True),
    "a reply after answered calls": (_both_answered, _reply, True),
    "a reply while a call is open": (_one_answered, _reply, False),
    "a result of an open call": (_calls, _result("call-2", "b"), True),
    "a result of an answered call": (_one_answered, _result("call-1", "again"), False),
    "a result of no call": (_calls, _result("call-9", "?"), False),
    "a result whose id is not a string": (_calls, _result(1, "?"), False),
    "a result with no assistant message": (_nothing, _result("call-1", "?"), False),
    "a reply after the turn ended": (_ended, _reply, False),
}


def _appended(router: Router, case: str) -> dict[str, Any]:
    """What the case's append returned and wrote, without ids and times."""
    setup, append, _ = CASES[case]
    team = router.create_team().id
    router.create_agent(team, role="Engineer")
    turn = start_running(router, team, "Engineer_1")
    setup(turn)
    ledger_before = len(router.ledger(team))
    try:
        append(turn)
        returned = None
    except AgentRouterError as refused:
        returned = type(refused).__name__
    return {
        "returned": returned,
        # After the drained task, whose envelope names its message id.
        "transcript": router.transcript(team, "Engineer_1")[1:],
        "open": router.store.reads.open_tool_calls(turn.agent_id),
        "ledger": [
            (e.action, e.agent_name, e.epoch, e.detail) for e in router.ledger(team)[ledger_before:]
        ],
        "state": router.agent(team, "Engineer_1").state,
    }


@pytest.mark.parametrize("case", list(CASES))
def test_the_one_statement_appends_as_the_general_way_appends(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    written = []
    for general in (False, True):
        with monkeypatch.context() as patch:
            if general:
                patch.setattr(append_statement, "eligible", lambda settings: False)
            written.append(_appended(pg_router, case))
    fast, general_way = written
    assert fast == general_way
    assert (fast["returned"] is None) is CASES[case][2]


@pytest.mark.parametrize("case", list(CASES))
def test_an_append_is_one_statement(pg_router: Router, case: str) -> None:
    """An append the statement takes is that statement alone, its own transaction (no BEGIN,
    no COMMIT); one it does not take ran the statement, which wrote nothing, then the general
    way in a transaction (which refused it). A tool result whose id is not a string goes the
    general way at once."""
    setup, append, taken = CASES[case]
    team = pg_router.create_team().id
    pg_router.create_agent(team, role="Engineer")
    turn = start_running(pg_router, team, "Engineer_1")
    setup(turn)
    with statements_in_autocommit(pg_router) as seen:
        try:
            append(turn)
        except AgentRouterError:
            assert not taken
    if case == "a result whose id is not a string":
        assert not any(s.lstrip().startswith("WITH taken AS") for s, _ in seen)
        return
    (statement, autocommit), *general = seen
    assert " ".join(statement.split()).startswith("WITH taken AS (UPDATE ar_agents")
    assert "INSERT INTO ar_transcript_entries" in statement and autocommit
    if taken:
        assert general == []
    else:
        assert general and not any(a for _, a in general)


@pytest.mark.parametrize("first", ["answer", "append"])
def test_an_answer_appending_while_the_statement_waits_for_the_lock_takes_its_own_place(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """A reply with two tool calls, one an ask the agent waits on: the answer (which appends
    the ask's tool result) and the other call's result queue for the agent's lock, in both
    orders, 10 times each. An answer that takes the lock first commits its entry after the
    append's statement began, so the statement's snapshot misses it: the statement writes
    nothing and the general way appends after it. An append that takes the lock first bumps
    the agent's transcript counter, which the answer's statement reads from the row it then
    locks: the answer stays one statement and takes the next position. Either way both results
    are in the transcript, each once, at positions of their own."""
    general: dict[str, list[int]] = {"append": [], "answer": []}

    def counted(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            general[name].append(1)
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(turns, "append_tool_result", counted("append", turns.append_tool_result))
    monkeypatch.setattr(routing, "end_wait", counted("answer", routing.end_wait))
    for i in range(10):
        team = pg_router.create_team().id
        pg_router.create_agent(team, role="Engineer")
        turn = start_running(pg_router, team, "Engineer_1")
        turn.append_assistant(
            assistant(None, tool_call("ask-1", "ask_master"), tool_call("call-2"))
        )
        question = turn.ask("Team Leader", "which one?", tool_call_id="ask-1")

        def answer(team: int = team, question_id: int = question.id, i: int = i) -> Any:
            return pg_router.send(
                team,
                to="Engineer_1",
                content=f"this one {i}",
                sender="Team Leader",
                type=MessageType.ANSWER,
                question_id=question_id,
            )

        def append(turn: Turn = turn, i: int = i) -> None:
            turn.append_tool_result("call-2", f"done {i}")

        calls: dict[str, Callable[[], Any]] = {"answer": answer, "append": append}
        order = [first, "append" if first == "answer" else "answer"]
        errors: list[BaseException] = []

        def run(call: Callable[[], Any], errors: list[BaseException] = errors) -> None:
            try:
                call()
            except BaseException as exc:  # the test asserts there is none
                errors.append(exc)

        holder = sa.create_engine(pg_router.settings.database_url)
        try:
            with holder.connect() as conn:
                conn.execute(
                    sa.text("SELECT 1 FROM ar_agents WHERE id = :id FOR UPDATE"),
                    {"id": turn.agent_id},
                )
                threads = []
                for n, name in enumerate(order, start=1):
                    threads.append(threading.Thread(target=run, args=(calls[name],)))
                    threads[-1].start()
                    until_lock_waiters(conn, n)
                conn.rollback()
                for thread in threads:
                    thread.join(30)
        finally:
            holder.dispose()
        assert errors == []
        results = [
            entry["tool_call_id"]
            for entry in pg_router.transcript(team, "Engineer_1")
            if entry["role"] == "tool"
        ]
        assert sorted(results) == ["ask-1", "call-2"]
        positions = [e["position"] for e in pg_router.store.reads.transcript_entries(turn.agent_id)]
        assert positions == list(range(len(positions)))
        assert pg_router.store.reads.open_tool_calls(turn.agent_id) == []
    # The append's statement gave way to the general way exactly when the answer went first;
    # the answer's never did.
    assert len(general["append"]) == (10 if first == "answer" else 0)
    assert general["answer"] == []
