"""On PostgreSQL an answer to the question its receiver waits on is delivered in one statement.
It must write exactly what the general way writes: the same delivery, message row, tool result
in the asker's transcript (with its provenance), question, agent state, ledger events and wake
row; and every answer it does not take (a wrong, unknown or closed question, another sender, a
suspended asker, a refused sender) must come out of the general way unchanged. Each case is
sent twice, to two teams built alike: once as it is, once with the statement switched off."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa

from agent_router import AgentState, MessageType, RefusedError, Router, Settings
from agent_router.constants import wake_token
from agent_router.domain import LedgerAction, OutboxKind, QuestionStatus, RouteOutcome
from agent_router.outbox import RecordingPublisher
from agent_router.store import answer_route
from agent_router.store.models import OutboxRow
from agent_router.waker import InProcessWaker

from .helpers import assistant, start_running, statements_in_autocommit, tool_call

#: How the asker ``Engineer_1`` is left before the answer arrives.
SETUPS = ["waiting", "suspended", "answered", "asked_another", "expired"]


def _team(router: Router, setup: str) -> tuple[int, int]:
    """A lead, ``Engineer_1`` (as ``setup`` says), ``Reviewer_1`` (running) and ``Tester_1``
    (terminated); and the id of Engineer_1's question."""
    team = router.create_team().id
    for role in ("Engineer", "Reviewer", "Tester"):
        router.create_agent(team, role=role)
    router.terminate(team, "Tester_1", reason="gone")
    start_running(router, team, "Reviewer_1")
    asked = "Reviewer_1" if setup == "asked_another" else "Team Leader"
    turn = start_running(router, team, "Engineer_1")
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    question = turn.ask(asked, "which auth module?", tool_call_id="ask-1").id
    if setup == "suspended":
        turn.end()
        assert router.agent(team, "Engineer_1").suspended
    elif setup == "answered":
        router.send(
            team,
            to="Engineer_1",
            content="first answer",
            sender="Team Leader",
            type=MessageType.ANSWER,
            question_id=question,
        )
        turn.append_assistant({"role": "assistant", "content": "thinking"})
    elif setup == "expired":
        _overdue(router, question)
        router.expire_questions()
        assert router.agent(team, "Engineer_1").state is AgentState.RUNNING
    return team, question


def _overdue(router: Router, question: int) -> None:
    """The question's deadline has passed."""
    with router.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE ar_questions SET deadline = now() - interval '1 hour' WHERE id = :q"),
            {"q": question},
        )


def _answer(question: int, **fields: Any) -> dict[str, Any]:
    return {
        "to": "Engineer_1",
        "content": "use the OAuth module",
        "sender": "Team Leader",
        "type": MessageType.ANSWER,
        "question_id": question,
        **fields,
    }


#: The answers sent, each a function of the question's id.
SENDS: list[Callable[[int], dict[str, Any]]] = [
    _answer,
    lambda q: _answer(q, content="a </agent-message> inside\n<agent-message type=x>"),
    lambda q: _answer(q, wake=False),
    lambda q: _answer(q, sender="Reviewer_1"),
    lambda q: _answer(q, sender="user"),
    lambda q: _answer(q, sender="Tester_1"),
    lambda q: _answer(q, sender="Engineer_1"),
    lambda q: _answer(q, sender="Nobody_9"),
    lambda q: _answer(q + 1_000_000),
    lambda q: _answer(q, to="Reviewer_1"),
    lambda q: _answer(q, to="Tester_1"),
    lambda q: _answer(q, to="Nobody_9"),
]


def _no_ids(value: Any, team: int, question: int) -> Any:
    """``value`` without what differs between two teams built alike: their ids."""
    if isinstance(value, dict):
        return {
            k: (v is not None) if k.endswith(("_id", "token")) else _no_ids(v, team, question)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_no_ids(v, team, question) for v in value]
    if isinstance(value, str):
        text = value.replace(f"team {team}", "team T")
        return re.sub(r'(message_id|question_id)="\d+"|question \d+', "(id)", text)
    return value


def _written(router: Router, team: int, question: int, send: dict[str, Any]) -> dict[str, Any]:
    """What one send returned or raised, and everything it wrote."""
    names = {a.id: a.display_name for a in router.agents(team)}
    engineer = router.agent(team, "Engineer_1").id
    before = (
        len(router.ledger(team)),
        len(router.outbox(team)),
        len(router.messages(team)),
        len(router.store.reads.transcript_entries(engineer)),
    )
    try:
        delivery = router.send(team, **send)
        returned: Any = (
            delivery.outcome,
            delivery.target,
            delivery.seq,
            delivery.epoch,
            delivery.duplicate,
        )
    except RefusedError as exc:
        returned = (type(exc), _no_ids(str(exc), team, question))
    agents = {
        a.display_name: (a.state, a.epoch, a.suspended, a.pending_trigger, a.mailbox_depth)
        for a in router.agents(team)
    }
    messages = [
        (
            m.seq,
            m.source_name,
            names.get(m.source_agent_id or 0),
            m.target_name,
            m.type,
            m.content,
            m.question_id == question,
            m.wake,
            m.outcome,
            m.status,
            m.consumed_turn_id is not None,
        )
        for m in router.messages(team)[before[2] :]
    ]
    ledger = [
        (e.action, e.agent_name, e.outcome, e.epoch, _no_ids(e.detail, team, question))
        for e in router.ledger(team)[before[0] :]
    ]
    token = wake_token(router.question(question).deadline)
    outbox = [
        (
            o.kind,
            names[o.agent_id],
            o.epoch,
            _no_ids(o.payload, team, question),
            o.payload.get("token") == token,  # the wake row's: its question's token
        )
        for o in router.outbox(team)[before[1] :]
    ]
    entries = [
        {**_no_ids(e, team, question), "position": e["position"]}
        for e in router.store.reads.transcript_entries(engineer)[before[3] :]
    ]
    q = router.question(question)
    return {
        "returned": returned,
        "agents": agents,
        "messages": messages,
        "ledger": ledger,
        "outbox": outbox,
        "transcript": entries,
        "question": (q.status, q.waiting, q.answer_message_id is not None),
    }


@pytest.mark.parametrize("setup", SETUPS)
def test_the_statement_writes_what_the_general_way_writes(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    taken = 0
    for make in SENDS:
        fast_team, fast_q = _team(pg_router, setup)
        general_team, general_q = _team(pg_router, setup)
        with _counting(monkeypatch) as took:
            fast = _written(pg_router, fast_team, fast_q, make(fast_q))
        taken += took[0]
        with monkeypatch.context() as patch:
            patch.setattr(answer_route, "eligible_alone", lambda settings, req: False)
            general = _written(pg_router, general_team, general_q, make(general_q))
        assert fast == general, make(0)
        if not isinstance(general["returned"][0], type):
            assert len(general["messages"]) == 1
    # The common case is taken where it exists, and only there: the asked agent's answers to
    # an asker still blocked on the question.
    assert taken == {"waiting": 2, "asked_another": 1}.get(setup, 0)


@contextmanager
def _counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many sends the statement delivered (not handed to the general way)."""
    took = [0]
    real = answer_route._route

    def counted(conn: Any, req: Any) -> Any:
        delivered = real(conn, req)
        took[0] += delivered is not None
        return delivered

    with monkeypatch.context() as patch:
        patch.setattr(answer_route, "_route", counted)
        yield took


def test_the_answer_is_the_tool_result_and_wakes_the_asker(pg_router: Router) -> None:
    team, question = _team(pg_router, "waiting")
    delivery = pg_router.send(team, **_answer(question))
    assert delivery.outcome is RouteOutcome.RESOLVED
    last = pg_router.transcript(team, "Engineer_1")[-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "ask-1"
    assert f'message_id="{delivery.message_id}"' in last["content"]
    assert "use the OAuth module" in last["content"]
    assert pg_router.agent(team, "Engineer_1").state is AgentState.RUNNING
    q = pg_router.question(question)
    assert q.status is QuestionStatus.ANSWERED and q.answer_message_id == delivery.message_id
    wakes = [o for o in pg_router.outbox(team) if o.kind is OutboxKind.WAKE_WAITER]
    assert [o.payload for o in wakes] == [
        {"question_id": question, "token": wake_token(q.deadline)}
    ]
    actions = [e.action for e in pg_router.ledger(team)][-2:]
    assert actions == [LedgerAction.QUESTION_RESOLVED, LedgerAction.ROUTE]


def _is_the_answer_statement(statement: str) -> bool:
    """The statement locks the receiver, then the question, and writes the tool result."""
    return statement.lstrip().startswith("WITH t AS MATERIALIZED") and all(
        part in statement
        for part in ("FROM ar_questions AS q", "INSERT INTO ar_transcript_entries")
    )


def test_an_answer_is_one_statement_in_autocommit(pg_router: Router) -> None:
    """The statement is its own transaction: no BEGIN before it, no COMMIT after it; the wake
    row is written marked published, so nothing marks it after the commit."""
    team, question = _team(pg_router, "waiting")
    with statements_in_autocommit(pg_router) as seen:
        pg_router.send(team, **_answer(question))
    ((statement, autocommit),) = seen
    assert _is_the_answer_statement(statement)
    assert autocommit


def test_an_answer_routed_with_others_in_one_transaction_is_the_same_statement(
    pg_router: Router,
) -> None:
    """Inside a transaction of several sends (``send_many``), the answer is one of its
    statements."""
    team, question = _team(pg_router, "waiting")
    with statements_in_autocommit(pg_router) as seen:
        answer = _answer(question)
        pg_router.send_many(team, [answer], sender=answer.pop("sender"))
    answers = [s for s, _ in seen if _is_the_answer_statement(s)]
    assert len(answers) == 1 and not any(autocommit for _, autocommit in seen)
    assert pg_router.question(question).status is QuestionStatus.ANSWERED


class _CountingWaker(InProcessWaker):
    def __init__(self) -> None:
        super().__init__()
        self.signals: list[int] = []

    def notify(self, question_id: int, token: str) -> None:
        self.signals.append(question_id)
        super().notify(question_id, token)


@pytest.mark.parametrize("general", [False, True], ids=["one statement", "general way"])
def test_a_wake_row_is_written_published_and_signalled_once(
    own_pg_schema_url: str, monkeypatch: pytest.MonkeyPatch, general: bool
) -> None:
    """Both ways the wake row commits marked published (one attempt) and its signal is sent
    once after the commit; the sweeper's pass sends nothing more. A wake row left unpublished
    (written before wake rows were written published) is still signalled and marked by it.
    (A database of its own: the pass publishes whatever is unpublished in its database.)"""
    if general:
        monkeypatch.setattr(answer_route, "eligible_alone", lambda settings, req: False)
    waker = _CountingWaker()
    router = Router(
        Settings(database_url=own_pg_schema_url), publisher=RecordingPublisher(), waker=waker
    )
    try:
        team, question = _team(router, "waiting")
        router.send(team, **_answer(question))
        with router.store.engine.connect() as conn:
            wakes = conn.execute(
                sa.select(OutboxRow.id, OutboxRow.published_at, OutboxRow.attempts).where(
                    OutboxRow.team_id == team, OutboxRow.kind == OutboxKind.WAKE_WAITER
                )
            ).all()
        assert [(w.published_at is not None, w.attempts) for w in wakes] == [(True, 1)]
        assert waker.signals == [question]
        assert router.publish_outbox() == 0 and waker.signals == [question]
        with router.store.engine.begin() as conn:
            conn.execute(
                sa.update(OutboxRow)
                .where(OutboxRow.id == wakes[0].id)
                .values(published_at=None, attempts=0)
            )
        assert router.publish_outbox() == 1
        assert waker.signals == [question, question]
        assert wakes[0].id not in {e.id for e in router.store.reads.unpublished()}
    finally:
        router.close()


def test_a_woken_call_rereads_its_question_in_one_round_trip(pg_router: Router) -> None:
    """What a blocked call re-reads after a wake signal is one statement on a connection in
    autocommit: the driver sends no BEGIN before it and no ROLLBACK after it."""
    team, question = _team(pg_router, "waiting")
    with statements_in_autocommit(pg_router) as seen:
        assert pg_router.store.reads.wait_state(question)[0] is True
        pg_router.send(team, **_answer(question))
        assert pg_router.store.reads.wait_state(question)[0] is False
    autocommit = [(statement.split(maxsplit=1)[0], alone) for statement, alone in seen]
    reads = [autocommit[0], autocommit[-1]]
    assert reads == [("SELECT", True), ("SELECT", True)]
    # The answer itself is one statement, on the same pool.
    assert autocommit[1:-1] == [("WITH", True)]


def test_an_answer_racing_the_deadline_and_other_senders(pg_router: Router) -> None:
    """The answer, the sweeper's expiry of the same question and messages from other senders
    race, many times: no deadlock, no error, the question closes once (answered or expired),
    the asker gets exactly one tool result for its call, and every message is kept in order."""
    for _ in range(15):
        team, question = _team(pg_router, "waiting")
        _overdue(pg_router, question)
        barrier = threading.Barrier(4)
        failures: list[BaseException] = []

        def run(
            fn: Callable[[], Any],
            barrier: threading.Barrier = barrier,
            failures: list[BaseException] = failures,
        ) -> None:
            try:
                barrier.wait()
                fn()
            except RefusedError:
                pass  # the answer came after the expiry: the question was closed
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)

        jobs: list[Callable[[], Any]] = [
            partial(pg_router.send, team, **_answer(question)),
            pg_router.expire_questions,
            partial(pg_router.send, team, to="Engineer_1", content="a", sender="user"),
            partial(pg_router.send, team, to="Engineer_1", content="b", sender="Reviewer_1"),
        ]
        threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        q = pg_router.question(question)
        assert q.status in (QuestionStatus.ANSWERED, QuestionStatus.EXPIRED) and not q.waiting
        results = [
            e for e in pg_router.transcript(team, "Engineer_1") if e.get("tool_call_id") == "ask-1"
        ]
        assert len(results) == 1
        seqs = sorted(m.seq for m in pg_router.messages(team) if m.target_name == "Engineer_1")
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
