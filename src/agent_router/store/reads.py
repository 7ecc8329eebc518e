"""Every read-only view of the store: what the router, the CLI, the checks, the metrics and the
chaos run read. Each read is one short session, no lock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from agent_router import errors, validation
from agent_router.domain import (
    Agent,
    AgentState,
    AgentStatus,
    BackgroundJob,
    FeedItem,
    JobStatus,
    LedgerEvent,
    Message,
    MessageStatus,
    OutboxEntry,
    Quarantine,
    Question,
    QuestionKind,
    QuestionStatus,
    Team,
    TokenUsage,
    TurnRecord,
    TurnStatus,
    UserMessage,
)
from agent_router.store import (
    budgets,
    faults,
    quarantine,
    queries,
    recovery,
    timeline,
    users,
    values,
)
from agent_router.store.models import (
    AgentRow,
    BackgroundJobRow,
    InstallationRow,
    LedgerRow,
    MessageRow,
    ModelCallRow,
    OutboxRow,
    QuarantineRow,
    QuestionRow,
    TeamRow,
    TranscriptEntryRow,
    TurnRow,
    UserMessageRow,
    utcnow,
)

P = ParamSpec("P")
R = TypeVar("R")
V = TypeVar("V")


@faults.boundary
class Reads:
    """Every read-only view of the database: ``Router.reads`` (and ``Store.reads``). Each read
    is one short session with no lock, returns frozen values of :mod:`agent_router.domain` (or
    of :mod:`agent_router.store.timeline` for the timeline's), and raises only the library's
    errors. Nothing here writes: the transitions are the store's, reached through the
    :class:`~agent_router.router.Router`."""

    def __init__(self, sessions: sessionmaker[Session], engine: Engine) -> None:
        self._sessions = sessions
        self._engine = engine

    def _each(self, value: Callable[[R], V], stmt: sa.Select[R]) -> list[V]:
        """What ``stmt`` selects (one column or entity), each row made a value by ``value``."""
        with self._sessions() as session:
            return [value(row) for row in session.scalars(stmt)]

    def _by_id(
        self, value: Callable[[R], V], row: type[R], where: sa.ColumnElement[bool]
    ) -> list[V]:
        """The rows of ``row``'s table matching ``where`` in the order they were written (by
        their autoincrementing key), each made a value by ``value``."""
        stmt = sa.select(row).where(where).order_by(*sa.inspect(row).primary_key)
        return self._each(value, stmt)

    def _read(
        self, read: Callable[Concatenate[Session, P], V], *args: P.args, **kwargs: P.kwargs
    ) -> V:
        """What ``read`` returns, run in a session of its own."""
        with self._sessions() as session:
            return read(session, *args, **kwargs)

    @faults.wrapped_read
    def installation(self) -> str:
        """The database's installation id (written with its schema; never changed). Refused
        (:class:`~agent_router.errors.StoreError`) on a database without one: one not yet
        migrated to this release."""
        with self._sessions() as session:
            found = session.scalar(sa.select(InstallationRow.id).limit(1))
        if found is None:
            raise errors.StoreError(
                "the database has no installation id: upgrade it (agent-router db upgrade)"
            )
        return found

    @faults.wrapped_read
    def usage_by_agent(self, team_id: int) -> dict[int, TokenUsage]:
        """Model-call usage of a team summed per agent id (agents that made no call: absent)."""
        return self._read(
            budgets.usage_sums, ModelCallRow.team_id == team_id, ModelCallRow.agent_id
        )

    @faults.wrapped_read
    def usage_of_agents(self, first_id: int, last_id: int) -> dict[int, TokenUsage]:
        """Model-call usage summed per agent id, of the agents whose ids run from ``first_id`` to
        ``last_id`` (a page of :meth:`agent_statuses`): one query, whatever the page's size."""
        return self._read(
            budgets.usage_sums,
            ModelCallRow.agent_id.between(first_id, last_id),
            ModelCallRow.agent_id,
        )

    @faults.wrapped_read
    def usage_by_turn(self, agent_id: int) -> dict[int, TokenUsage]:
        """Model-call usage of one agent summed per turn id."""
        return self._read(
            budgets.usage_sums, ModelCallRow.agent_id == agent_id, ModelCallRow.turn_id
        )

    @faults.wrapped_read
    def team(self, team_id: int) -> Team:
        with self._sessions() as session:
            queries.team(session, team_id)
            lead = session.scalars(
                sa.select(AgentRow).where(AgentRow.team_id == team_id, AgentRow.is_lead.is_(True))
            ).one()
            created, model, user_task = session.execute(
                sa.select(TeamRow.created_at, TeamRow.model, TeamRow.user_task).where(
                    TeamRow.id == team_id
                )
            ).one()
            return Team(
                id=team_id,
                lead=values.agent(lead),
                created_at=created,
                model=model,
                user_task=user_task,
            )

    @faults.wrapped_read
    def agent(self, team_id: int, name: str) -> Agent:
        with self._sessions() as session:
            queries.team(session, team_id)
            row = queries.agent_by_name(session, team_id, name)
            if row is None:
                raise queries.unknown_agent(session, team_id, name)
            return values.agent(row, queries.mailbox_depth(session, row.id))

    @faults.wrapped_read
    def agent_by_id(self, agent_id: int) -> Agent:
        with self._sessions() as session:
            missing = errors.UnknownAgentError(f"no agent with id {agent_id}")
            row = _row(session, AgentRow, agent_id, missing)
            return values.agent(row, queries.mailbox_depth(session, row.id))

    @faults.wrapped_read
    def agents(self, team_id: int) -> list[Agent]:
        with self._sessions() as session:
            queries.team(session, team_id)
            rows = session.scalars(
                sa.select(AgentRow).where(AgentRow.team_id == team_id).order_by(AgentRow.id)
            ).all()
            return [values.agent(r, queries.mailbox_depth(session, r.id)) for r in rows]

    @faults.wrapped_read
    def team_exists(self, team_id: int) -> bool:
        with self._sessions() as session:
            return session.get(TeamRow, team_id) is not None

    @faults.wrapped_read
    def wait_state(self, question_id: int) -> tuple[bool, datetime, bool]:
        """Whether the asker still waits on the question, its deadline, and whether the agent
        asked is at work (a turn of its holds a worker: running, or waiting blocked in a
        worker): what a blocked call re-reads after every wake signal (one statement built
        once, no ORM). On PostgreSQL
        the statement is its own transaction (autocommit): one round trip, no ``BEGIN`` and no
        ``ROLLBACK``; one statement reads one snapshot either way."""
        conn = self._engine.connect()
        if self._engine.dialect.name != "sqlite":
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        with conn:
            found = conn.execute(_WAIT_STATE, {"b_question": question_id}).one_or_none()
        if found is None:
            raise errors.UnknownQuestionError(f"no question {question_id}")
        return bool(found.waiting), found.deadline, bool(found.target_at_work)

    @faults.wrapped_read
    def question(self, question_id: int) -> Question:
        with self._sessions() as session:
            return values.question(_question(session, question_id))

    @faults.wrapped_read
    def named_question(self, question_id: int) -> Question:
        """The question with the display names of its asker and of the agent asked."""
        with self._sessions() as session:
            row = _question(session, question_id)
            found = session.execute(
                sa.select(AgentRow.id, AgentRow.display_name).where(
                    AgentRow.id.in_((row.asker_agent_id, row.target_agent_id))
                )
            ).all()
            names = {agent_id: name for agent_id, name in found}
            return dataclasses.replace(
                values.question(row),
                asker=names[row.asker_agent_id],
                target=users.USER if row.kind is QuestionKind.USER else names[row.target_agent_id],
            )

    @faults.wrapped_read
    def stop_requested(self, agent_id: int) -> bool:
        with self._sessions() as session:
            return bool(
                session.scalar(sa.select(AgentRow.stop_requested).where(AgentRow.id == agent_id))
            )

    @faults.wrapped_read
    def open_tool_calls(self, agent_id: int) -> list[str]:
        return self._read(queries.open_tool_calls, agent_id)

    @faults.wrapped_read
    def transcript(self, agent_id: int) -> list[dict[str, Any]]:
        with self._sessions() as session:
            return list(
                session.scalars(
                    sa.select(TranscriptEntryRow.payload)
                    .where(TranscriptEntryRow.agent_id == agent_id)
                    .order_by(TranscriptEntryRow.position)
                )
            )

    @faults.wrapped_read
    def transcript_after(
        self, agent_id: int, position: int | None, *, also: Sequence[int] = ()
    ) -> list[tuple[int, dict[str, Any]]]:
        """The entries after ``position`` (all with ``None``) and those at the positions
        ``also``, with their positions, in order: a turn reads its transcript once and then
        only what was appended since."""
        with self._sessions() as session:
            return queries.transcript_after(session, agent_id, position, also=also)

    @faults.wrapped_read
    def window_checkpoint(self, agent_id: int) -> dict[str, Any] | None:
        """Where the agent's request window stood when its cut last moved (``None``: never)."""
        with self._sessions() as session:
            return session.scalar(sa.select(AgentRow.context_window).where(AgentRow.id == agent_id))

    @faults.wrapped_read
    def last_assistant(self, agent_id: int) -> tuple[int, dict[str, Any]] | None:
        """The agent's last assistant entry, with its position."""
        with self._sessions() as session:
            row = session.execute(
                sa.select(TranscriptEntryRow.position, TranscriptEntryRow.payload)
                .where(
                    TranscriptEntryRow.agent_id == agent_id,
                    TranscriptEntryRow.role == "assistant",
                )
                .order_by(TranscriptEntryRow.position.desc())
                .limit(1)
            ).one_or_none()
            return None if row is None else (row[0], row[1])

    @faults.wrapped_read
    def transcript_entries(
        self, agent_id: int, *, start: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Transcript with provenance: each entry's payload plus its metadata and ids; from
        position ``start`` (a position: refused beyond its column's range, on both databases),
        at most ``limit`` entries."""
        validation.integer(
            start, "start", minimum=validation.MIN_INT32, maximum=validation.MAX_INT32
        )
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(TranscriptEntryRow)
                .where(
                    TranscriptEntryRow.agent_id == agent_id, TranscriptEntryRow.position >= start
                )
                .order_by(TranscriptEntryRow.position)
                .limit(limit)
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

    @faults.wrapped_read
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
            return [values.message(r, names[r.target_agent_id]) for r in rows]

    @faults.wrapped_read
    def message(self, message_id: int) -> Message:
        """One message by id, with its delivery record."""
        with self._sessions() as session:
            row = _row(
                session,
                MessageRow,
                message_id,
                errors.UnknownMessageError(f"no message {message_id}"),
            )
            target = session.get(AgentRow, row.target_agent_id)
            assert target is not None
            return values.message(row, target.display_name)

    @faults.wrapped_read
    def message_events(self, message_id: int) -> list[LedgerEvent]:
        """Ledger events about one message (its routing, a duplicate send, a drop)."""
        return self._read(_ledger_events, LedgerRow.message_id == message_id)

    @faults.wrapped_read
    def turns(self, agent_id: int) -> list[TurnRecord]:
        return self._by_id(values.turn, TurnRow, TurnRow.agent_id == agent_id)

    @faults.wrapped_read
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
            return values.turn(row) if row else None

    @faults.wrapped_read
    def ledger(self, team_id: int, *, after_id: int = 0) -> list[LedgerEvent]:
        """The team's ledger in order; ``after_id``: only events after that one (tailing)."""
        return self._read(_ledger_events, LedgerRow.team_id == team_id, LedgerRow.id > after_id)

    @faults.wrapped_read
    def user_messages(
        self, team_id: int, *, after_id: int = 0, limit: int = 500
    ) -> list[UserMessage]:
        """The team's messages to the user after ``after_id``, in order (ids are in commit
        order within a team: :class:`~agent_router.store.models.UserMessageRow`)."""
        with self._sessions() as session:
            rows = session.execute(
                sa.select(UserMessageRow, AgentRow.display_name)
                .join(AgentRow, AgentRow.id == UserMessageRow.agent_id)
                .where(UserMessageRow.team_id == team_id, UserMessageRow.id > after_id)
                .order_by(UserMessageRow.id)
                .limit(limit)
            ).all()
            return [users.user_message(row, name) for row, name in rows]

    @faults.wrapped_read
    def feed(self, team_id: int, *, after_id: int = 0, limit: int = 500) -> list[FeedItem]:
        """The team's feed after the cursor ``after_id`` (:func:`users.feed`)."""
        return self._read(users.feed, team_id, after_id=after_id, limit=limit)

    @faults.wrapped_read
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

    @faults.wrapped_read
    def scheduled(self, *, older_than_seconds: float) -> list[values.Scheduled]:
        """Agents scheduled longer ago than that, with their turn tasks' publishes."""
        return self._read(recovery.scheduled, older_than_seconds=older_than_seconds)

    @faults.wrapped_read
    def queued_publishes(self) -> dict[str | None, list[datetime]]:
        """When each scheduled agent's task was published, by runner (what should be queued)."""
        return self._read(recovery.published_by_runner)

    @faults.wrapped_read
    def running_turns(self) -> list[tuple[datetime, datetime]]:
        """(scheduled at, started at) of every running turn's agent."""
        return self._read(recovery.running_turns)

    @faults.wrapped_read
    def overdue_questions(self) -> list[tuple[int, int]]:
        """Open questions past their deadline: (question id, its asker's agent id)."""
        with self._sessions() as session:
            rows = session.execute(
                sa.select(QuestionRow.id, QuestionRow.asker_agent_id)
                .where(QuestionRow.status == QuestionStatus.OPEN, QuestionRow.deadline <= utcnow())
                .order_by(QuestionRow.team_id, QuestionRow.id)
            )
            return [(qid, asker) for qid, asker in rows]

    @faults.wrapped_read
    def quarantined(self, team_id: int | None = None) -> list[Quarantine]:
        """Agents a sweeper repair failed for (of one team, or all), by agent id."""
        stmt = sa.select(QuarantineRow).order_by(QuarantineRow.agent_id)
        if team_id is not None:
            stmt = stmt.where(QuarantineRow.team_id == team_id)
        return self._each(quarantine.value, stmt)

    @faults.wrapped_read
    def running_jobs(self, *, older_than_seconds: float, limit: int = 500) -> list[BackgroundJob]:
        """Jobs with no completion seen yet, started at least ``older_than_seconds`` ago."""
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        return self._each(
            values.job,
            sa.select(BackgroundJobRow)
            .where(
                BackgroundJobRow.status == JobStatus.RUNNING,
                BackgroundJobRow.created_at <= cutoff,
            )
            .order_by(BackgroundJobRow.created_at)
            .limit(limit),
        )

    @faults.wrapped_read
    def jobs(self, team_id: int) -> list[BackgroundJob]:
        return self._by_id(values.job, BackgroundJobRow, BackgroundJobRow.team_id == team_id)

    @faults.wrapped_read
    def unpublished(
        self, *, older_than_seconds: float = 0.0, limit: int = 500
    ) -> list[OutboxEntry]:
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        return self._each(values.outbox_entry, queries.unpublished_since(cutoff, limit))

    @faults.wrapped_read
    def outbox(self, team_id: int) -> list[OutboxEntry]:
        return self._by_id(values.outbox_entry, OutboxRow, OutboxRow.team_id == team_id)

    @faults.wrapped_read
    def agent_statuses(
        self,
        team_id: int | None = None,
        *,
        states: Collection[AgentState] = (),
        after_id: int = 0,
        limit: int | None = None,
    ) -> list[AgentStatus]:
        """Agents of a team (or of all teams, ``None``), in ``states`` if given, by id after
        ``after_id``, at most ``limit``: each with its mailbox depth, open questions, running
        turn's lease and the error of its last turn if that failed. Five queries whatever the
        number of agents: the page is a subquery, never a list of ids."""
        with self._sessions() as session:
            page = sa.select(AgentRow.id).where(AgentRow.id > after_id)
            if team_id is not None:
                queries.team(session, team_id)
                page = page.where(AgentRow.team_id == team_id)
            if states:
                page = page.where(AgentRow.state.in_(list(states)))
            page = page.order_by(AgentRow.id).limit(limit)
            rows = session.scalars(
                sa.select(AgentRow).where(AgentRow.id.in_(page)).order_by(AgentRow.id)
            ).all()
            if not rows:
                return []
            first, last = rows[0].id, rows[-1].id
            in_page = sa.select(AgentRow.id).where(
                AgentRow.id.between(first, last),
                *([AgentRow.team_id == team_id] if team_id is not None else []),
                *([AgentRow.state.in_(list(states))] if states else []),
            )
            return self._statuses(session, rows, in_page)

    @staticmethod
    def _statuses(session: Session, rows: Sequence[AgentRow], page: Any) -> list[AgentStatus]:
        depth = dict(
            session.execute(
                sa.select(MessageRow.target_agent_id, sa.func.count())
                .where(
                    MessageRow.target_agent_id.in_(page),
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
                sa.or_(QuestionRow.asker_agent_id.in_(page), QuestionRow.target_agent_id.in_(page)),
            )
            .order_by(QuestionRow.id)
        ):
            asked.setdefault(asker, []).append(qid)
            to_answer.setdefault(target, []).append(qid)
        running = {
            t.agent_id: t
            for t in session.scalars(
                sa.select(TurnRow).where(
                    TurnRow.agent_id.in_(page), TurnRow.status == TurnStatus.RUNNING
                )
            )
        }
        last = (
            sa.select(sa.func.max(TurnRow.id))
            .where(TurnRow.agent_id.in_(page))
            .group_by(TurnRow.agent_id)
            .scalar_subquery()
        )
        failed: dict[int, str | None] = dict(
            session.execute(
                sa.select(TurnRow.agent_id, TurnRow.error).where(
                    TurnRow.id.in_(last), TurnRow.status == TurnStatus.FAILED
                )
            ).all()
        )
        statuses = []
        for r in rows:
            turn = running.get(r.id)
            current = turn is not None and turn.epoch == r.epoch
            statuses.append(
                AgentStatus(
                    agent=values.agent(r, depth.get(r.id, 0)),
                    open_questions=tuple(asked.get(r.id, ())),
                    questions_to_answer=tuple(to_answer.get(r.id, ())),
                    turn_id=turn.id if turn is not None and current else None,
                    lease_expires_at=turn.lease_expires_at
                    if turn is not None and current
                    else None,
                    last_error=failed.get(r.id),
                )
            )
        return statuses

    @faults.wrapped_read
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

    @faults.wrapped_read
    def cluster_figures(self) -> tuple[float, int, int]:
        """Over every team (metrics): the age in seconds of the oldest pending message (0 when
        none is pending), the open questions, and the outbox rows not yet published."""
        with self._sessions() as session:
            oldest = session.scalar(
                sa.select(sa.func.min(MessageRow.created_at)).where(
                    MessageRow.status == MessageStatus.PENDING
                )
            )
            questions = session.scalar(
                sa.select(sa.func.count()).where(QuestionRow.status == QuestionStatus.OPEN)
            )
            outbox = session.scalar(
                sa.select(sa.func.count()).where(OutboxRow.published_at.is_(None))
            )
        age = max(0.0, (utcnow() - oldest).total_seconds()) if oldest is not None else 0.0
        return age, int(questions or 0), int(outbox or 0)

    @faults.wrapped_read
    def open_question_report(self, team_id: int) -> list[tuple[Any, ...]]:
        """Each open question of the team with where its ask message went: question id, asker,
        target, waiting, and the message's status, outcome and target (diagnostics)."""
        with self._sessions() as session:
            rows = session.execute(
                sa.select(
                    QuestionRow.id,
                    QuestionRow.asker_agent_id,
                    QuestionRow.target_agent_id,
                    QuestionRow.waiting,
                    MessageRow.status,
                    MessageRow.outcome,
                    MessageRow.target_agent_id,
                )
                .join(MessageRow, MessageRow.question_id == QuestionRow.id, isouter=True)
                .where(QuestionRow.team_id == team_id, QuestionRow.status == QuestionStatus.OPEN)
            ).all()
            return [tuple(r) for r in rows]

    @faults.wrapped_read
    def open_questions(self, team_id: int) -> list[Question]:
        """The team's open questions (and waits for an output), by id."""
        return self._by_id(
            values.question,
            QuestionRow,
            sa.and_(QuestionRow.team_id == team_id, QuestionRow.status == QuestionStatus.OPEN),
        )

    @faults.wrapped_read
    def question_statuses(self, team_id: int) -> list[QuestionStatus]:
        return self._each(
            QuestionStatus, sa.select(QuestionRow.status).where(QuestionRow.team_id == team_id)
        )

    @faults.wrapped_read
    def turn_leases(self, team_id: int) -> dict[int, datetime | None]:
        """Each turn of the team by id, with its lease's end."""
        with self._sessions() as session:
            rows = session.execute(
                sa.select(TurnRow.id, TurnRow.lease_expires_at).where(TurnRow.team_id == team_id)
            ).all()
            return {turn_id: lease for turn_id, lease in rows}

    @faults.wrapped_read
    def team_window(self, team_id: int, query: timeline.TimelineQuery) -> timeline.TimelineWindow:
        """A window of the team's history, as the swimlane draws it (see
        :mod:`agent_router.store.timeline`), from one snapshot."""
        return self._read(timeline.window, team_id, query, statuses=self._statuses)

    @faults.wrapped_read
    def turn_events(self, team_id: int, turn_id: int) -> tuple[TurnRecord, list[LedgerEvent]]:
        """A turn of the team, with the ledger events of its time (its claim to its end)."""
        with self._sessions() as session:
            turn = session.get(TurnRow, turn_id)
            if turn is None or turn.team_id != team_id:
                raise errors.UnknownTurnError(f"no turn {turn_id} in team {team_id}")
            during = [LedgerRow.created_at >= turn.started_at - timeline.SLACK]
            if turn.ended_at is not None:
                during.append(LedgerRow.created_at <= turn.ended_at + timeline.SLACK)
            events = _ledger_events(
                session, LedgerRow.team_id == team_id, *during, LedgerRow.turn_id == turn_id
            )
            return values.turn(turn), events

    @faults.wrapped_read
    def routed_message(self, team_id: int, message_id: int) -> tuple[Message, list[LedgerEvent]]:
        """A message of the team, with the ledger event that routed it."""
        with self._sessions() as session:
            row = session.get(MessageRow, message_id)
            if row is None or row.team_id != team_id:
                raise errors.UnknownMessageError(f"no message {message_id} in team {team_id}")
            target = session.get(AgentRow, row.target_agent_id)
            assert target is not None
            events = _ledger_events(
                session,
                LedgerRow.team_id == team_id,
                LedgerRow.created_at.between(
                    row.created_at - timeline.SLACK, row.created_at + timeline.SLACK
                ),
                LedgerRow.message_id == message_id,
            )
            return values.message(row, target.display_name), events

    @faults.wrapped_read
    def team_summaries(self, *, offset: int, limit: int) -> tuple[int, list[timeline.TeamSummary]]:
        """A page of the teams by id: how many teams there are, and each team's agents by state
        and its latest event's time."""
        return self._read(timeline.teams, offset=offset, limit=limit)

    @faults.wrapped_read
    def latest_event(self, team_id: int) -> int:
        """The id of the team's latest event (0: none yet)."""
        return self._read(timeline.latest_event, team_id)

    @faults.wrapped_read
    def activity(self, team_id: int, buckets: int) -> timeline.Activity:
        """The team's whole history counted by time bucket (the timeline's overview)."""
        return self._read(timeline.activity, team_id, buckets)

    @faults.wrapped_read
    def idle_connections(self) -> int:
        """Connections checked in to the engine's pool."""
        return int(self._engine.pool.checkedin())  # type: ignore[attr-defined]

    @contextmanager
    def statements(self) -> Iterator[list[str]]:
        """The statements the store sends to the database meanwhile, as the driver gets them,
        in order (what the bench counts)."""
        sent: list[str] = []

        def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            sent.append(statement)

        sa.event.listen(self._engine, "before_cursor_execute", record)
        try:
            yield sent
        finally:
            sa.event.remove(self._engine, "before_cursor_execute", record)


def _row(session: Session, row: type[R], key: int, missing: errors.AgentRouterError) -> R:
    """The row of ``row``'s table with the primary key ``key``; ``missing`` when there is none."""
    found = session.get(row, key)
    if found is None:
        raise missing
    return found


_WAIT_STATE = (
    sa.select(
        QuestionRow.waiting,
        QuestionRow.deadline,
        sa.or_(
            AgentRow.state == AgentState.RUNNING,
            sa.and_(AgentRow.state == AgentState.WAITING, sa.not_(AgentRow.suspended)),
        ).label("target_at_work"),
    )
    .join(AgentRow, AgentRow.id == QuestionRow.target_agent_id)
    .where(QuestionRow.id == sa.bindparam("b_question"))
)


def _question(session: Session, question_id: int) -> QuestionRow:
    missing = errors.UnknownQuestionError(f"no question {question_id}")
    return _row(session, QuestionRow, question_id, missing)


def _ledger_events(session: Session, *where: sa.ColumnElement[bool]) -> list[LedgerEvent]:
    """The ledger events matching ``where`` in order, each with its agent's name."""
    rows = session.execute(
        sa.select(LedgerRow, AgentRow.display_name)
        .outerjoin(AgentRow, AgentRow.id == LedgerRow.agent_id)
        .where(*where)
        .order_by(LedgerRow.id)
    ).all()
    return [values.ledger_event(r, name) for r, name in rows]
