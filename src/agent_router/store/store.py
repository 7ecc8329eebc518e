"""The only module that talks to the database.

Every public method is one transition: one transaction, guarded by the target agent's row lock
(PostgreSQL ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE``, which takes the database's write
lock up front), and one or more ledger events. Locks are taken in one canonical order: the team
row, then agent rows by ascending id. Side effects (enqueue a turn, wake a waiter) are written as
outbox rows in the same transaction and returned to the caller to publish after commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, SessionTransaction, aliased, sessionmaker

from agent_router import errors, formats
from agent_router.domain import (
    LEAD_DISPLAY_NAME,
    LEAD_ROLE,
    Agent,
    AgentState,
    AgentStatus,
    BackgroundJob,
    Delivery,
    EndOfTurn,
    JobStatus,
    LedgerAction,
    LedgerEvent,
    Message,
    MessageStatus,
    MessageSubtype,
    MessageType,
    OutboxEntry,
    OutboxKind,
    Question,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
    Team,
    TurnRecord,
    TurnStatus,
    TurnTrigger,
)
from agent_router.settings import Settings
from agent_router.store.models import (
    AgentRow,
    BackgroundJobRow,
    Base,
    LedgerRow,
    MessageRow,
    OutboxRow,
    QuestionRow,
    TeamRow,
    TranscriptEntryRow,
    TurnRow,
    utcnow,
)

logger = logging.getLogger(__name__)

#: Senders that are not agents of the team. ``job:<name>`` is a background job.
EXTERNAL_SENDERS = frozenset({"user", "system"})
EXTERNAL_PREFIX = "job:"
#: The synthetic result of a tool call whose turn died or ended first. It says that the call may
#: have taken effect (a sub-agent created, a message sent) so that the model looks before it
#: repeats a call that is not idempotent.
INTERRUPTED_RESULT = (
    "interrupted: the turn running this tool call ended before it returned; it may or may not "
    "have taken effect, so check (list_sub_agents, list_agents, get_sub_agent_status) before "
    "repeating it"
)
#: A burst of background-job completions delays its agent's turn by at most this many batch
#: windows (``Settings.background_batch_seconds``) after the first completion.
JOB_BATCH_MAX_WINDOWS = 10
STOPPED_RESULT = "cancelled: the agent was stopped before this tool call ran"


@dataclass(frozen=True, kw_only=True)
class SendRequest:
    team_id: int
    to: str
    content: str
    sender: str
    type: MessageType
    subtype: MessageSubtype | None = None
    question_id: int | None = None
    wake: bool = True
    dedup_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class Effects:
    """What a committed transition asks the caller to publish."""

    outbox: list[OutboxEntry] = field(default_factory=list)


class _Refused(Exception):  # noqa: N818 - control flow, never escapes the store
    """Internal: abort the transaction, then record a ledger event and raise ``error``."""

    def __init__(self, error: errors.AgentRouterError, action: LedgerAction, **ledger: Any) -> None:
        super().__init__(str(error))
        self.error = error
        self.action = action
        self.ledger = ledger


def make_engine(settings: Settings) -> Engine:
    if settings.is_sqlite:
        engine = sa.create_engine(
            settings.database_url,
            connect_args={
                "check_same_thread": False,
                "timeout": settings.sqlite_busy_timeout_seconds,
            },
        )
        busy_ms = int(settings.sqlite_busy_timeout_seconds * 1000)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control away from pysqlite so that BEGIN IMMEDIATE below is ours.
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            # The write lock up front: two routers can never both read "idle" and both enqueue.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return sa.create_engine(
        settings.database_url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_size,
        pool_pre_ping=True,
    )


class Claim(NamedTuple):
    """A claimed turn and whose it is."""

    record: TurnRecord
    team_id: int
    display_name: str


_LEDGER_BUFFER = "agent_router.ledger"

# The first statement of every send, built once (it runs on the hot path): lock the target and
# take its next sequence number, returning it with the sender's id and state.
_sender = aliased(AgentRow, name="sender")
_of_sender = sa.select(_sender.id).where(
    _sender.team_id == sa.bindparam("b_team"), _sender.display_name == sa.bindparam("b_sender")
)
_LOCK_TARGET = (
    sa.update(AgentRow)
    .where(
        AgentRow.team_id == sa.bindparam("b_team"), AgentRow.display_name == sa.bindparam("b_to")
    )
    .values(next_seq=AgentRow.next_seq + 1)
    .returning(
        AgentRow,
        _of_sender.scalar_subquery(),
        _of_sender.with_only_columns(_sender.state).scalar_subquery(),
    )
    .execution_options(populate_existing=True, synchronize_session=False)
)


def _write_ledger_buffer(session: Session) -> None:
    rows = session.info.pop(_LEDGER_BUFFER, None)
    if rows:
        session.flush()  # the rows they name exist first
        session.connection().execute(sa.insert(LedgerRow), rows)


def _drop_ledger_buffer(session: Session, transaction: SessionTransaction) -> None:
    # A rolled-back transaction's events never happened. Only the outermost transaction counts:
    # every flush runs in a subtransaction of its own.
    if transaction.parent is None:
        session.info.pop(_LEDGER_BUFFER, None)


class Store:
    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or make_engine(settings)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        event.listen(self._sessions, "before_commit", _write_ledger_buffer)
        event.listen(self._sessions, "after_transaction_end", _drop_ledger_buffer)

    # ------------------------------------------------------------------ plumbing

    def create_schema(self) -> None:
        Base.metadata.create_all(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            with session.begin():
                yield session
        except _Refused as refused:
            session.close()
            self._write_ledger(refused.action, **refused.ledger)
            raise refused.error from None
        except errors.AgentRouterError:
            raise
        except DBAPIError as exc:
            raise errors.StoreError(f"database error: {exc.orig!r}") from exc
        finally:
            session.close()

    def _write_ledger(self, action: LedgerAction, **fields: Any) -> None:
        with self._sessions() as session, session.begin():
            self._ledger(session, action, **fields)

    @staticmethod
    def _ledger(
        session: Session,
        action: LedgerAction,
        *,
        team_id: int | None,
        agent_id: int | None = None,
        outcome: RouteOutcome | None = None,
        message_id: int | None = None,
        turn_id: int | None = None,
        epoch: int | None = None,
        **detail: Any,
    ) -> None:
        # Buffered: the transaction's events are written together just before it commits (one
        # statement, no unit of work). Nothing reads the ledger inside a writing transaction.
        session.info.setdefault(_LEDGER_BUFFER, []).append(
            {
                "team_id": team_id,
                "agent_id": agent_id,
                "action": action,
                "outcome": outcome,
                "message_id": message_id,
                "turn_id": turn_id,
                "epoch": epoch,
                "detail": detail,
                "created_at": utcnow(),
            }
        )
        logger.info(
            action.value,
            extra={
                "action": action.value,
                "team_id": team_id,
                "agent_id": agent_id,
                "outcome": outcome.value if outcome else None,
                "message_id": message_id,
                "epoch": epoch,
            },
        )

    @staticmethod
    def _outbox(
        session: Session, effects: Effects, agent: AgentRow, kind: OutboxKind, **payload: Any
    ) -> None:
        if kind is OutboxKind.ENQUEUE_TURN:
            # Names for monitors (Flower shows the task as "UI Operator_1 (team 3) epoch 2"):
            # carried here so that publishing needs no extra read.
            payload = {"agent": agent.display_name, "team_id": agent.team_id, **payload}
        row = OutboxRow(
            team_id=agent.team_id, agent_id=agent.id, kind=kind, epoch=agent.epoch, payload=payload
        )
        session.add(row)
        session.flush()
        effects.outbox.append(
            OutboxEntry(id=row.id, kind=kind, agent_id=agent.id, epoch=agent.epoch, payload=payload)
        )

    # ------------------------------------------------------------------ reads of rows

    @staticmethod
    def _team(session: Session, team_id: int, *, lock: bool = False) -> TeamRow:
        stmt = sa.select(TeamRow).where(TeamRow.id == team_id)
        if lock:
            stmt = stmt.with_for_update(key_share=True)
        team = session.scalars(stmt).one_or_none()
        if team is None:
            raise errors.UnknownTeamError(f"unknown team {team_id}")
        return team

    @staticmethod
    def _agent_by_name(
        session: Session, team_id: int, name: str, *, lock: bool = False
    ) -> AgentRow | None:
        stmt = sa.select(AgentRow).where(AgentRow.team_id == team_id, AgentRow.display_name == name)
        if lock:
            # See _lock_agent: the locked read must replace a stale, unlocked copy.
            stmt = stmt.with_for_update(key_share=True).execution_options(populate_existing=True)
        return session.scalars(stmt).one_or_none()

    @staticmethod
    def _lock_agent(session: Session, agent_id: int) -> AgentRow | None:
        # populate_existing: a row this session read before taking the lock (a probe) would
        # otherwise keep its stale state, and a transition would act on what it was, not is.
        stmt = (
            sa.select(AgentRow)
            .where(AgentRow.id == agent_id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        )
        return session.scalars(stmt).one_or_none()

    @staticmethod
    def _mailbox_depth(session: Session, agent_id: int) -> int:
        return (
            session.scalar(
                sa.select(sa.func.count())
                .select_from(MessageRow)
                .where(
                    MessageRow.target_agent_id == agent_id,
                    MessageRow.status == MessageStatus.PENDING,
                )
            )
            or 0
        )

    @staticmethod
    def _next_position(session: Session, agent_id: int) -> int:
        last = session.scalar(
            sa.select(sa.func.max(TranscriptEntryRow.position)).where(
                TranscriptEntryRow.agent_id == agent_id
            )
        )
        return 0 if last is None else last + 1

    @staticmethod
    def _waiting_question(session: Session, agent_id: int) -> QuestionRow | None:
        return session.scalars(
            sa.select(QuestionRow)
            .where(QuestionRow.asker_agent_id == agent_id, QuestionRow.waiting.is_(True))
            .with_for_update(key_share=True)
        ).one_or_none()

    @staticmethod
    def _open_tool_calls(session: Session, agent_id: int) -> list[str]:
        """Tool call ids of the last assistant message that have no result yet, in order."""
        last_assistant = session.scalars(
            sa.select(TranscriptEntryRow)
            .where(TranscriptEntryRow.agent_id == agent_id, TranscriptEntryRow.role == "assistant")
            .order_by(TranscriptEntryRow.position.desc())
            .limit(1)
        ).one_or_none()
        if last_assistant is None:
            return []
        calls = [str(c["id"]) for c in last_assistant.payload.get("tool_calls") or []]
        if not calls:
            return []
        answered = set(
            session.scalars(
                sa.select(TranscriptEntryRow.tool_call_id).where(
                    TranscriptEntryRow.agent_id == agent_id,
                    TranscriptEntryRow.position > last_assistant.position,
                    TranscriptEntryRow.role == "tool",
                )
            )
        )
        return [c for c in calls if c not in answered]

    def _append(
        self,
        session: Session,
        agent_id: int,
        payload: dict[str, Any],
        *,
        turn_id: int | None,
        message_id: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        # One statement: the position is the next after the agent's last entry (the writer holds
        # the agent's row lock, so no other append to this transcript runs meanwhile).
        position = (
            sa.select(sa.func.coalesce(sa.func.max(TranscriptEntryRow.position) + 1, 0))
            .where(TranscriptEntryRow.agent_id == agent_id)
            .scalar_subquery()
        )
        session.execute(
            sa.insert(TranscriptEntryRow).values(
                agent_id=agent_id,
                position=position,
                role=payload["role"],
                payload=payload,
                meta=meta,
                message_id=message_id,
                tool_call_id=payload.get("tool_call_id"),
                turn_id=turn_id,
            )
        )

    # ------------------------------------------------------------------ teams and agents

    def create_team(self, *, lead_system_prompt: str | None = None) -> Team:
        with self._tx() as session:
            team = TeamRow()
            session.add(team)
            session.flush()
            lead = self._insert_agent(
                session, team.id, LEAD_DISPLAY_NAME, LEAD_ROLE, lead_system_prompt, is_lead=True
            )
            self._ledger(session, LedgerAction.TEAM_CREATED, team_id=team.id, agent_id=lead.id)
            return Team(id=team.id, lead=_agent(lead), created_at=team.created_at)

    def create_agent(
        self,
        team_id: int,
        *,
        role: str,
        display_name: str | None = None,
        system_prompt: str | None = None,
    ) -> Agent:
        agent, _, _ = self.create_agent_with_task(
            team_id, role=role, display_name=display_name, system_prompt=system_prompt
        )
        return agent

    def create_agent_with_task(
        self,
        team_id: int,
        *,
        role: str,
        display_name: str | None = None,
        system_prompt: str | None = None,
        task: SendRequest | None = None,
    ) -> tuple[Agent, Delivery | None, Effects]:
        """Add a sub-agent and, when ``task`` is given, route that message to it (its ``to`` is
        replaced by the new display name) in the same transaction: both exist, or neither."""
        role = role.strip()
        if (
            not role
            or len(role) > 100
            or any(c in role for c in '"\n\r<>')
            or role.startswith(EXTERNAL_PREFIX)
        ):
            raise errors.InvalidMessageError(f"invalid role name {role!r}")
        if display_name is not None:
            _check_display_name(display_name)
        effects = Effects()
        delivery: Delivery | None = None
        try:
            with self._tx() as session:
                self._team(session, team_id, lock=True)
                agent = self._add_agent(session, team_id, role, display_name, system_prompt)
                if task is not None:
                    task = replace(task, team_id=team_id, to=agent.display_name)
                    delivery = self._route(session, task, effects)
                return _agent(agent), delivery, effects
        except IntegrityError as exc:  # pragma: no cover - the team lock makes this unreachable
            raise errors.DuplicateDisplayNameError(str(exc.orig)) from exc

    def _add_agent(
        self,
        session: Session,
        team_id: int,
        role: str,
        display_name: str | None,
        system_prompt: str | None,
    ) -> AgentRow:
        """Insert the agent (the caller holds the team lock)."""
        if display_name is None:
            # {Role}_{n}, n counted per role from 1; the team lock makes the count safe.
            taken = set(
                session.scalars(
                    sa.select(AgentRow.display_name).where(
                        AgentRow.team_id == team_id, AgentRow.role == role
                    )
                )
            )
            n = 1
            while f"{role}_{n}" in taken:
                n += 1
            display_name = f"{role}_{n}"
        if self._agent_by_name(session, team_id, display_name) is not None:
            raise _Refused(
                errors.DuplicateDisplayNameError(
                    f"display name {display_name!r} is taken in team {team_id}"
                ),
                LedgerAction.SEND_REJECTED,
                team_id=team_id,
                reason="duplicate_display_name",
                display_name=display_name,
            )
        agent = self._insert_agent(session, team_id, display_name, role, system_prompt)
        self._ledger(
            session,
            LedgerAction.AGENT_CREATED,
            team_id=team_id,
            agent_id=agent.id,
            display_name=display_name,
            role=role,
        )
        return agent

    def _insert_agent(
        self,
        session: Session,
        team_id: int,
        display_name: str,
        role: str,
        system_prompt: str | None,
        *,
        is_lead: bool = False,
    ) -> AgentRow:
        """A new idle agent; its system prompt, snapshotted now, opens its transcript."""
        agent = AgentRow(
            team_id=team_id,
            display_name=display_name,
            role=role,
            is_lead=is_lead,
            state=AgentState.IDLE,
            system_prompt=system_prompt,
        )
        session.add(agent)
        session.flush()
        if system_prompt:
            self._append(
                session, agent.id, {"role": "system", "content": system_prompt}, turn_id=None
            )
        return agent

    def team(self, team_id: int) -> Team:
        with self._sessions() as session:
            self._team(session, team_id)
            lead = session.scalars(
                sa.select(AgentRow).where(AgentRow.team_id == team_id, AgentRow.is_lead.is_(True))
            ).one()
            created = session.scalars(sa.select(TeamRow.created_at).where(TeamRow.id == team_id))
            return Team(id=team_id, lead=_agent(lead), created_at=created.one())

    def team_ids(self) -> list[int]:
        with self._sessions() as session:
            return list(session.scalars(sa.select(TeamRow.id).order_by(TeamRow.id)))

    def agent(self, team_id: int, name: str) -> Agent:
        with self._sessions() as session:
            self._team(session, team_id)
            row = self._agent_by_name(session, team_id, name)
            if row is None:
                raise errors.UnknownAgentError(f"no agent {name!r} in team {team_id}")
            return _agent(row, self._mailbox_depth(session, row.id))

    def agent_by_id(self, agent_id: int) -> Agent:
        with self._sessions() as session:
            row = session.get(AgentRow, agent_id)
            if row is None:
                raise errors.UnknownAgentError(f"no agent with id {agent_id}")
            return _agent(row, self._mailbox_depth(session, row.id))

    def agents(self, team_id: int) -> list[Agent]:
        with self._sessions() as session:
            self._team(session, team_id)
            rows = session.scalars(
                sa.select(AgentRow).where(AgentRow.team_id == team_id).order_by(AgentRow.id)
            ).all()
            return [_agent(r, self._mailbox_depth(session, r.id)) for r in rows]

    # ------------------------------------------------------------------ routing

    def route(self, req: SendRequest) -> tuple[Delivery, Effects]:
        """Accept one message and deliver it by the receiver's state (DESIGN section 1)."""
        effects = Effects()
        with self._tx() as session:
            delivery = self._route(session, req, effects)
        return delivery, effects

    def _reject(self, req: SendRequest, error: errors.AgentRouterError, reason: str) -> _Refused:
        return _Refused(
            error,
            LedgerAction.SEND_REJECTED,
            team_id=req.team_id,
            outcome=RouteOutcome.REJECTED,
            reason=reason,
            to=req.to,
            sender=req.sender,
            message=str(error),
        )

    def _resolve_sender(
        self, req: SendRequest, found: tuple[int | None, AgentState | None]
    ) -> int | None:
        """The sending agent's id (``None`` for an external sender), from ``found``: its
        ``(id, state)`` as read with the target, or ``(None, None)`` when no such agent."""
        if _is_external(req.sender):
            return None  # display names may not take these forms, so no lookup is needed
        source_id, state = found
        if source_id is not None:
            if state is AgentState.TERMINATED:
                raise self._reject(
                    req,
                    errors.AgentTerminatedError(f"sender {req.sender!r} is terminated"),
                    "sender_terminated",
                )
            return source_id
        raise self._reject(
            req,
            errors.UnknownAgentError(
                f"unknown sender {req.sender!r}: not an agent of team {req.team_id}, "
                f"nor 'user', 'system' or 'job:<name>'"
            ),
            "unknown_sender",
        )

    def _sender_of(
        self, session: Session, req: SendRequest
    ) -> tuple[int | None, AgentState | None]:
        if _is_external(req.sender):
            return None, None
        row = self._agent_by_name(session, req.team_id, req.sender)
        return (row.id, row.state) if row is not None else (None, None)

    def _route(self, session: Session, req: SendRequest, effects: Effects) -> Delivery:
        # One statement locks the target, takes its next sequence number and reads its state
        # (UPDATE ... RETURNING: the row lock of an UPDATE that changes no key column is the
        # same FOR NO KEY UPDATE lock), and reads the sender's id and state on the way. A refusal
        # rolls the increment back with everything else.
        found = session.execute(
            _LOCK_TARGET, {"b_team": req.team_id, "b_to": req.to, "b_sender": req.sender}
        ).one_or_none()
        if found is None:
            self._team(session, req.team_id)  # an unknown team says so, not "unknown agent"
            self._resolve_sender(req, self._sender_of(session, req))
            raise self._reject(
                req,
                errors.UnknownAgentError(f"no agent {req.to!r} in team {req.team_id}"),
                "unknown_target",
            )
        target, source_id, source_state = found
        source_id = self._resolve_sender(req, (source_id, source_state))
        if source_id == target.id:
            raise self._reject(
                req, errors.InvalidMessageError("an agent cannot message itself"), "self_send"
            )
        if target.state is AgentState.TERMINATED:
            raise self._reject(
                req, errors.AgentTerminatedError(f"agent {req.to!r} is terminated"), "terminated"
            )
        if req.dedup_key is not None:
            first = session.scalars(
                sa.select(MessageRow).where(
                    MessageRow.target_agent_id == target.id, MessageRow.dedup_key == req.dedup_key
                )
            ).one_or_none()
            if first is not None:
                target.next_seq -= 1  # no new message: give the number back
                self._ledger(
                    session,
                    LedgerAction.DUPLICATE_SEND,
                    team_id=req.team_id,
                    agent_id=target.id,
                    outcome=first.outcome,
                    message_id=first.id,
                    dedup_key=req.dedup_key,
                )
                return Delivery(
                    message_id=first.id,
                    outcome=first.outcome,
                    target=target.display_name,
                    seq=first.seq,
                    epoch=target.epoch,
                    duplicate=True,
                )

        state_before = target.state
        answered: QuestionRow | None = None
        if req.type is MessageType.ANSWER:
            answered = self._question_for_answer(session, req, target)

        waiting_on: QuestionRow | None = None
        if target.state is AgentState.WAITING:
            # An answer usually answers the very question waited on: then it is read once.
            waiting_on = (
                answered
                if answered is not None and answered.waiting
                else self._waiting_question(session, target.id)
            )
        resolves = waiting_on is not None and _resolves(waiting_on, req, source_id, answered)
        # Decided from the state before anything changes, so the row is inserted once, final.
        if resolves:
            outcome = RouteOutcome.RESOLVED
        elif target.state in (AgentState.RUNNING, AgentState.WAITING):
            outcome = RouteOutcome.INJECTED_INLINE
        elif target.state is AgentState.SCHEDULED:
            outcome = RouteOutcome.COALESCED
        elif req.wake:  # resting
            outcome = RouteOutcome.TRIGGERED_NEW_TURN
        else:
            outcome = RouteOutcome.QUEUED

        # A resolving message is delivered as it is inserted: into the turn that waits for it.
        waiter_turn_id = (
            self._waiter_turn_id(session, target, waiting_on)
            if resolves and waiting_on is not None
            else None
        )
        msg = MessageRow(
            team_id=req.team_id,
            seq=target.next_seq - 1,
            source_name=req.sender,
            source_agent_id=source_id,
            target_agent_id=target.id,
            type=req.type,
            subtype=req.subtype,
            content=req.content,
            question_id=req.question_id,
            wake=req.wake,
            dedup_key=req.dedup_key,
            outcome=outcome,
            status=MessageStatus.DELIVERED if resolves else MessageStatus.PENDING,
            consumed_turn_id=waiter_turn_id,
            consumed_at=utcnow() if resolves else None,
        )
        session.add(msg)
        session.flush()

        if answered is not None:
            answered.status = QuestionStatus.ANSWERED
            answered.answer_message_id = msg.id
            answered.closed_at = utcnow()

        if resolves:
            assert waiting_on is not None
            if waiting_on.kind is QuestionKind.OUTPUT:
                # The output is consumed by the wait: it is this wait's answer, delivered once.
                waiting_on.status = QuestionStatus.ANSWERED
                waiting_on.answer_message_id = msg.id
                waiting_on.closed_at = utcnow()
            self._resolve_waiter(session, target, waiting_on, msg, effects, turn_id=waiter_turn_id)
        elif outcome is RouteOutcome.TRIGGERED_NEW_TURN:
            self._schedule(session, target, TurnTrigger.NEW, effects)
        self._ledger(
            session,
            LedgerAction.ROUTE,
            team_id=req.team_id,
            agent_id=target.id,
            outcome=outcome,
            message_id=msg.id,
            epoch=target.epoch,
            seq=msg.seq,
            type=req.type.value,
            sender=req.sender,
            wake=req.wake,
            state_before=state_before.value,
            state_after=target.state.value,
        )
        return Delivery(
            message_id=msg.id,
            outcome=outcome,
            target=target.display_name,
            seq=msg.seq,
            epoch=target.epoch,
        )

    def _question_for_answer(
        self, session: Session, req: SendRequest, target: AgentRow
    ) -> QuestionRow:
        if req.question_id is None:
            raise self._reject(
                req, errors.InvalidMessageError("an answer needs a question_id"), "no_question_id"
            )
        question = session.scalars(
            sa.select(QuestionRow)
            .where(QuestionRow.id == req.question_id)
            .with_for_update(key_share=True)
        ).one_or_none()
        if question is None or question.team_id != req.team_id:
            raise self._reject(
                req,
                errors.UnknownQuestionError(f"no question {req.question_id} in team {req.team_id}"),
                "unknown_question",
            )
        if question.asker_agent_id != target.id:
            raise self._reject(
                req,
                errors.WrongQuestionError(
                    f"question {question.id} was not asked by {target.display_name!r}"
                ),
                "wrong_question",
            )
        if question.kind is not QuestionKind.ASK:
            raise self._reject(
                req,
                errors.WrongQuestionError(
                    f"{question.id} is not a question but a wait for output: nothing to answer"
                ),
                "wrong_question",
            )
        if question.status is not QuestionStatus.OPEN:
            raise self._reject(
                req,
                errors.QuestionClosedError(
                    f"question {question.id} is already {question.status.value}"
                ),
                "question_closed",
            )
        return question

    @staticmethod
    def _waiter_turn_id(session: Session, waiter: AgentRow, question: QuestionRow) -> int | None:
        return session.scalar(
            sa.select(TurnRow.id).where(
                TurnRow.agent_id == waiter.id, TurnRow.epoch == question.asker_epoch
            )
        )

    def _resolve_waiter(
        self,
        session: Session,
        target: AgentRow,
        question: QuestionRow,
        msg: MessageRow,
        effects: Effects,
        *,
        turn_id: int | None = None,
    ) -> None:
        """The message becomes the blocked call's tool result, in this transaction. ``turn_id``
        (the waiting turn) is given when ``msg`` was inserted already delivered."""
        question.waiting = False  # before the next statement: one UPDATE of the question
        if msg.status is not MessageStatus.DELIVERED:
            turn_id = self._waiter_turn_id(session, target, question)
            msg.status = MessageStatus.DELIVERED
            msg.consumed_turn_id = turn_id
            msg.consumed_at = utcnow()
        message = _message(msg, target.display_name)
        self._append(
            session,
            target.id,
            {
                "role": "tool",
                "tool_call_id": question.tool_call_id,
                "content": formats.render(formats.envelope_of(message)),
            },
            turn_id=turn_id,
            message_id=msg.id,
            meta=formats.metadata(message),
        )
        self._ledger(
            session,
            LedgerAction.QUESTION_RESOLVED,
            team_id=target.team_id,
            agent_id=target.id,
            message_id=msg.id,
            epoch=target.epoch,
            question_id=question.id,
            suspended=target.suspended,
        )
        self._continue_waiter(session, target, question, effects)

    def _schedule(
        self, session: Session, agent: AgentRow, trigger: TurnTrigger, effects: Effects
    ) -> None:
        """Fence a new epoch and enqueue exactly one turn task for it (through the outbox)."""
        agent.epoch += 1
        agent.state = AgentState.SCHEDULED
        agent.pending_trigger = trigger
        agent.scheduled_at = utcnow()
        self._outbox(session, effects, agent, OutboxKind.ENQUEUE_TURN, trigger=trigger.value)

    def record_rejection(self, team_id: int | None, reason: str, **detail: Any) -> None:
        """Ledger a send refused before it reached the store (malformed input)."""
        self._write_ledger(
            LedgerAction.SEND_REJECTED,
            team_id=team_id,
            outcome=RouteOutcome.REJECTED,
            reason=reason,
            **detail,
        )

    def team_exists(self, team_id: int) -> bool:
        with self._sessions() as session:
            return session.get(TeamRow, team_id) is not None

    # ------------------------------------------------------------------ turns

    def claim_turn(self, agent_id: int, epoch: int | None = None) -> Claim | None:
        """Claim the scheduled turn of ``epoch`` (default: the current one); ``None`` if there is
        nothing to claim: a duplicate or stale delivery, or no turn scheduled. The claim carries
        the agent's team and name, so that starting the turn needs no second read."""
        with self._tx() as session:
            agent = self._lock_agent(session, agent_id)
            if agent is None:
                raise errors.UnknownAgentError(f"no agent with id {agent_id}")
            if agent.state is not AgentState.SCHEDULED or (
                epoch is not None and epoch != agent.epoch
            ):
                self._ledger(
                    session,
                    LedgerAction.CLAIM_REFUSED,
                    team_id=agent.team_id,
                    agent_id=agent.id,
                    epoch=epoch,
                    current_epoch=agent.epoch,
                    state=agent.state.value,
                )
                return None
            trigger = agent.pending_trigger or TurnTrigger.NEW
            agent.state = AgentState.RUNNING
            agent.pending_trigger = None
            now = utcnow()
            turn = TurnRow(
                team_id=agent.team_id,
                agent_id=agent.id,
                epoch=agent.epoch,
                trigger=trigger,
                status=TurnStatus.RUNNING,
                started_at=now,
                lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds),
            )
            session.add(turn)
            session.flush()
            self._ledger(
                session,
                LedgerAction.TURN_CLAIMED,
                team_id=agent.team_id,
                agent_id=agent.id,
                turn_id=turn.id,
                epoch=agent.epoch,
                trigger=trigger.value,
            )
            return Claim(_turn(turn), agent.team_id, agent.display_name)

    def _fenced(
        self, session: Session, turn: TurnRecord, operation: str
    ) -> tuple[AgentRow, TurnRow]:
        """Lock the turn's agent and check the fence; a stale turn writes nothing."""
        agent = self._lock_agent(session, turn.agent_id)
        row = session.get(TurnRow, turn.id)
        if (
            agent is None
            or row is None
            or agent.epoch != turn.epoch
            or row.status is not TurnStatus.RUNNING
            or agent.state not in (AgentState.RUNNING, AgentState.WAITING)
        ):
            raise _Refused(
                errors.StaleTurnError(
                    f"turn {turn.id} (epoch {turn.epoch}) is no longer current: {operation} refused"
                ),
                LedgerAction.STALE_WRITE_REFUSED,
                team_id=agent.team_id if agent else None,
                agent_id=turn.agent_id,
                turn_id=turn.id,
                epoch=turn.epoch,
                operation=operation,
                current_epoch=agent.epoch if agent else None,
            )
        return agent, row

    def drain(self, turn: TurnRecord, *, limit: int | None = None) -> list[Message]:
        """Move pending messages, in sequence order, into the transcript; consumed in this
        transaction. Refused while the last assistant tool calls still lack results."""
        batch = limit or self.settings.drain_batch_size
        with self._tx() as session:
            agent, _row = self._fenced(session, turn, "drain")
            if agent.state is not AgentState.RUNNING:
                raise _Refused(
                    errors.TurnError(f"{agent.display_name} is {agent.state.value}: cannot drain"),
                    LedgerAction.STALE_WRITE_REFUSED,
                    team_id=agent.team_id,
                    agent_id=agent.id,
                    turn_id=turn.id,
                    operation="drain",
                )
            dangling = self._open_tool_calls(session, agent.id)
            if dangling:
                raise _Refused(
                    errors.ToolCallsPendingError(
                        f"tool calls {dangling} have no result yet: a drain would split them "
                        "from their assistant message"
                    ),
                    LedgerAction.STALE_WRITE_REFUSED,
                    team_id=agent.team_id,
                    agent_id=agent.id,
                    turn_id=turn.id,
                    operation="drain",
                    dangling=dangling,
                )
            # Core rows and two set-based statements: a drain of a thousand messages is one
            # SELECT, one multi-row INSERT and one UPDATE, not a unit of work per message.
            rows = session.execute(
                sa.select(MessageRow.__table__)
                .where(
                    MessageRow.target_agent_id == agent.id,
                    MessageRow.status == MessageStatus.PENDING,
                )
                .order_by(MessageRow.seq)
                .limit(batch)
            ).all()
            if not rows:
                return []
            now = utcnow()
            position = self._next_position(session, agent.id)
            delivered = [
                _message(
                    row._mapping,
                    agent.display_name,
                    status=MessageStatus.DELIVERED,
                    consumed_turn_id=turn.id,
                )
                for row in rows
            ]
            session.execute(
                sa.insert(TranscriptEntryRow),
                [
                    {
                        "agent_id": agent.id,
                        "position": position + k,
                        "role": "user",
                        "payload": {
                            "role": "user",
                            "content": formats.render(formats.envelope_of(message)),
                        },
                        "meta": formats.metadata(message),
                        "message_id": message.id,
                        "turn_id": turn.id,
                        "created_at": now,
                    }
                    for k, message in enumerate(delivered)
                ],
            )
            session.execute(
                sa.update(MessageRow)
                .where(MessageRow.id.in_([m.id for m in delivered]))
                .values(status=MessageStatus.DELIVERED, consumed_turn_id=turn.id, consumed_at=now)
                .execution_options(synchronize_session=False)
            )
            self._ledger(
                session,
                LedgerAction.DRAIN,
                team_id=agent.team_id,
                agent_id=agent.id,
                turn_id=turn.id,
                epoch=turn.epoch,
                count=len(delivered),
                first_seq=delivered[0].seq,
                last_seq=delivered[-1].seq,
            )
            return delivered

    def append_assistant(self, turn: TurnRecord, message: dict[str, Any]) -> None:
        payload = _validate_assistant(message)
        with self._tx() as session:
            agent, _row = self._fenced(session, turn, "append_assistant")
            dangling = self._open_tool_calls(session, agent.id)
            if dangling:
                raise _Refused(
                    errors.ToolCallsPendingError(
                        f"tool calls {dangling} need results before the next assistant message"
                    ),
                    LedgerAction.STALE_WRITE_REFUSED,
                    team_id=agent.team_id,
                    agent_id=agent.id,
                    turn_id=turn.id,
                    operation="append_assistant",
                )
            self._append(session, agent.id, payload, turn_id=turn.id)

    def append_tool_result(self, turn: TurnRecord, tool_call_id: str, content: str) -> None:
        if not isinstance(content, str):
            raise errors.InvalidTranscriptEntryError("a tool result's content must be a string")
        with self._tx() as session:
            agent, _row = self._fenced(session, turn, "append_tool_result")
            if tool_call_id not in self._open_tool_calls(session, agent.id):
                raise _Refused(
                    errors.InvalidTranscriptEntryError(
                        f"{tool_call_id!r} is not an open tool call of the last assistant message"
                    ),
                    LedgerAction.STALE_WRITE_REFUSED,
                    team_id=agent.team_id,
                    agent_id=agent.id,
                    turn_id=turn.id,
                    operation="append_tool_result",
                )
            self._append(
                session,
                agent.id,
                {"role": "tool", "tool_call_id": tool_call_id, "content": content},
                turn_id=turn.id,
            )

    def open_tool_calls(self, agent_id: int) -> list[str]:
        with self._sessions() as session:
            return self._open_tool_calls(session, agent_id)

    def _close_dangling(
        self, session: Session, agent: AgentRow, turn_id: int | None, result: str, keep: str | None
    ) -> int:
        closed = 0
        for call_id in self._open_tool_calls(session, agent.id):
            if call_id == keep:
                continue
            self._append(
                session,
                agent.id,
                {"role": "tool", "tool_call_id": call_id, "content": result},
                turn_id=turn_id,
                meta={"synthetic": result.split(":", 1)[0]},
            )
            self._ledger(
                session,
                LedgerAction.SYNTHETIC_TOOL_RESULT,
                team_id=agent.team_id,
                agent_id=agent.id,
                turn_id=turn_id,
                tool_call_id=call_id,
                result=result,
            )
            closed += 1
        return closed

    def end_turn(
        self, turn: TurnRecord, *, failed: bool = False, error: str | None = None
    ) -> tuple[EndOfTurn, Effects]:
        """The end-of-turn hook: one follow-up if wake messages are pending, else completed."""
        effects = Effects()
        with self._tx() as session:
            agent, row = self._fenced(session, turn, "end")
            if agent.stop_requested and not failed:
                self._stop_turn(session, agent, row, reason="stop requested by the lead")
                return EndOfTurn(follow_up=False, state=agent.state, epoch=agent.epoch), effects
            question = self._waiting_question(session, agent.id)
            closed = self._close_dangling(
                session,
                agent,
                turn.id,
                INTERRUPTED_RESULT,
                question.tool_call_id if question else None,
            )
            if question is not None:
                # The turn ends while blocked (it failed): the ask stays open, suspended.
                question_turn_ended = True
                agent.state = AgentState.WAITING
                agent.suspended = True
            else:
                question_turn_ended = False
            row.status = TurnStatus.FAILED if failed else TurnStatus.ENDED
            row.ended_at = utcnow()
            row.error = error
            follow_up = False
            if not question_turn_ended:
                pending_wake = session.scalar(
                    sa.select(sa.func.count())
                    .select_from(MessageRow)
                    .where(
                        MessageRow.target_agent_id == agent.id,
                        MessageRow.status == MessageStatus.PENDING,
                        MessageRow.wake.is_(True),
                    )
                )
                if pending_wake:
                    follow_up = True
                    self._schedule(session, agent, TurnTrigger.FOLLOW_UP, effects)
                else:
                    agent.state = AgentState.COMPLETED
            self._ledger(
                session,
                LedgerAction.TURN_ENDED,
                team_id=agent.team_id,
                agent_id=agent.id,
                turn_id=turn.id,
                epoch=turn.epoch,
                failed=failed,
                error=error,
                state=agent.state.value,
                synthetic_results=closed,
            )
            if follow_up:
                self._ledger(
                    session,
                    LedgerAction.FOLLOW_UP,
                    team_id=agent.team_id,
                    agent_id=agent.id,
                    turn_id=turn.id,
                    epoch=agent.epoch,
                )
            result = EndOfTurn(
                follow_up=follow_up, state=agent.state, epoch=agent.epoch, synthetic_results=closed
            )
        return result, effects

    def renew_lease(self, turn: TurnRecord) -> bool:
        """Extend a running turn's lease; ``False`` if the turn was fenced (stop working)."""
        with self._tx() as session:
            renewed = cast(
                "sa.CursorResult[Any]",
                session.execute(
                    sa.update(TurnRow)
                    .where(
                        TurnRow.id == turn.id,
                        TurnRow.status == TurnStatus.RUNNING,
                        TurnRow.epoch
                        == sa.select(AgentRow.epoch)
                        .where(AgentRow.id == turn.agent_id)
                        .scalar_subquery(),
                    )
                    .values(
                        lease_expires_at=utcnow() + timedelta(seconds=self.settings.lease_seconds)
                    )
                ),
            ).rowcount
            return bool(renewed)

    def expired_leases(self) -> list[int]:
        """Agents whose current turn's lease has run out (its worker is presumed dead)."""
        with self._sessions() as session:
            return list(
                session.scalars(
                    sa.select(AgentRow.id)
                    .join(
                        TurnRow,
                        sa.and_(TurnRow.agent_id == AgentRow.id, TurnRow.epoch == AgentRow.epoch),
                    )
                    .where(
                        TurnRow.status == TurnStatus.RUNNING,
                        TurnRow.lease_expires_at < utcnow(),
                        AgentRow.state.in_([AgentState.RUNNING, AgentState.WAITING]),
                    )
                    .order_by(AgentRow.id)
                )
            )

    def take_over_expired(self, agent_id: int) -> tuple[int | None, Effects]:
        """:meth:`take_over`, but only if the lease is still expired under the lock (a heartbeat
        may have renewed it since it was listed)."""
        with self._sessions() as session:
            agent = session.get(AgentRow, agent_id)
            turn = (
                session.scalars(
                    sa.select(TurnRow).where(
                        TurnRow.agent_id == agent_id,
                        TurnRow.epoch == agent.epoch,
                        TurnRow.status == TurnStatus.RUNNING,
                    )
                ).one_or_none()
                if agent
                else None
            )
            if turn is None or turn.lease_expires_at is None or turn.lease_expires_at >= utcnow():
                return None, Effects()
        try:
            return self.take_over(
                agent_id, reason="lease expired", expected_turn_id=turn.id, lease_check=True
            )
        except errors.TurnError:
            return None, Effects()

    def stuck_scheduled(self, *, older_than_seconds: float) -> list[OutboxEntry]:
        """Re-enqueue agents left ``scheduled`` whose turn task never started (the task was
        lost after being published): scheduled, and its last enqueue published, longer ago
        than ``older_than_seconds``. Fenced claims make a duplicate harmless."""
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        entries: list[OutboxEntry] = []
        with self._tx() as session:
            agents = session.scalars(
                sa.select(AgentRow)
                .where(AgentRow.state == AgentState.SCHEDULED, AgentRow.scheduled_at < cutoff)
                .order_by(AgentRow.id)
                .with_for_update(skip_locked=True)
            ).all()
            for agent in agents:
                # Unpublished: the outbox re-publisher covers it. Published within the cutoff
                # (perhaps by this very sweep): the task has not yet had its time to start.
                recent = session.scalar(
                    sa.select(sa.func.count())
                    .select_from(OutboxRow)
                    .where(
                        OutboxRow.agent_id == agent.id,
                        OutboxRow.epoch == agent.epoch,
                        sa.or_(OutboxRow.published_at.is_(None), OutboxRow.published_at >= cutoff),
                    )
                )
                if recent:
                    continue
                effects = Effects()
                agent.scheduled_at = utcnow()
                self._outbox(
                    session,
                    effects,
                    agent,
                    OutboxKind.ENQUEUE_TURN,
                    trigger=(agent.pending_trigger or TurnTrigger.NEW).value,
                    reenqueued=True,
                )
                self._ledger(
                    session,
                    LedgerAction.REENQUEUED,
                    team_id=agent.team_id,
                    agent_id=agent.id,
                    epoch=agent.epoch,
                )
                entries.extend(effects.outbox)
        return entries

    def take_over(
        self,
        agent_id: int,
        *,
        reason: str,
        expected_turn_id: int | None = None,
        lease_check: bool = False,
    ) -> tuple[int, Effects]:
        """Fence a running agent whose turn is presumed dead: bump the epoch so the old turn can
        write nothing, then schedule a ``recovery`` turn, or, if it was blocked in an ask, leave
        it suspended on that ask. Returns the new epoch."""
        effects = Effects()
        with self._tx() as session:
            agent = self._lock_agent(session, agent_id)
            if agent is None:
                raise errors.UnknownAgentError(f"no agent with id {agent_id}")
            if agent.state not in (AgentState.RUNNING, AgentState.WAITING) or agent.suspended:
                raise errors.TurnError(
                    f"{agent.display_name} is {agent.state.value}: nothing to take over"
                )
            old = session.scalars(
                sa.select(TurnRow).where(TurnRow.agent_id == agent.id, TurnRow.epoch == agent.epoch)
            ).one_or_none()
            if expected_turn_id is not None and (old is None or old.id != expected_turn_id):
                raise errors.TurnError("the turn changed since it was found expired")
            if lease_check and (
                old is None or old.lease_expires_at is None or old.lease_expires_at >= utcnow()
            ):
                raise errors.TurnError("the lease was renewed")
            if old is not None:
                old.status = TurnStatus.FENCED
                old.ended_at = utcnow()
                old.error = reason
            question = self._waiting_question(session, agent.id)
            if question is not None:
                agent.state = AgentState.WAITING
                agent.suspended = True
                agent.epoch += 1
                question.asker_epoch = agent.epoch
            else:
                self._close_dangling(
                    session, agent, old.id if old else None, INTERRUPTED_RESULT, None
                )
                self._schedule(session, agent, TurnTrigger.RECOVERY, effects)
            self._ledger(
                session,
                LedgerAction.TAKE_OVER,
                team_id=agent.team_id,
                agent_id=agent.id,
                turn_id=old.id if old else None,
                epoch=agent.epoch,
                reason=reason,
                suspended=agent.suspended,
            )
            return agent.epoch, effects

    def _lock_sub_agent_and_askers(
        self, session: Session, agent_id: int, done: str
    ) -> tuple[AgentRow, Sequence[QuestionRow]]:
        """For stop and terminate: the team lock, then the agent and every agent with an open
        question to it, by id. Refuses the lead and a terminated agent. Returns the agent and
        the open questions asked of it."""
        probe = session.get(AgentRow, agent_id)
        if probe is None:
            raise errors.UnknownAgentError(f"no agent with id {agent_id}")
        self._team(session, probe.team_id, lock=True)
        asked_of = session.scalars(
            sa.select(QuestionRow).where(
                QuestionRow.target_agent_id == agent_id,
                QuestionRow.status == QuestionStatus.OPEN,
            )
        ).all()
        for locked_id in sorted({agent_id, *(q.asker_agent_id for q in asked_of)}):
            self._lock_agent(session, locked_id)
        agent = session.get(AgentRow, agent_id)
        assert agent is not None
        if agent.is_lead:
            raise errors.InvalidMessageError(f"the Team Leader cannot be {done}")
        if agent.state is AgentState.TERMINATED:
            raise errors.AgentTerminatedError(f"{agent.display_name!r} is already terminated")
        return agent, asked_of

    def terminate(self, agent_id: int, *, reason: str) -> Effects:
        """Final: fence any running turn, drop pending messages with ``reason``, cancel the
        questions it asked, and release agents blocked on a question to it."""
        effects = Effects()
        with self._tx() as session:
            agent, waiters = self._lock_sub_agent_and_askers(session, agent_id, "terminated")
            now = utcnow()
            running = session.scalars(
                sa.select(TurnRow).where(
                    TurnRow.agent_id == agent.id, TurnRow.status == TurnStatus.RUNNING
                )
            ).all()
            for turn in running:
                turn.status = TurnStatus.FENCED
                turn.ended_at = now
                turn.error = f"terminated: {reason}"
            self._close_dangling(
                session, agent, None, f"cancelled: agent terminated ({reason})", None
            )
            dropped = cast(
                "sa.CursorResult[Any]",
                session.execute(
                    sa.update(MessageRow)
                    .where(
                        MessageRow.target_agent_id == agent.id,
                        MessageRow.status == MessageStatus.PENDING,
                    )
                    .values(
                        status=MessageStatus.DROPPED, drop_reason=f"target terminated: {reason}"
                    )
                ),
            ).rowcount
            for own in session.scalars(
                sa.select(QuestionRow).where(
                    QuestionRow.asker_agent_id == agent.id,
                    QuestionRow.status == QuestionStatus.OPEN,
                )
            ):
                own.status = QuestionStatus.CANCELLED
                own.waiting = False
                own.closed_at = now
            for question in waiters:
                asker = session.get(AgentRow, question.asker_agent_id)
                assert asker is not None
                question.status = QuestionStatus.CANCELLED
                question.closed_at = now
                if question.waiting:
                    self._release(
                        session,
                        asker,
                        question,
                        f"cancelled: {agent.display_name} was terminated ({reason})",
                        effects,
                    )
            agent.epoch += 1
            agent.state = AgentState.TERMINATED
            agent.suspended = False
            agent.pending_trigger = None
            self._ledger(
                session,
                LedgerAction.TERMINATED,
                team_id=agent.team_id,
                agent_id=agent.id,
                epoch=agent.epoch,
                reason=reason,
                dropped=dropped,
            )
        return effects

    def _release(
        self,
        session: Session,
        asker: AgentRow,
        question: QuestionRow,
        result: str,
        effects: Effects,
    ) -> None:
        """End a wait without an answer: a synthetic tool result, then wake or continue."""
        turn_id = session.scalar(
            sa.select(TurnRow.id).where(
                TurnRow.agent_id == asker.id, TurnRow.epoch == question.asker_epoch
            )
        )
        self._append(
            session,
            asker.id,
            {"role": "tool", "tool_call_id": question.tool_call_id, "content": result},
            turn_id=turn_id,
            meta={"synthetic": result.split(":", 1)[0], "question_id": question.id},
        )
        question.waiting = False
        self._ledger(
            session,
            LedgerAction.QUESTION_CANCELLED,
            team_id=asker.team_id,
            agent_id=asker.id,
            epoch=asker.epoch,
            question_id=question.id,
            result=result,
        )
        self._continue_waiter(session, asker, question, effects)

    def _continue_waiter(
        self, session: Session, asker: AgentRow, question: QuestionRow, effects: Effects
    ) -> None:
        if asker.suspended:
            asker.suspended = False
            self._schedule(session, asker, TurnTrigger.CONTINUATION, effects)
        else:
            asker.state = AgentState.RUNNING
            self._outbox(session, effects, asker, OutboxKind.WAKE_WAITER, question_id=question.id)

    # ------------------------------------------------------------------ asks

    def _open_wait_edge(
        self,
        session: Session,
        turn: TurnRecord,
        target: str,
        tool_call_id: str,
        *,
        operation: str,
        verb: str,
        kind: QuestionKind | None = None,
    ) -> tuple[AgentRow, AgentRow]:
        """The checks before a new waits-for edge (an ask, or a wait for an output), under the
        team lock that serializes edge creation, then both agents' locks by id. Refused (a
        ledger event, no wait) for an unknown, terminated or same target, a tool call that is not
        open, or an edge that would close a cycle. Returns the locked (waiter, target) rows."""
        probe = session.get(AgentRow, turn.agent_id)
        if probe is None:
            raise errors.UnknownAgentError(f"no agent with id {turn.agent_id}")
        team_id = probe.team_id
        self._team(session, team_id, lock=True)
        target_row = self._agent_by_name(session, team_id, target)

        def refuse(reason: str, message: str, cycle: list[str] | None = None) -> _Refused:
            return _wait_refusal(turn, team_id, target, reason, message, cycle=cycle, kind=kind)

        if target_row is None:
            raise refuse("unknown_target", f"no agent {target!r} in this team")
        for agent_id in sorted({turn.agent_id, target_row.id}):
            self._lock_agent(session, agent_id)
        waiter, _row = self._fenced(session, turn, operation)
        if target_row.id == waiter.id:
            what = "ask itself" if verb == "ask" else "wait for its own output"
            raise refuse("self", f"an agent cannot {what}")
        if target_row.state is AgentState.TERMINATED:
            raise refuse("terminated", f"{target!r} is terminated")
        if tool_call_id not in self._open_tool_calls(session, waiter.id):
            raise _Refused(
                errors.InvalidTranscriptEntryError(
                    f"{tool_call_id!r} is not an open tool call of the last assistant message"
                ),
                LedgerAction.ASK_REFUSED,
                team_id=team_id,
                agent_id=waiter.id,
                turn_id=turn.id,
                reason="bad_tool_call_id",
            )
        cycle = self._cycle_through(session, waiter, target_row)
        if cycle:
            raise refuse("cycle", f"this {verb} would deadlock: " + " -> ".join(cycle), cycle=cycle)
        return waiter, target_row

    def _open_question(
        self,
        session: Session,
        waiter: AgentRow,
        target: AgentRow,
        tool_call_id: str,
        *,
        kind: QuestionKind,
        timeout_seconds: float | None,
    ) -> QuestionRow:
        """The new waits-for edge (checked by :meth:`_open_wait_edge`): an open question with
        its deadline, and the waiter ``waiting``, blocking in its worker."""
        timeout = timeout_seconds or self.settings.question_timeout_seconds
        question = QuestionRow(
            team_id=waiter.team_id,
            asker_agent_id=waiter.id,
            target_agent_id=target.id,
            tool_call_id=tool_call_id,
            asker_epoch=waiter.epoch,
            status=QuestionStatus.OPEN,
            kind=kind,
            waiting=True,
            deadline=utcnow() + timedelta(seconds=timeout),
        )
        session.add(question)
        session.flush()
        waiter.state = AgentState.WAITING
        waiter.suspended = False
        return question

    def ask(
        self,
        turn: TurnRecord,
        *,
        target: str,
        question: str,
        tool_call_id: str,
        subtype: MessageSubtype,
        timeout_seconds: float | None = None,
    ) -> tuple[Question, Delivery, Effects]:
        """Open a question from the turn's agent to ``target`` and put the asker in ``waiting``.

        Refused (no wait, a ledger event) when it asks oneself, targets a terminated or unknown
        agent, or would close a cycle in the team's waits-for graph."""
        effects = Effects()
        with self._tx() as session:
            asker, target_row = self._open_wait_edge(
                session, turn, target, tool_call_id, operation="ask", verb="ask"
            )
            team_id = asker.team_id
            q = self._open_question(
                session,
                asker,
                target_row,
                tool_call_id,
                kind=QuestionKind.ASK,
                timeout_seconds=timeout_seconds,
            )
            self._ledger(
                session,
                LedgerAction.ASK,
                team_id=team_id,
                agent_id=asker.id,
                turn_id=turn.id,
                epoch=asker.epoch,
                question_id=q.id,
                target=target,
            )
            delivery = self._route(
                session,
                SendRequest(
                    team_id=team_id,
                    to=target,
                    content=question,
                    sender=asker.display_name,
                    type=MessageType.ASK,
                    subtype=subtype,
                    question_id=q.id,
                ),
                effects,
            )
            return _question(q), delivery, effects

    @staticmethod
    def _cycle_through(session: Session, asker: AgentRow, target: AgentRow) -> list[str]:
        """The waits-for path target -> ... -> asker, if the new edge asker -> target closes one."""
        names = {
            a.id: a.display_name
            for a in session.scalars(sa.select(AgentRow).where(AgentRow.team_id == asker.team_id))
        }
        edges = dict(
            session.execute(
                sa.select(QuestionRow.asker_agent_id, QuestionRow.target_agent_id).where(
                    QuestionRow.team_id == asker.team_id, QuestionRow.waiting.is_(True)
                )
            ).all()
        )
        path = [asker.id, target.id]
        current = target.id
        while current in edges:
            current = edges[current]
            path.append(current)
            if current == asker.id:
                return [names[i] for i in path]
            if len(path) > len(names) + 1:  # pragma: no cover - a cycle not through asker
                break
        return []

    def expire_questions(self, *, question_id: int | None = None) -> tuple[int, Effects]:
        """Resolve open questions past their deadline with an ``expired`` tool result; the asker
        continues (woken if blocked, a continuation turn if suspended)."""
        effects = Effects()
        expired = 0
        with self._tx() as session:
            stmt = sa.select(QuestionRow.id, QuestionRow.team_id).where(
                QuestionRow.status == QuestionStatus.OPEN, QuestionRow.deadline <= utcnow()
            )
            if question_id is not None:
                stmt = stmt.where(QuestionRow.id == question_id)
            overdue = session.execute(stmt.order_by(QuestionRow.team_id, QuestionRow.id)).all()
            for qid, team_id in overdue:
                question = session.get(QuestionRow, qid)
                assert question is not None
                asker = self._lock_agent(session, question.asker_agent_id)
                assert asker is not None
                session.refresh(question, with_for_update=True)
                if question.status is not QuestionStatus.OPEN:
                    continue
                question.status = QuestionStatus.EXPIRED
                question.closed_at = utcnow()
                expired += 1
                self._ledger(
                    session,
                    LedgerAction.QUESTION_EXPIRED,
                    team_id=team_id,
                    agent_id=asker.id,
                    question_id=qid,
                    waiting=question.waiting,
                )
                if question.waiting:
                    self._release(
                        session,
                        asker,
                        question,
                        "expired: no answer arrived before the question's deadline",
                        effects,
                    )
        return expired, effects

    def question(self, question_id: int) -> Question:
        with self._sessions() as session:
            row = session.get(QuestionRow, question_id)
            if row is None:
                raise errors.UnknownQuestionError(f"no question {question_id}")
            return _question(row)

    def suspend(self, turn: TurnRecord) -> bool:
        """A blocked asker gives up its worker. Decided under the agent lock: ``True`` if it is now
        suspended (the answer will schedule a continuation), ``False`` if the answer already came
        (the tool result is in the transcript and this turn continues)."""
        with self._tx() as session:
            agent, row = self._fenced(session, turn, "suspend")
            if agent.state is not AgentState.WAITING:
                return False
            agent.suspended = True
            row.status = TurnStatus.SUSPENDED
            row.ended_at = utcnow()
            self._ledger(
                session,
                LedgerAction.TURN_ENDED,
                team_id=agent.team_id,
                agent_id=agent.id,
                turn_id=turn.id,
                epoch=turn.epoch,
                state=agent.state.value,
                suspended=True,
            )
            return True

    # ------------------------------------------------------------------ stop and output waits

    def request_stop(self, agent_id: int, *, reason: str) -> tuple[AgentState, Effects]:
        """Stop a sub-agent cooperatively. A resting, scheduled or suspended agent stops at once
        (a queued turn task is fenced); a running or blocked one is flagged and stops at its next
        boundary (:meth:`finish_stop`). Questions it asked and questions asked of it are
        cancelled (blocked askers get a ``cancelled`` result); its mailbox is kept. Returns the
        state after the request (``idle``, or ``running`` while the stop is pending)."""
        effects = Effects()
        with self._tx() as session:
            agent, asked_of = self._lock_sub_agent_and_askers(session, agent_id, "stopped")
            now = utcnow()
            for question in asked_of:
                question.status = QuestionStatus.CANCELLED
                question.closed_at = now
                if question.waiting:
                    asker = session.get(AgentRow, question.asker_agent_id)
                    assert asker is not None
                    self._release(
                        session,
                        asker,
                        question,
                        f"cancelled: {agent.display_name} was stopped ({reason})",
                        effects,
                    )
            state_before = agent.state
            own = self._waiting_question(session, agent.id)
            if agent.state is AgentState.RUNNING or (
                agent.state is AgentState.WAITING and not agent.suspended
            ):
                agent.stop_requested = True
                if own is not None:  # blocked in a worker: end the wait, the turn then stops
                    own.status = QuestionStatus.CANCELLED
                    own.closed_at = now
                    self._release(
                        session, agent, own, f"cancelled: stopped by the lead ({reason})", effects
                    )
                action = LedgerAction.STOP_REQUESTED
            else:
                if own is not None:  # suspended on a wait: its call gets the cancelled result
                    own.status = QuestionStatus.CANCELLED
                    own.closed_at = now
                    own.waiting = False
                self._close_dangling(
                    session, agent, None, f"cancelled: stopped by the lead ({reason})", None
                )
                self._cancel_own_questions(session, agent, now)
                if agent.state in (AgentState.SCHEDULED, AgentState.WAITING):
                    agent.epoch += 1  # a queued turn task (or continuation) claims nothing
                agent.state = AgentState.IDLE
                agent.suspended = False
                agent.pending_trigger = None
                agent.stop_requested = False
                action = LedgerAction.STOPPED
            self._ledger(
                session,
                action,
                team_id=agent.team_id,
                agent_id=agent.id,
                epoch=agent.epoch,
                reason=reason,
                state_before=state_before.value,
                cancelled_questions=len(asked_of),
            )
            return agent.state, effects

    def stop_requested(self, agent_id: int) -> bool:
        with self._sessions() as session:
            return bool(
                session.scalar(sa.select(AgentRow.stop_requested).where(AgentRow.id == agent_id))
            )

    def finish_stop(self, turn: TurnRecord) -> None:
        """The turn honours a stop at a boundary: the rest of its batch gets ``cancelled``
        results, its open questions are cancelled, the agent is ``idle`` (mailbox kept)."""
        with self._tx() as session:
            agent, row = self._fenced(session, turn, "stop")
            self._stop_turn(session, agent, row, reason="stop requested by the lead")

    def _cancel_own_questions(self, session: Session, agent: AgentRow, now: Any) -> None:
        for own in session.scalars(
            sa.select(QuestionRow).where(
                QuestionRow.asker_agent_id == agent.id, QuestionRow.status == QuestionStatus.OPEN
            )
        ):
            own.status = QuestionStatus.CANCELLED
            own.waiting = False
            own.closed_at = now

    def _stop_turn(self, session: Session, agent: AgentRow, row: TurnRow, *, reason: str) -> None:
        now = utcnow()
        closed = self._close_dangling(session, agent, row.id, STOPPED_RESULT, None)
        self._cancel_own_questions(session, agent, now)
        row.status = TurnStatus.STOPPED
        row.ended_at = now
        agent.state = AgentState.IDLE
        agent.suspended = False
        agent.stop_requested = False
        self._ledger(
            session,
            LedgerAction.STOPPED,
            team_id=agent.team_id,
            agent_id=agent.id,
            turn_id=row.id,
            epoch=agent.epoch,
            reason=reason,
            cancelled_tool_calls=closed,
        )

    def wait_output(
        self,
        turn: TurnRecord,
        *,
        target: str,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> tuple[Question, Effects]:
        """The lead waits for ``target``'s next output (a waits-for edge lead -> target, checked
        for cycles like an ask). An output of ``target`` already in the lead's mailbox is
        consumed at once; otherwise the lead is ``waiting`` until one arrives."""
        effects = Effects()
        with self._tx() as session:
            lead, target_probe = self._open_wait_edge(
                session,
                turn,
                target,
                tool_call_id,
                operation="wait_output",
                verb="wait",
                kind=QuestionKind.OUTPUT,
            )
            team_id = lead.team_id
            ready = session.scalars(
                sa.select(MessageRow)
                .where(
                    MessageRow.target_agent_id == lead.id,
                    MessageRow.source_agent_id == target_probe.id,
                    MessageRow.type == MessageType.OUTPUT,
                    MessageRow.status == MessageStatus.PENDING,
                )
                .order_by(MessageRow.seq)
                .limit(1)
            ).one_or_none()
            if ready is None and target_probe.state in (AgentState.IDLE, AgentState.COMPLETED):
                pending_work = session.scalar(
                    sa.select(sa.func.count())
                    .select_from(MessageRow)
                    .where(
                        MessageRow.target_agent_id == target_probe.id,
                        MessageRow.status == MessageStatus.PENDING,
                        MessageRow.wake.is_(True),
                    )
                )
                if not pending_work:
                    raise _wait_refusal(
                        turn,
                        team_id,
                        target,
                        "not_working",
                        f"{target!r} is {target_probe.state.value} with nothing to work on: "
                        "it will produce no output until it is given a task",
                        kind=QuestionKind.OUTPUT,
                    )
            q = self._open_question(
                session,
                lead,
                target_probe,
                tool_call_id,
                kind=QuestionKind.OUTPUT,
                timeout_seconds=timeout_seconds,
            )
            self._ledger(
                session,
                LedgerAction.WAIT_OUTPUT,
                team_id=team_id,
                agent_id=lead.id,
                turn_id=turn.id,
                epoch=lead.epoch,
                question_id=q.id,
                target=target,
                ready=ready is not None,
            )
            if ready is not None:
                q.status = QuestionStatus.ANSWERED
                q.answer_message_id = ready.id
                q.closed_at = utcnow()
                # The blocking path: state back to running, the wake signal unneeded but harmless.
                self._resolve_waiter(session, lead, q, ready, effects)
            return _question(q), effects

    # ------------------------------------------------------------------ background jobs

    def start_job(self, team_id: int, agent: str, *, name: str, task_id: str) -> BackgroundJob:
        """Record a background job before its task is sent, so that a completion (or the
        poller) always finds it."""
        with self._tx() as session:
            self._team(session, team_id)
            row = self._agent_by_name(session, team_id, agent)
            if row is None:
                raise errors.UnknownAgentError(f"no agent {agent!r} in team {team_id}")
            if row.state is AgentState.TERMINATED:
                raise errors.AgentTerminatedError(f"agent {agent!r} is terminated")
            job = BackgroundJobRow(
                team_id=team_id,
                agent_id=row.id,
                name=name[:200],
                task_id=task_id,
                status=JobStatus.RUNNING,
            )
            session.add(job)
            session.flush()
            self._ledger(
                session,
                LedgerAction.JOB_STARTED,
                team_id=team_id,
                agent_id=row.id,
                job_id=job.id,
                name=job.name,
                task_id=task_id,
            )
            return _job(job)

    def finish_job(
        self, job_id: int, *, ok: bool, result: str, batch_seconds: float = 0.0
    ) -> tuple[BackgroundJob, Delivery | None, Effects]:
        """Route a job's completion to its agent as a ``notice`` from ``job:<name>``, once: the
        job's row lock orders the link callback against the poller, and the second finds the
        job finished (the dedup key ``job:<id>`` guards the message as well).

        If the notice wakes a resting agent, its turn task is published ``batch_seconds`` late:
        completions arriving meanwhile coalesce into that one turn."""
        effects = Effects()
        with self._tx() as session:
            job = session.get(BackgroundJobRow, job_id, with_for_update={"key_share": True})
            if job is None:
                raise errors.RefusedError(f"no background job {job_id}")
            if job.status is not JobStatus.RUNNING:
                return _job(job), None, effects
            agent = session.get(AgentRow, job.agent_id)
            assert agent is not None
            job.status = JobStatus.SUCCEEDED if ok else JobStatus.FAILED
            job.finished_at = utcnow()
            job.result = result
            delivery: Delivery | None = None
            if agent.state is not AgentState.TERMINATED:
                verb = "finished" if ok else "failed"
                delivery = self._route(
                    session,
                    SendRequest(
                        team_id=job.team_id,
                        to=agent.display_name,
                        content=f"Background job {job.name} ({job.task_id}) {verb}: {result}",
                        sender=f"{EXTERNAL_PREFIX}{job.name}",
                        type=MessageType.NOTICE,
                        dedup_key=f"job:{job.id}",
                    ),
                    effects,
                )
                job.notice_message_id = delivery.message_id
                if batch_seconds > 0:
                    self._batch_turn(session, agent, delivery, effects, batch_seconds)
            self._ledger(
                session,
                LedgerAction.JOB_FINISHED,
                team_id=job.team_id,
                agent_id=job.agent_id,
                message_id=job.notice_message_id,
                job_id=job.id,
                status=job.status.value,
                reported=delivery is not None,
            )
            return _job(job), delivery, effects

    def _batch_turn(
        self,
        session: Session,
        agent: AgentRow,
        delivery: Delivery,
        effects: Effects,
        seconds: float,
    ) -> None:
        """Debounce: the first completion schedules the agent's turn ``seconds`` late; each
        further one that arrives before that turn started pushes it back by ``seconds`` again
        (a new epoch; the earlier task is refused by the fence), for at most
        :data:`JOB_BATCH_MAX_WINDOWS` windows after the first."""
        now = utcnow()
        if delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN:
            self._delay_turn(session, effects, seconds, first=now)
            return
        if delivery.outcome is not RouteOutcome.COALESCED:
            return
        batch = session.scalars(
            sa.select(OutboxRow)
            .where(
                OutboxRow.agent_id == agent.id,
                OutboxRow.epoch == agent.epoch,
                OutboxRow.kind == OutboxKind.ENQUEUE_TURN,
            )
            .order_by(OutboxRow.id.desc())
            .limit(1)
        ).one_or_none()
        first_at = (batch.payload or {}).get("batch_started") if batch else None
        if first_at is None:
            return  # not a batch turn (a message woke it): it starts as published
        first = datetime.fromisoformat(first_at)
        if now - first >= timedelta(seconds=seconds * JOB_BATCH_MAX_WINDOWS):
            return
        self._schedule(session, agent, agent.pending_trigger or TurnTrigger.NEW, effects)
        self._delay_turn(session, effects, seconds, first=first)

    @staticmethod
    def _delay_turn(session: Session, effects: Effects, seconds: float, *, first: datetime) -> None:
        """Give the turn task just scheduled a countdown (published with it)."""
        entry = effects.outbox[-1]
        payload = {**entry.payload, "countdown": seconds, "batch_started": first.isoformat()}
        row = session.get(OutboxRow, entry.id)
        assert row is not None and entry.kind is OutboxKind.ENQUEUE_TURN
        row.payload = payload
        effects.outbox[-1] = _outbox_entry(row)

    def running_jobs(self, *, older_than_seconds: float, limit: int = 500) -> list[BackgroundJob]:
        """Jobs with no completion seen yet, started at least ``older_than_seconds`` ago."""
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(BackgroundJobRow)
                .where(
                    BackgroundJobRow.status == JobStatus.RUNNING,
                    BackgroundJobRow.created_at <= cutoff,
                )
                .order_by(BackgroundJobRow.created_at)
                .limit(limit)
            ).all()
            return [_job(r) for r in rows]

    def jobs(self, team_id: int) -> list[BackgroundJob]:
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(BackgroundJobRow)
                .where(BackgroundJobRow.team_id == team_id)
                .order_by(BackgroundJobRow.id)
            ).all()
            return [_job(r) for r in rows]

    # ------------------------------------------------------------------ outbox

    def mark_published(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        stmt = (
            sa.update(OutboxRow)
            .where(OutboxRow.id.in_(ids), OutboxRow.published_at.is_(None))
            .values(published_at=utcnow(), attempts=OutboxRow.attempts + 1)
        )
        if self.engine.dialect.name == "sqlite":
            with self._tx() as session:  # SQLite writes under BEGIN IMMEDIATE (make_engine)
                session.execute(stmt)
            return
        # One statement is its own transaction: autocommit spares a BEGIN and a COMMIT round
        # trip on every publish (it follows every send that enqueues a turn or wakes a waiter).
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(stmt)
        except DBAPIError as exc:
            raise errors.StoreError(f"database error: {exc.orig!r}") from exc

    def claim_unpublished(
        self, *, older_than_seconds: float = 0.0, limit: int = 500
    ) -> list[OutboxEntry]:
        """Outbox rows to publish again: unpublished, older than ``older_than_seconds``, and not
        taken by a sweeper within that time. They are taken (``attempted_at``) in this
        transaction, skipping rows another sweeper holds locked, so that the timers of many
        workers publish a lost row once, not once each. A publish that fails leaves the row to
        the next pass after the same delay."""
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        with self._tx() as session:
            rows = session.scalars(
                _unpublished_since(cutoff, limit)
                .where(sa.or_(OutboxRow.attempted_at.is_(None), OutboxRow.attempted_at <= cutoff))
                .with_for_update(skip_locked=True)
            ).all()
            now = utcnow()
            for row in rows:
                row.attempted_at = now
            return [_outbox_entry(r) for r in rows]

    def unpublished(
        self, *, older_than_seconds: float = 0.0, limit: int = 500
    ) -> list[OutboxEntry]:
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        with self._sessions() as session:
            rows = session.scalars(_unpublished_since(cutoff, limit)).all()
            return [_outbox_entry(r) for r in rows]

    def outbox(self, team_id: int) -> list[OutboxEntry]:
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(OutboxRow).where(OutboxRow.team_id == team_id).order_by(OutboxRow.id)
            ).all()
            return [_outbox_entry(r) for r in rows]

    def seed_mailbox(
        self, agent_id: int, count: int, *, content: str, sender: str = "system"
    ) -> None:
        """Queue ``count`` context-only notices for an agent in bulk (benchmarks and load tests:
        it bypasses routing decisions, so it never wakes anyone)."""
        with self._tx() as session:
            agent = self._lock_agent(session, agent_id)
            if agent is None:
                raise errors.UnknownAgentError(f"no agent with id {agent_id}")
            first = agent.next_seq
            agent.next_seq += count
            now = utcnow()
            for start in range(0, count, 10_000):
                session.execute(
                    sa.insert(MessageRow),
                    [
                        {
                            "team_id": agent.team_id,
                            "seq": first + i,
                            "source_name": sender,
                            "target_agent_id": agent.id,
                            "type": MessageType.NOTICE,
                            "content": content,
                            "wake": False,
                            "outcome": RouteOutcome.QUEUED,
                            "status": MessageStatus.PENDING,
                            "created_at": now,
                        }
                        for i in range(start, min(count, start + 10_000))
                    ],
                )

    # ------------------------------------------------------------------ reads for callers

    def transcript(self, agent_id: int) -> list[dict[str, Any]]:
        with self._sessions() as session:
            return list(
                session.scalars(
                    sa.select(TranscriptEntryRow.payload)
                    .where(TranscriptEntryRow.agent_id == agent_id)
                    .order_by(TranscriptEntryRow.position)
                )
            )

    def transcript_entries(self, agent_id: int) -> list[dict[str, Any]]:
        """Transcript with provenance: each entry's payload plus its metadata and ids."""
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(TranscriptEntryRow)
                .where(TranscriptEntryRow.agent_id == agent_id)
                .order_by(TranscriptEntryRow.position)
            ).all()
            return [
                {
                    "position": r.position,
                    "payload": r.payload,
                    "meta": r.meta,
                    "message_id": r.message_id,
                    "turn_id": r.turn_id,
                }
                for r in rows
            ]

    def messages(self, team_id: int) -> list[Message]:
        with self._sessions() as session:
            names = dict(
                session.execute(
                    sa.select(AgentRow.id, AgentRow.display_name).where(AgentRow.team_id == team_id)
                ).all()
            )
            rows = session.scalars(
                sa.select(MessageRow).where(MessageRow.team_id == team_id).order_by(MessageRow.id)
            ).all()
            return [_message(r, names[r.target_agent_id]) for r in rows]

    def turns(self, agent_id: int) -> list[TurnRecord]:
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(TurnRow).where(TurnRow.agent_id == agent_id).order_by(TurnRow.id)
            ).all()
            return [_turn(r) for r in rows]

    def current_turn(self, agent_id: int) -> TurnRecord | None:
        with self._sessions() as session:
            agent = session.get(AgentRow, agent_id)
            if agent is None:
                return None
            row = session.scalars(
                sa.select(TurnRow).where(
                    TurnRow.agent_id == agent_id,
                    TurnRow.epoch == agent.epoch,
                    TurnRow.status == TurnStatus.RUNNING,
                )
            ).one_or_none()
            return _turn(row) if row else None

    def ledger(self, team_id: int, *, after_id: int = 0) -> list[LedgerEvent]:
        """The team's ledger in order; ``after_id``: only events after that one (tailing)."""
        with self._sessions() as session:
            rows = session.execute(
                sa.select(LedgerRow, AgentRow.display_name)
                .outerjoin(AgentRow, AgentRow.id == LedgerRow.agent_id)
                .where(LedgerRow.team_id == team_id, LedgerRow.id > after_id)
                .order_by(LedgerRow.id)
            ).all()
            return [
                LedgerEvent(
                    id=r.id,
                    team_id=r.team_id,
                    agent_id=r.agent_id,
                    agent_name=name,
                    action=r.action,
                    outcome=r.outcome,
                    message_id=r.message_id,
                    turn_id=r.turn_id,
                    epoch=r.epoch,
                    detail=dict(r.detail or {}),
                    created_at=r.created_at,
                )
                for r, name in rows
            ]

    # ------------------------------------------------------------------ reads for operators

    def agent_statuses(self, team_id: int | None = None) -> list[AgentStatus]:
        """Every agent of a team (or of all teams, ``None``) with its mailbox depth, open
        questions and running turn's lease: a handful of queries, whatever the team size."""
        with self._sessions() as session:
            agents_q = sa.select(AgentRow).order_by(AgentRow.team_id, AgentRow.id)
            if team_id is not None:
                self._team(session, team_id)
                agents_q = agents_q.where(AgentRow.team_id == team_id)
            rows = session.scalars(agents_q).all()
            ids = [r.id for r in rows]
            depth = dict(
                session.execute(
                    sa.select(MessageRow.target_agent_id, sa.func.count())
                    .where(
                        MessageRow.target_agent_id.in_(ids),
                        MessageRow.status == MessageStatus.PENDING,
                    )
                    .group_by(MessageRow.target_agent_id)
                ).all()
            )
            asked: dict[int, list[int]] = {}
            to_answer: dict[int, list[int]] = {}
            for qid, asker, target in session.execute(
                sa.select(QuestionRow.id, QuestionRow.asker_agent_id, QuestionRow.target_agent_id)
                .where(
                    QuestionRow.status == QuestionStatus.OPEN,
                    sa.or_(
                        QuestionRow.asker_agent_id.in_(ids), QuestionRow.target_agent_id.in_(ids)
                    ),
                )
                .order_by(QuestionRow.id)
            ):
                asked.setdefault(asker, []).append(qid)
                to_answer.setdefault(target, []).append(qid)
            running = {
                t.agent_id: t
                for t in session.scalars(
                    sa.select(TurnRow).where(
                        TurnRow.agent_id.in_(ids), TurnRow.status == TurnStatus.RUNNING
                    )
                )
            }
            statuses = []
            for r in rows:
                turn = running.get(r.id)
                current = turn is not None and turn.epoch == r.epoch
                statuses.append(
                    AgentStatus(
                        agent=_agent(r, depth.get(r.id, 0)),
                        open_questions=tuple(asked.get(r.id, ())),
                        questions_to_answer=tuple(to_answer.get(r.id, ())),
                        turn_id=turn.id if turn is not None and current else None,
                        lease_expires_at=turn.lease_expires_at
                        if turn is not None and current
                        else None,
                    )
                )
            return statuses

    def state_counts(self) -> dict[AgentState, tuple[int, int]]:
        """Per agent state: (agents, pending messages to them), over every team (metrics)."""
        with self._sessions() as session:
            agents = dict(
                session.execute(
                    sa.select(AgentRow.state, sa.func.count()).group_by(AgentRow.state)
                ).all()
            )
            pending = dict(
                session.execute(
                    sa.select(AgentRow.state, sa.func.count())
                    .select_from(MessageRow)
                    .join(AgentRow, AgentRow.id == MessageRow.target_agent_id)
                    .where(MessageRow.status == MessageStatus.PENDING)
                    .group_by(AgentRow.state)
                ).all()
            )
            return {s: (agents.get(s, 0), pending.get(s, 0)) for s in set(agents) | set(pending)}

    def message(self, message_id: int) -> Message:
        """One message by id, with its delivery record."""
        with self._sessions() as session:
            row = session.get(MessageRow, message_id)
            if row is None:
                raise errors.UnknownMessageError(f"no message {message_id}")
            target = session.get(AgentRow, row.target_agent_id)
            assert target is not None
            return _message(row, target.display_name)

    def message_events(self, message_id: int) -> list[LedgerEvent]:
        """Ledger events about one message (its routing, a duplicate send, a drop)."""
        with self._sessions() as session:
            rows = session.execute(
                sa.select(LedgerRow, AgentRow.display_name)
                .outerjoin(AgentRow, AgentRow.id == LedgerRow.agent_id)
                .where(LedgerRow.message_id == message_id)
                .order_by(LedgerRow.id)
            ).all()
            return [_ledger_event(r, name) for r, name in rows]


# ---------------------------------------------------------------------- row -> value


def _ledger_event(r: LedgerRow, name: str | None) -> LedgerEvent:
    return LedgerEvent(
        id=r.id,
        team_id=r.team_id,
        agent_id=r.agent_id,
        agent_name=name,
        action=r.action,
        outcome=r.outcome,
        message_id=r.message_id,
        turn_id=r.turn_id,
        epoch=r.epoch,
        detail=dict(r.detail or {}),
        created_at=r.created_at,
    )


def _agent(row: AgentRow, mailbox_depth: int = 0) -> Agent:
    return Agent(
        id=row.id,
        team_id=row.team_id,
        display_name=row.display_name,
        role=row.role,
        is_lead=row.is_lead,
        state=row.state,
        suspended=row.suspended,
        epoch=row.epoch,
        pending_trigger=row.pending_trigger,
        mailbox_depth=mailbox_depth,
        stop_requested=row.stop_requested,
    )


#: The columns a :class:`Message` is made of (all its fields but the target's name).
_MESSAGE_FIELDS = tuple(f.name for f in fields(Message) if f.name != "target_name")


def _message(row: MessageRow | sa.RowMapping, target_name: str, **overrides: Any) -> Message:
    """A :class:`Message` from an ORM row or a Core row mapping (the drain's set-based path)."""
    if isinstance(row, MessageRow):
        values = {name: getattr(row, name) for name in _MESSAGE_FIELDS}
    else:
        values = {name: row[name] for name in _MESSAGE_FIELDS}
    return Message(**(values | {"target_name": target_name} | overrides))


def _unpublished_since(cutoff: datetime, limit: int) -> sa.Select[OutboxRow]:
    """Outbox rows never published and created at or before ``cutoff``, oldest first."""
    return (
        sa.select(OutboxRow)
        .where(OutboxRow.published_at.is_(None), OutboxRow.created_at <= cutoff)
        .order_by(OutboxRow.id)
        .limit(limit)
    )


def _outbox_entry(row: OutboxRow) -> OutboxEntry:
    return OutboxEntry(
        id=row.id, kind=row.kind, agent_id=row.agent_id, epoch=row.epoch, payload=row.payload
    )


def _turn(row: TurnRow) -> TurnRecord:
    return TurnRecord(
        id=row.id,
        agent_id=row.agent_id,
        epoch=row.epoch,
        trigger=row.trigger,
        status=row.status,
        started_at=row.started_at,
        ended_at=row.ended_at,
    )


def _question(row: QuestionRow) -> Question:
    return Question(
        id=row.id,
        team_id=row.team_id,
        asker_agent_id=row.asker_agent_id,
        target_agent_id=row.target_agent_id,
        tool_call_id=row.tool_call_id,
        status=row.status,
        waiting=row.waiting,
        deadline=row.deadline,
        answer_message_id=row.answer_message_id,
        kind=row.kind,
    )


def _resolves(
    waiting_on: QuestionRow, req: SendRequest, source_id: int | None, answered: QuestionRow | None
) -> bool:
    """Does this message end the receiver's wait? An ask ends on any wake message (the seed's
    rule) unless it answers another question; an output wait only on the awaited agent's output
    (any other message to the waiting lead is queued as usual)."""
    if waiting_on.kind is QuestionKind.OUTPUT:
        return (
            req.type is MessageType.OUTPUT
            and source_id is not None
            and source_id == waiting_on.target_agent_id
        )
    return req.wake and (answered is None or answered.id == waiting_on.id)


def _job(row: BackgroundJobRow) -> BackgroundJob:
    return BackgroundJob(
        id=row.id,
        team_id=row.team_id,
        agent_id=row.agent_id,
        name=row.name,
        task_id=row.task_id,
        status=row.status,
        created_at=row.created_at,
        finished_at=row.finished_at,
        result=row.result,
        notice_message_id=row.notice_message_id,
    )


def _wait_refusal(
    turn: TurnRecord,
    team_id: int,
    target: str,
    reason: str,
    message: str,
    *,
    cycle: list[str] | None = None,
    kind: QuestionKind | None = None,
) -> _Refused:
    """A refused wait edge: the tool gets :class:`AskRefusedError`, the ledger ``ask_refused``."""
    extra = {"kind": kind.value} if kind is not None else {}
    return _Refused(
        errors.AskRefusedError(message, cycle=cycle),
        LedgerAction.ASK_REFUSED,
        team_id=team_id,
        agent_id=turn.agent_id,
        turn_id=turn.id,
        epoch=turn.epoch,
        reason=reason,
        target=target,
        cycle=cycle or [],
        **extra,
    )


def _is_external(sender: str) -> bool:
    return sender in EXTERNAL_SENDERS or (
        sender.startswith(EXTERNAL_PREFIX) and len(sender) > len(EXTERNAL_PREFIX)
    )


def _check_display_name(name: str) -> None:
    if not name or len(name) > 200 or any(c in name for c in '"\n\r<>') or name != name.strip():
        raise errors.InvalidMessageError(f"invalid display name {name!r}")
    if _is_external(name) or name.startswith(EXTERNAL_PREFIX):
        raise errors.InvalidMessageError(
            f"display name {name!r} is reserved for external senders (user, system, job:<name>)"
        )


def _validate_assistant(message: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise errors.InvalidTranscriptEntryError("an assistant message needs role 'assistant'")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise errors.InvalidTranscriptEntryError("assistant content must be a string or None")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise errors.InvalidTranscriptEntryError("tool_calls must be a list")
    seen: set[str] = set()
    for call in calls:
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("id"), str)
            or not call["id"]
            or not isinstance(call.get("function"), dict)
            or not isinstance(call["function"].get("name"), str)
        ):
            raise errors.InvalidTranscriptEntryError(f"malformed tool call {call!r}")
        if call["id"] in seen:
            raise errors.InvalidTranscriptEntryError(f"duplicate tool call id {call['id']!r}")
        seen.add(call["id"])
    if content is None and not calls:
        raise errors.InvalidTranscriptEntryError("an assistant message needs content or tool calls")
    payload: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        payload["tool_calls"] = calls
    return payload


__all__ = ["EXTERNAL_SENDERS", "Effects", "SendRequest", "Store", "make_engine", "utcnow"]
