"""The races of PostgreSQL's transitions, each a function that takes its lock (the agent's row;
the team's for a new waits-for edge) before it reads: real threads queue on that lock while a
second connection holds it, the first of them chosen by the test, and the lock is then
released. The function that waited reads what the one before it committed: each statement of a
PL/pgSQL function reads a snapshot taken after the locks before it were had. A message routed
while an end waits gets one turn; an answer and an append both land, at positions of their own;
one turn is claimed once; an answer and the question's expiry close it once; of two asks that
close a cycle, one opens."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import (
    AgentRouterError,
    AgentState,
    MessageType,
    QuestionClosedError,
    RouteOutcome,
    Router,
    Settings,
    Turn,
)
from agent_router.domain import BudgetName, LedgerAction, QuestionStatus, TurnTrigger
from agent_router.errors import AskRefusedError
from agent_router.outbox import RecordingPublisher

from .helpers import assistant, start_running, tool_call, until_lock_waiters


@pytest.fixture
def pg_router(pg_schema_url: str) -> Iterator[Router]:
    router = Router(Settings(database_url=pg_schema_url), publisher=RecordingPublisher())
    yield router
    router.close()


@contextmanager
def _row_locked(router: Router, table: str, row_id: int) -> Iterator[sa.Connection]:
    """A second connection holding the row ``row_id`` of ``table`` locked until the block
    ends; the connection, to watch who waits for the lock."""
    holder = sa.create_engine(router.settings.database_url)
    try:
        with holder.connect() as conn:
            conn.execute(
                sa.text(f"SELECT 1 FROM {table} WHERE id = :id FOR UPDATE"), {"id": row_id}
            )
            yield conn
            conn.rollback()
    finally:
        holder.dispose()


def _queued(router: Router, table: str, row_id: int, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` in threads while the row is locked, each waiting for the lock in the
    order given, then release it; what each returned or raised. The first takes the lock
    first and the second waits for it; a third may overtake the second (once the first
    updated the row, the others wait for its new version, and whichever of them gets there
    first goes next)."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except AgentRouterError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    with _row_locked(router, table, row_id) as conn:
        for n, thread in enumerate(threads, start=1):
            thread.start()
            until_lock_waiters(conn, n)
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    return results


def _team(router: Router, *roles: str) -> int:
    team = router.create_team().id
    for role in roles:
        router.create_agent(team, role=role)
    return team


@pytest.mark.parametrize("first", ["send", "end"])
def test_a_message_routed_while_the_end_waits_for_the_lock_gets_one_turn(
    pg_router: Router, first: str
) -> None:
    """The end of a turn and a send queue for the agent's lock, in both orders, 20 times each.
    A send first leaves its message pending, and the end that follows finds it: one follow-up.
    An end first completes the agent, and the send then starts its turn. Either way exactly one
    turn is enqueued, and it drains the message."""
    for i in range(20):
        team = _team(pg_router, "Engineer")
        turn = start_running(pg_router, team, "Engineer_1")
        turn.append_assistant(assistant(f"final answer {i}"))
        outbox_before = len(pg_router.outbox(team))

        def send(team: int = team, i: int = i) -> Any:
            return pg_router.send(team, to="Engineer_1", content=f"steer {i}", sender="user")

        calls: dict[str, Callable[[], Any]] = {"send": send, "end": turn.end}
        order = [first, "end" if first == "send" else "send"]
        results = dict(
            zip(
                order,
                _queued(pg_router, "ar_agents", turn.agent_id, [calls[o] for o in order]),
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
        assert nxt is not None
        assert nxt.trigger is (TurnTrigger.FOLLOW_UP if first == "send" else TurnTrigger.NEW)
        assert [m.id for m in nxt.drain()] == [delivery.message_id]


@pytest.mark.parametrize("first", ["answer", "append"])
def test_an_answer_appending_while_an_append_waits_for_the_lock_takes_its_own_place(
    pg_router: Router, first: str
) -> None:
    """A reply with two tool calls, one an ask the agent waits on: the answer (which appends
    the ask's tool result) and the other call's result queue for the agent's lock, in both
    orders, 10 times each. The second reads the agent's transcript counter as the first left
    it: both results are in the transcript, each once, at positions of their own."""
    for i in range(10):
        team = _team(pg_router, "Engineer")
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
        results = dict(
            zip(
                order,
                _queued(pg_router, "ar_agents", turn.agent_id, [calls[o] for o in order]),
                strict=True,
            )
        )
        assert results["answer"].outcome is RouteOutcome.RESOLVED
        assert results["append"] is None
        entries = pg_router.store.reads.transcript_entries(turn.agent_id)
        results_by_call = [
            e["payload"]["tool_call_id"] for e in entries if e["payload"]["role"] == "tool"
        ]
        expected = ["ask-1", "call-2"] if first == "answer" else ["call-2", "ask-1"]
        assert results_by_call == expected
        assert [e["position"] for e in entries] == list(range(len(entries)))
        assert pg_router.store.reads.open_tool_calls(turn.agent_id) == []
        assert pg_router.agent(team, "Engineer_1").state is AgentState.RUNNING


def test_racing_claims_of_one_turn_claim_it_once(pg_router: Router) -> None:
    """Four deliveries of one turn task queue for the agent's lock, 20 times: the first
    claims, the others get nothing (each a ``claim_refused`` event), and the turn and the
    team's turns budget are counted once."""
    for _ in range(20):
        team = _team(pg_router, "Engineer")
        delivery = pg_router.send(team, to="Engineer_1", content="go")
        agent = pg_router.agent(team, "Engineer_1").id
        claimed = _queued(
            pg_router, "ar_agents", agent, [partial(pg_router.claim, agent, delivery.epoch)] * 4
        )
        assert isinstance(claimed[0], Turn)
        assert claimed[1:] == [None, None, None]
        assert len(pg_router.store.reads.turns(agent)) == 1
        assert pg_router.store.budget(team).used[BudgetName.TURNS] == 1
        refused = [e for e in pg_router.ledger(team) if e.action is LedgerAction.CLAIM_REFUSED]
        assert len(refused) == 3


def _overdue(router: Router, question: int) -> None:
    """The question's deadline has passed."""
    with router.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE ar_questions SET deadline = now() - interval '1 hour' WHERE id = :q"),
            {"q": question},
        )


def _asked(router: Router) -> tuple[int, int]:
    """A team whose ``Engineer_1`` is blocked in an ask to the lead, past its deadline, and
    whose ``Reviewer_1`` is running; the team and the question."""
    team = _team(router, "Engineer", "Reviewer")
    start_running(router, team, "Reviewer_1")
    turn = start_running(router, team, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    question = turn.ask("Team Leader", "which auth module?", tool_call_id="ask-1").id
    _overdue(router, question)
    return team, question


def _racers(router: Router, team: int, question: int) -> dict[str, Callable[[], Any]]:
    """The answer, the sweeper's expiry of the question, and two messages of other senders."""
    return {
        "answer": lambda: router.send(
            team,
            to="Engineer_1",
            content="use the OAuth module",
            sender="Team Leader",
            type=MessageType.ANSWER,
            question_id=question,
        ),
        "expire": router.expire_questions,
        "user": lambda: router.send(team, to="Engineer_1", content="a", sender="user"),
        "reviewer": lambda: router.send(team, to="Engineer_1", content="b", sender="Reviewer_1"),
    }


def _closed_once(router: Router, team: int, question: int, results: dict[str, Any]) -> str:
    """The question closed once, answered or expired, never both; the asker got exactly one
    tool result for its call; every message sent is kept, in order. How it closed."""
    q = router.question(question)
    assert not q.waiting
    events = {e.action for e in router.ledger(team) if e.detail.get("question_id") == question}
    if q.status is QuestionStatus.ANSWERED:
        assert results["answer"].outcome is RouteOutcome.RESOLVED
        assert LedgerAction.QUESTION_EXPIRED not in events
        assert results["expire"] == 0
    else:
        assert q.status is QuestionStatus.EXPIRED
        assert isinstance(results["answer"], QuestionClosedError)
        assert LedgerAction.QUESTION_EXPIRED in events
        assert results["expire"] == 1
    tool_results = [
        e for e in router.transcript(team, "Engineer_1") if e.get("tool_call_id") == "ask-1"
    ]
    assert len(tool_results) == 1
    for name in ("user", "reviewer"):
        assert results[name].outcome is RouteOutcome.INJECTED_INLINE
    seqs = sorted(m.seq for m in router.messages(team) if m.target_name == "Engineer_1")
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    return q.status.value


@pytest.fixture
def own_pg_router(own_pg_schema_url: str) -> Iterator[Router]:
    """A router on a database of its own: an expiry pass expires every overdue question of
    its database, and here only this test's."""
    router = Router(Settings(database_url=own_pg_schema_url), publisher=RecordingPublisher())
    yield router
    router.close()


def test_an_answer_and_the_questions_expiry_queued_in_each_order(own_pg_router: Router) -> None:
    """The answer and the expiry of its overdue question queue for the asker's lock, either
    first, and two other senders' messages behind them in every order (12 orders):
    whichever of the answer and the expiry comes first closes the question, and the other
    finds it closed."""
    router = own_pg_router
    for first in ("answer", "expire"):
        second = "expire" if first == "answer" else "answer"
        for rest in itertools.permutations([second, "user", "reviewer"]):
            order = [first, *rest]
            team, question = _asked(router)
            racers = _racers(router, team, question)
            asker = router.agent(team, "Engineer_1").id
            queued = _queued(router, "ar_agents", asker, [racers[o] for o in order])
            results = dict(zip(order, queued, strict=True))
            closed = _closed_once(router, team, question, results)
            assert closed == ("answered" if first == "answer" else "expired"), order


def test_an_answer_racing_the_deadline_and_other_senders(own_pg_router: Router) -> None:
    """The same four, free-running (released together, no lock held), 15 times: no deadlock
    and no error but the answer refused after the expiry, the question closed once."""
    router = own_pg_router
    for _ in range(15):
        team, question = _asked(router)
        racers = _racers(router, team, question)
        barrier = threading.Barrier(len(racers))
        results: dict[str, Any] = {}

        def run(
            name: str,
            call: Callable[[], Any],
            barrier: threading.Barrier = barrier,
            results: dict[str, Any] = results,
        ) -> None:
            barrier.wait()
            try:
                results[name] = call()
            except AgentRouterError as exc:
                results[name] = exc

        threads = [threading.Thread(target=run, args=item) for item in racers.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        _closed_once(router, team, question, results)


@pytest.mark.parametrize("first", ["Engineer_1", "Designer_1"])
def test_two_asks_that_close_a_cycle_together_open_one(pg_router: Router, first: str) -> None:
    """Engineer_1 asks Designer_1 while Designer_1 asks Engineer_1: both queue for the team's
    lock, which serializes new waits-for edges, in both orders. The first opens its question;
    the second would close a cycle and is refused, naming it."""
    team = _team(pg_router, "Engineer", "Designer")
    turns = {}
    for name, call in (("Engineer_1", "ask-e"), ("Designer_1", "ask-d")):
        turns[name] = start_running(pg_router, team, name)
        turns[name].append_assistant(assistant(None, tool_call(call, "ask_other_agent")))

    def ask(name: str) -> Callable[[], Any]:
        other = "Designer_1" if name == "Engineer_1" else "Engineer_1"
        call = "ask-e" if name == "Engineer_1" else "ask-d"
        return lambda: turns[name].ask(other, "which one?", tool_call_id=call)

    second = "Designer_1" if first == "Engineer_1" else "Engineer_1"
    opened, refused = _queued(pg_router, "ar_teams", team, [ask(first), ask(second)])
    assert opened.status is QuestionStatus.OPEN and opened.asker == first
    assert isinstance(refused, AskRefusedError)
    assert refused.cycle == [second, first, second]
    assert pg_router.agent(team, first).state is AgentState.WAITING
    assert pg_router.agent(team, second).state is AgentState.RUNNING
