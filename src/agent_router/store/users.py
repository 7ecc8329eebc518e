"""The user channel: messages to the user (an answer, progress, a question) and the wait of an
``ask_user`` call. The lock: the team's lead's row, then the writer's (ascending ids: the lead
is its team's first agent), so that a team's messages to the user are numbered in commit
order; the PostgreSQL implementation of the same transitions is ``postgresql/users.sql``."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agent_router.domain import (
    AgentState,
    FeedItem,
    LedgerAction,
    OutboxKind,
    Question,
    QuestionKind,
    QuestionStatus,
    TurnRecord,
    TurnStatus,
    UserMessage,
    UserMessageKind,
)
from agent_router.store import queries, refusals, turns, values
from agent_router.store.decisions import move
from agent_router.store.models import (
    AgentRow,
    LedgerRow,
    MessageRow,
    QuestionRow,
    TeamRow,
    TurnRow,
    UserMessageRow,
    utcnow,
)
from agent_router.store.rules import REMINDER_PREFIX
from agent_router.store.tx import Tx

#: The sender name a message to the user's question shows in the asker's transcript.
USER = "user"


def tell_user(
    tx: Tx,
    turn: TurnRecord,
    kind: UserMessageKind,
    content: str,
    *,
    dedup_key: str | None = None,
) -> tuple[UserMessage, bool]:
    """The turn's agent tells the user ``content`` (an ``answer`` or ``progress``); with
    ``dedup_key``, a retried write returns the first (``True``: it was one)."""
    writer, lead, _row = _locked(tx, turn, "tell_user")
    if dedup_key is not None:
        first = tx.session.scalars(
            sa.select(UserMessageRow).where(
                UserMessageRow.team_id == writer.team_id, UserMessageRow.dedup_key == dedup_key
            )
        ).one_or_none()
        if first is not None:
            return user_message(first, writer.display_name), True
    row = write(tx, writer, lead, kind, content, turn_id=turn.id, dedup_key=dedup_key)
    return user_message(row, writer.display_name), False


def ask_user(
    tx: Tx,
    turn: TurnRecord,
    question: str,
    *,
    tool_call_id: str,
    timeout_seconds: float | None = None,
) -> tuple[Question, UserMessage]:
    """The turn's agent asks the user ``question`` and waits, holding no worker: the question
    opens (a wait of kind ``user``, on the asker itself: nobody in the team answers it), the
    agent is ``waiting`` and suspended at once and its turn ends, and the question reaches
    the user as a message of kind ``question``. The user's answer (or any wake message of the
    user's to it) becomes the call's result and starts a continuation turn."""
    asker, lead, turn_row = _locked(tx, turn, "ask_user")
    if tool_call_id not in queries.open_tool_calls(tx.session, asker.id):
        raise tx.refuse(
            refusals.error("not_open_tool_call", call=tool_call_id),
            LedgerAction.ASK_REFUSED,
            team_id=asker.team_id,
            agent_id=asker.id,
            turn_id=turn.id,
            reason="bad_tool_call_id",
        )
    timeout = timeout_seconds or tx.settings.question_timeout_seconds
    now = utcnow()
    asked = tx.added(
        QuestionRow(
            team_id=asker.team_id,
            asker_agent_id=asker.id,
            target_agent_id=asker.id,
            tool_call_id=tool_call_id,
            asker_epoch=asker.epoch,
            status=QuestionStatus.OPEN,
            kind=QuestionKind.USER,
            waiting=True,
            deadline=now + timedelta(seconds=timeout),
        )
    )
    move(asker, AgentState.WAITING)
    asker.suspended = True
    turn_row.status = TurnStatus.SUSPENDED
    turn_row.ended_at = now
    tx.agent_ledger(
        LedgerAction.ASK,
        asker,
        turn_id=turn.id,
        epoch=asker.epoch,
        question_id=asked.id,
        target=USER,
    )
    tx.agent_ledger(
        LedgerAction.TURN_ENDED,
        asker,
        turn_id=turn.id,
        epoch=turn.epoch,
        state=asker.state.value,
        suspended=True,
    )
    row = write(
        tx, asker, lead, UserMessageKind.QUESTION, question, turn_id=turn.id, question_id=asked.id
    )
    return values.question(asked), user_message(row, asker.display_name)


def remind_user(tx: Tx) -> int:
    """Every question to the user still open at half its time (its deadline less its opening)
    reaches the user once more: a message of kind ``question`` with the same question id and
    text, from the asker, delivered as the first was, under the asker's lock. How many."""
    now = utcnow()
    reminded = 0
    for question in tx.session.scalars(
        sa.select(QuestionRow)
        .where(QuestionRow.kind == QuestionKind.USER, QuestionRow.status == QuestionStatus.OPEN)
        .order_by(QuestionRow.asker_agent_id, QuestionRow.id)
    ).all():
        if question.created_at + (question.deadline - question.created_at) / 2 > now:
            continue
        key = f"{REMINDER_PREFIX}{question.id}"
        sent = tx.session.scalars(
            sa.select(UserMessageRow)
            .where(UserMessageRow.question_id == question.id)
            .order_by(UserMessageRow.id)
        ).all()
        if not sent or any(m.dedup_key == key for m in sent):
            continue
        asker = queries.lock_agent(tx.session, question.asker_agent_id)
        assert asker is not None
        write(
            tx,
            asker,
            asker,
            UserMessageKind.QUESTION,
            sent[0].content,
            turn_id=None,
            question_id=question.id,
            dedup_key=key,
        )
        reminded += 1
    return reminded


def _locked(tx: Tx, turn: TurnRecord, operation: str) -> tuple[AgentRow, AgentRow, TurnRow]:
    """The writer's row (its turn fenced), its lead's and the turn's, locked lead first."""
    probe = tx.session.get(AgentRow, turn.agent_id)
    lead_id = (
        tx.session.scalar(
            sa.select(AgentRow.id).where(
                AgentRow.team_id == probe.team_id, AgentRow.is_lead.is_(True)
            )
        )
        if probe is not None
        else None
    )
    lead = None
    if lead_id is not None and lead_id != turn.agent_id:
        lead = queries.lock_agent(tx.session, lead_id)
    writer, row = turns.fenced(tx, turn, operation)
    return writer, lead or writer, row


def write(
    tx: Tx,
    writer: AgentRow,
    lead: AgentRow,
    kind: UserMessageKind,
    content: str,
    *,
    turn_id: int | None,
    question_id: int | None = None,
    dedup_key: str | None = None,
) -> UserMessageRow:
    """A message to the user, its ``user_message`` event (an event of the lead's: the team's
    feed reads the lead's events) and its delivery: an outbox row that publishes the team's
    user task after the commit (with no user task, written published: its signal only wakes
    the team's feed)."""
    row = tx.added(
        UserMessageRow(
            team_id=writer.team_id,
            agent_id=writer.id,
            kind=kind,
            content=content,
            question_id=question_id,
            turn_id=turn_id,
            dedup_key=dedup_key,
            created_at=utcnow(),
        )
    )
    task = tx.session.scalar(sa.select(TeamRow.user_task).where(TeamRow.id == writer.team_id))
    message = user_message(row, writer.display_name)
    tx.outbox(writer, OutboxKind.DELIVER_USER, task=task, message=message.as_payload())
    tx.agent_ledger(
        LedgerAction.USER_MESSAGE,
        lead,
        turn_id=turn_id,
        user_message_id=row.id,
        kind=kind.value,
        sender=writer.display_name,
        question_id=question_id,
    )
    return row


def user_message(row: UserMessageRow, sender: str) -> UserMessage:
    return UserMessage(
        id=row.id,
        team_id=row.team_id,
        sender=sender,
        kind=row.kind,
        content=row.content,
        question_id=row.question_id,
        created_at=row.created_at,
    )


#: The lead's events a team's feed shows: each is written under the lead's row lock, so their
#: ids are in commit order and a reader reading on from the last one it saw misses none.
FEED_ACTIONS = (
    LedgerAction.ROUTE,
    LedgerAction.USER_MESSAGE,
    LedgerAction.TURN_CLAIMED,
    LedgerAction.TURN_ENDED,
    LedgerAction.QUESTION_RESOLVED,
)


def feed(session: Session, team_id: int, *, after_id: int, limit: int) -> list[FeedItem]:
    """The team's feed after the cursor ``after_id`` (a ledger id): the messages to its lead
    (``user`` when the user sent them, else ``message``), its messages to the user (by kind)
    and the lead's turns and resolved waits (``event``), in order."""
    lead = (
        sa.select(AgentRow.id)
        .where(AgentRow.team_id == team_id, AgentRow.is_lead.is_(True))
        .scalar_subquery()
    )
    events = session.scalars(
        sa.select(LedgerRow)
        .where(
            LedgerRow.team_id == team_id,
            LedgerRow.agent_id == lead,
            LedgerRow.id > after_id,
            LedgerRow.action.in_(FEED_ACTIONS),
        )
        .order_by(LedgerRow.id)
        .limit(limit)
    ).all()
    routed = [e.message_id for e in events if e.action is LedgerAction.ROUTE and e.message_id]
    told = [
        int(e.detail["user_message_id"])
        for e in events
        if e.action is LedgerAction.USER_MESSAGE and e.detail.get("user_message_id")
    ]
    messages = {
        m.id: m
        for m in (
            session.scalars(sa.select(MessageRow).where(MessageRow.id.in_(routed)))
            if routed
            else ()
        )
    }
    to_user = {
        m.id: m
        for m in (
            session.scalars(sa.select(UserMessageRow).where(UserMessageRow.id.in_(told)))
            if told
            else ()
        )
    }
    return [_item(e, messages, to_user) for e in events]


def _item(
    event: LedgerRow, messages: dict[int, MessageRow], to_user: dict[int, UserMessageRow]
) -> FeedItem:
    detail = event.detail or {}
    kind, sender, content, question_id = "event", None, None, detail.get("question_id")
    message = messages.get(event.message_id or 0)
    said = to_user.get(int(detail.get("user_message_id") or 0))
    if event.action is LedgerAction.ROUTE and message is not None:
        kind = "user" if message.source_name == USER else "message"
        sender, content, question_id = message.source_name, message.content, message.question_id
    elif said is not None:
        kind, sender, content = said.kind.value, str(detail.get("sender")), said.content
        question_id = said.question_id
    return FeedItem(
        cursor=event.id,
        kind=kind,
        action=event.action.value,
        sender=sender,
        content=content,
        question_id=question_id,
        message_id=said.id if said is not None else event.message_id,
        created_at=event.created_at,
    )
