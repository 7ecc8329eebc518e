"""An answer to the question its receiver waits on, in one statement on PostgreSQL.

The general way (:func:`agent_router.store.routing.route`) delivers such an answer through the
unit of work in ten statements. Here one data-modifying statement does it all, and a send of
its own runs it as its own transaction (:func:`route_alone`, autocommit: one round trip, no
``BEGIN``, no ``COMMIT``); inside a larger transaction it is one of its statements
(:func:`route`). The statement locks the receiver (as the general way does, before the
question), then the question (``FOR NO KEY UPDATE``, as the general way locks it), and reads
the sender, the waiting turn and the new message's id (``nextval``); only if the question is an
open ask the receiver still waits on, asked of the sender, it writes everything: the message
delivered, the question answered, the tool result at the end of the asker's transcript, the
asker ``running``, its wake row (marked published, with the question's wake token) and the two
ledger events (``question_resolved``, then ``route``), in that order as the general way writes
them.

The outcome is not decided here: :func:`decisions.decide` says, before the statement runs,
whether an answer from the agent asked resolves the wait, and the statement only checks that
the sender is that agent. The tool result is rendered before the statement too, around the
message id the statement takes (:func:`formats.render_around_id`).

It takes only the common case: an answer from an agent of the team, no dedup key, to an asker
that is ``waiting`` (not suspended) on the very question answered, from the agent asked. Any
other send (an unknown or closed question, another asker, a suspended one, a refused sender)
writes nothing here and goes the general way, which decides and refuses.
"""

from __future__ import annotations

from functools import partial
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine
from sqlalchemy.sql.selectable import LateralFromClause

from agent_router import domain, formats
from agent_router.domain import (
    AgentState,
    Delivery,
    LedgerAction,
    MessageStatus,
    OutboxEntry,
    OutboxKind,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
)
from agent_router.settings import Settings
from agent_router.store import decisions, driver
from agent_router.store.models import (
    AgentRow,
    LedgerActionType,
    LedgerRow,
    MessageRow,
    MessageStatusType,
    OutboxKindType,
    OutboxRow,
    QuestionRow,
    RouteOutcomeType,
    TranscriptEntryRow,
    TurnRow,
    utcnow,
)
from agent_router.store.one_statement import (
    Routed,
    constant,
    insert_from,
    live_sender_id,
    route_detail,
)
from agent_router.store.tx import Tx, has_buffered_ledger, ledger_row, log_event
from agent_router.store.values import SENT_COLUMNS, SendRequest

_agents = cast("sa.Table", AgentRow.__table__)
_questions = cast("sa.Table", QuestionRow.__table__)
_turns = cast("sa.Table", TurnRow.__table__)
_messages = cast("sa.Table", MessageRow.__table__)
_entries = cast("sa.Table", TranscriptEntryRow.__table__)
_outbox = cast("sa.Table", OutboxRow.__table__)
_ledger = cast("sa.Table", LedgerRow.__table__)

_ONE = sa.literal_column("1", sa.Integer)

#: What the statement learns and the rendered message and its metadata must carry.
_LEARNT = ("message_id", "seq")
#: The message's columns the statement takes from the send as parameters.
_SENT_PARAMS = ("content", "type", "subtype", "wake")


def eligible_alone(settings: Settings, req: SendRequest) -> bool:
    """Whether ``req`` may take the statement (as a transaction of its own, or inside one):
    on PostgreSQL, an answer naming its question, with no dedup key. The caller checks that
    the sender is an agent's name (not an external sender)."""
    return (
        not settings.is_sqlite
        and req.type is domain.MessageType.ANSWER
        and req.question_id is not None
        and req.dedup_key is None
    )


def eligible(tx: Tx, req: SendRequest) -> bool:
    """:func:`eligible_alone`, and no ledger event of the transaction ``tx`` still buffered
    (its events keep their order)."""
    return eligible_alone(tx.settings, req) and not has_buffered_ledger(tx.session)


def route_alone(engine: Engine, req: SendRequest) -> Routed | None:
    """Deliver the answer ``req`` in one statement that is its own transaction; ``None`` when
    it wrote nothing and the general way must route it. A connection lost during the statement
    leaves it unknown whether it committed
    (:class:`~agent_router.errors.CommitUnknownError`): sent again, the answer finds its
    question closed if it did."""
    return _route(req, partial(driver.one_row, engine))


def route(tx: Tx, req: SendRequest) -> Delivery | None:
    """Deliver the answer ``req`` in one statement of the transaction ``tx``; ``None`` when it
    wrote nothing and the general way must route it."""
    routed = _route(req, partial(driver.in_transaction, tx.session))
    if routed is None:
        return None
    delivery, entries = routed
    tx.entries.extend(entries)
    return delivery


def _route(req: SendRequest, run: driver.Run) -> Routed | None:
    if not _resolves_when_asked(req):
        return None
    now = utcnow()
    message = domain.Message(
        **{name: getattr(req, name) for name in SENT_COLUMNS},
        id=0,  # learnt by the statement, as is the sequence number
        seq=0,
        source_name=req.sender,
        source_agent_id=None,
        target_agent_id=0,
        target_name=req.to,
        outcome=RouteOutcome.RESOLVED,
        status=MessageStatus.DELIVERED,
        created_at=now,
    )
    before, after = formats.render_around_id(formats.envelope_of(message))
    meta = {k: v for k, v in formats.metadata(message).items() if k not in _LEARNT}
    # The events as logged; the statement writes them with the receiver, the message and the
    # seq it learns (filled in here below).
    resolved, routed = _events(req)
    params = {
        **{f"m_{name}": getattr(message, name) for name in _SENT_PARAMS},
        "b_team": req.team_id,
        "b_to": req.to,
        "b_sender": req.sender,
        "b_question": req.question_id,
        "b_now": now,
        "e_before": before,
        "e_after": after,
        "e_meta": meta,
        "l0_detail": resolved["detail"],
        "l1_detail": {k: v for k, v in routed["detail"].items() if k != "seq"},
    }
    found = run(_STATEMENT, params)
    if found is None:
        return None
    routed["detail"]["seq"] = found["seq"]
    learnt = {name: found[name] for name in ("agent_id", "message_id", "epoch")}
    for event in (resolved, routed):
        log_event(event | learnt)
    entry = OutboxEntry(
        id=found["outbox_id"],
        kind=OutboxKind.WAKE_WAITER,
        agent_id=found["agent_id"],
        epoch=found["epoch"],
        payload=found["payload"],
    )
    delivery = Delivery(
        message_id=found["message_id"],
        outcome=RouteOutcome.RESOLVED,
        target=req.to,
        seq=found["seq"],
        epoch=found["epoch"],
    )
    return delivery, [entry]


def _resolves_when_asked(req: SendRequest) -> bool:
    """Whether the routing table resolves the wait of an asker blocked on the question ``req``
    answers, when ``req`` comes from the agent asked (which the statement checks)."""
    asked = 1  # any id: the statement checks that the sender is the agent asked
    question = domain.Question(
        id=cast(int, req.question_id),
        team_id=req.team_id,
        asker_agent_id=0,
        target_agent_id=asked,
        tool_call_id="",
        status=QuestionStatus.OPEN,
        waiting=True,
        deadline=utcnow(),
        kind=QuestionKind.ASK,
    )
    incoming = decisions.Incoming(
        type=req.type,
        sender_id=asked,
        wake=req.wake,
        answers=question.id,
        subtype=req.subtype,
    )
    return decisions.decide(AgentState.WAITING, question, incoming) is RouteOutcome.RESOLVED


def _events(req: SendRequest) -> list[dict[str, Any]]:
    """The two ledger events, in the order the general way writes them; the receiver, the
    message, the epoch and the route's ``seq`` are the statement's (the ``seq`` here is 0)."""
    about: dict[str, Any] = {"team_id": req.team_id}
    detail = route_detail(req, 0, AgentState.WAITING, AgentState.RUNNING)
    return [
        ledger_row(
            LedgerAction.QUESTION_RESOLVED, **about, question_id=req.question_id, suspended=False
        ),
        ledger_row(LedgerAction.ROUTE, **about, outcome=RouteOutcome.RESOLVED, **detail),
    ]


def _typed(name: str, type_: Any) -> sa.ColumnElement[Any]:
    """A parameter of its column's type, which PostgreSQL cannot infer in a SELECT list: the
    driver's dialect casts most types itself (``%(name)s::TYPE``), enums and booleans are cast
    here."""
    bind = sa.bindparam(name, type_=type_)
    return sa.cast(bind, type_) if isinstance(type_, sa.Enum | sa.Boolean) else bind


def _go() -> sa.CTE:
    """The receiver (waiting, not suspended), locked, then the question it asked of the
    sender, locked; with the waiting turn and the new message's id. No row: nothing is
    written."""
    # Short aliases keep the statement's text within the driver's statement cache.
    agent = _agents.alias("a").c
    target = (
        sa.select(
            agent.id.label("agent_id"),
            agent.epoch,
            agent.next_seq,
            agent.next_position,
            live_sender_id().label("source_id"),
        )
        .where(
            agent.team_id == sa.bindparam("b_team"),
            agent.display_name == sa.bindparam("b_to"),
            agent.state == constant(AgentState.WAITING),
            agent.suspended.is_(False),
        )
        .with_for_update(key_share=True)
        # Materialized: the receiver's row is locked as the CTE is read, before the lateral
        # read of the question (the lock order of the general way: agent, then question).
        .cte("t")
        .prefix_with("MATERIALIZED")
    )
    question = _asked(target)
    turns = _turns.alias("tu").c
    turn = (
        sa.select(turns.id)
        .where(turns.agent_id == target.c.agent_id, turns.epoch == question.c.asker_epoch)
        .scalar_subquery()
    )
    return (
        sa.select(
            target,
            question.c.id.label("question_id"),
            question.c.tool_call_id,
            question.c.deadline,
            turn.label("turn_id"),
            # The parameters that more than one row takes, named once.
            _typed("b_team", sa.BigInteger).label("team_id"),
            _typed("b_now", sa.DateTime).label("now"),
            sa.func.nextval(
                sa.func.pg_get_serial_sequence(constant(_messages.name), constant("id"))
            ).label("message_id"),
        )
        .select_from(target.join(question, sa.true()))
        # Materialized: read once, so the message id is taken once.
        .cte("go")
        .prefix_with("MATERIALIZED")
    )


def _asked(target: sa.CTE) -> LateralFromClause:
    """The question the receiver asked (``b_question``), locked: an open ask it still waits
    on, asked of the sender, who is not the receiver itself."""
    q = _questions.alias("q").c
    return (
        sa.select(q.id, q.tool_call_id, q.asker_epoch, q.deadline)
        .where(
            q.id == sa.bindparam("b_question"),
            q.asker_agent_id == target.c.agent_id,
            q.team_id == sa.bindparam("b_team"),
            q.kind == constant(QuestionKind.ASK),
            q.status == constant(QuestionStatus.OPEN),
            q.waiting.is_(True),
            q.target_agent_id == target.c.source_id,
            target.c.source_id != target.c.agent_id,
        )
        .with_for_update(key_share=True)
        .lateral("qu")
    )


def _insert(table: sa.Table, go: sa.FromClause, **columns: Any) -> sa.Insert:
    """``INSERT INTO table (columns) SELECT their values FROM go``
    (:func:`~agent_router.store.one_statement.insert_from`). A column of a CTE is written as
    its bare name (``go.epoch``): SQLAlchemy would label it (``go.epoch AS epoch``), which an
    INSERT's SELECT does not need, and the statement's text must stay within the driver's
    statement cache."""
    bare = {
        name: sa.literal_column(f"{v.table.name}.{v.name}")
        if isinstance(v, sa.ColumnClause) and isinstance(v.table, sa.CTE)
        else v
        for name, v in columns.items()
    }
    return insert_from(table, go, **bare)


def _writes(go: sa.CTE) -> list[sa.CTE]:
    """The receiver moved, the message, the question answered and the tool result."""
    agent, question = _agents.c, _questions.c
    now = go.c.now
    moved = (
        sa.update(_agents)
        .where(agent.id == go.c.agent_id)
        .values(
            next_seq=agent.next_seq + _ONE,
            next_position=agent.next_position + _ONE,
            state=constant(AgentState.RUNNING),
        )
        .cte("mv")
    )
    message = _insert(
        _messages,
        go,
        **{name: _typed(f"m_{name}", _messages.c[name].type) for name in _SENT_PARAMS},
        team_id=go.c.team_id,
        question_id=go.c.question_id,
        id=go.c.message_id,
        seq=go.c.next_seq,
        source_name=_typed("b_sender", sa.Text),
        source_agent_id=go.c.source_id,
        target_agent_id=go.c.agent_id,
        outcome=constant(RouteOutcome.RESOLVED, RouteOutcomeType),
        status=constant(MessageStatus.DELIVERED, MessageStatusType),
        consumed_turn_id=go.c.turn_id,
        consumed_at=now,
        created_at=now,
    ).cte("msg")
    answered = (
        sa.update(_questions)
        .where(question.id == go.c.question_id)
        .values(
            status=constant(QuestionStatus.ANSWERED),
            waiting=sa.false(),
            answer_message_id=go.c.message_id,
            closed_at=now,
        )
        .cte("ans")
    )
    return [moved, message, answered, _tool_result(go)]


def _tool_result(go: sa.CTE) -> sa.CTE:
    """The tool result at the end of the asker's transcript, at the position its locked row
    holds (the row as it is once the lock is had, so an append that committed while the
    statement waited for the lock is counted); the row's counter is bumped with the move."""
    content = (
        _typed("e_before", sa.Text) + sa.cast(go.c.message_id, sa.Text) + _typed("e_after", sa.Text)
    )
    payload = {"role": constant("tool"), "tool_call_id": go.c.tool_call_id, "content": content}
    meta = {"message_id": go.c.message_id, "seq": go.c.next_seq}
    return _insert(
        _entries,
        go,
        agent_id=go.c.agent_id,
        position=go.c.next_position,
        role=constant("tool"),
        payload=_object(payload),
        meta=_typed("e_meta", JSONB).op("||")(_object(meta)),
        message_id=go.c.message_id,
        tool_call_id=go.c.tool_call_id,
        turn_id=go.c.turn_id,
        created_at=go.c.now,
    ).cte("entry")


def _object(fields: dict[str, Any]) -> sa.ColumnElement[Any]:
    """``jsonb_build_object`` of ``fields``."""
    pairs = [part for key, value in fields.items() for part in (constant(key), value)]
    return sa.type_coerce(sa.func.jsonb_build_object(*pairs), JSONB)


def _ledger_events(go: sa.CTE) -> tuple[sa.CTE, sa.CTE]:
    # The two events in two INSERTs, the second reading the first's RETURNING: the first row
    # gets its id first, so their ids keep the order the general way writes them in.
    about = {
        "team_id": go.c.team_id,
        "agent_id": go.c.agent_id,
        "message_id": go.c.message_id,
        "epoch": go.c.epoch,
        "created_at": go.c.now,
    }
    resolved = (
        _insert(
            _ledger,
            go,
            **about,
            action=constant(LedgerAction.QUESTION_RESOLVED, LedgerActionType),
            detail=_typed("l0_detail", JSONB),
        )
        .returning(_ledger.c.id)
        .cte("res")
    )
    seq = _object({"seq": go.c.next_seq})
    routed = _insert(
        _ledger,
        go.join(resolved, sa.true()),
        **about,
        action=constant(LedgerAction.ROUTE, LedgerActionType),
        outcome=constant(RouteOutcome.RESOLVED, RouteOutcomeType),
        detail=_typed("l1_detail", JSONB).op("||")(seq),
    ).cte("rt")
    return resolved, routed


def _statement() -> sa.Select[Any]:
    go = _go()
    resolved, routed = _ledger_events(go)
    # The wake row, with the question's wake token (constants.wake_token: its deadline, to the
    # microsecond), written marked published (tx.written_published).
    token = sa.func.to_char(go.c.deadline, constant('YYYY-MM-DD"T"HH24:MI:SS.US'))
    now = go.c.now
    wake = (
        _insert(
            _outbox,
            go,
            team_id=go.c.team_id,
            agent_id=go.c.agent_id,
            kind=constant(OutboxKind.WAKE_WAITER, OutboxKindType),
            epoch=go.c.epoch,
            payload=_object({"question_id": go.c.question_id, "token": token}),
            created_at=now,
            published_at=now,
            attempts=sa.literal_column("1"),
        )
        .returning(_outbox.c.id, _outbox.c.payload)
        .cte("wk")
    )
    return (
        sa.select(
            go.c.message_id,
            go.c.next_seq.label("seq"),
            go.c.epoch,
            go.c.agent_id,
            wake.c.id.label("outbox_id"),
            wake.c.payload,
        )
        .select_from(go.join(wake, sa.true()))
        .add_cte(*_writes(go), resolved, routed)
    )


#: Built once: it runs on the hot path of every answer.
_STATEMENT = _statement()
