"""The store: the only way to the database.

Every public write is one transition: one transaction (a :class:`Tx`), guarded by the target
agent's row lock (PostgreSQL ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE``, which takes
the database's write lock up front), and one or more ledger events. Locks are taken in one
canonical order: the team row, then agent rows by ascending id. Side effects (enqueue a turn,
wake a waiter) are written as outbox rows in the same transaction and handed, after commit, to
the publisher the router installs (:meth:`Store.set_publisher`). Read views are on
:attr:`Store.reads`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from agent_router import errors
from agent_router.domain import (
    Agent,
    AgentState,
    BackgroundJob,
    Budget,
    BudgetCheck,
    BudgetName,
    Delivery,
    EndOfTurn,
    LedgerAction,
    Message,
    OutboxEntry,
    Quarantine,
    Question,
    RouteOutcome,
    SweepStep,
    Team,
    TokenUsage,
    TurnRecord,
    TurnStatus,
    UserMessage,
    UserMessageKind,
)
from agent_router.settings import Settings
from agent_router.store import (
    agents,
    budgets,
    faults,
    functions,
    jobs,
    lifecycle,
    quarantine,
    recovery,
    routing,
    turns,
    users,
    waits,
)
from agent_router.store.engine import make_engine
from agent_router.store.models import AgentRow, Base, OutboxRow, TurnRow, utcnow
from agent_router.store.reads import Reads
from agent_router.store.transcripts import TranscriptCache
from agent_router.store.tx import Refused, Tx, drop_ledger_buffer, write_ledger_buffer
from agent_router.store.values import (
    AfterCall,
    Ask,
    BeforeCall,
    CallUsage,
    Claim,
    FirstCall,
    NewAgent,
    Result,
    SendRequest,
    Since,
)

#: Called after a commit with the outbox entries the transaction wrote.
AfterCommit = Callable[[list[OutboxEntry]], object]


# Marking outbox rows published follows every send that enqueues a turn or wakes a waiter:
# built once.
_MARK_PUBLISHED = (
    sa.update(OutboxRow)
    .where(
        OutboxRow.id.in_(sa.bindparam("b_ids", expanding=True)), OutboxRow.published_at.is_(None)
    )
    .values(published_at=sa.bindparam("b_now"), attempts=OutboxRow.attempts + 1)
)


@faults.boundary
class Store:
    """The store's public surface: every method raises only the library's errors
    (:func:`faults.boundary`), a subclass's (:class:`PostgresStore`'s) too."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        faults.boundary(cls)

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or make_engine(settings)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        event.listen(self._sessions, "before_commit", write_ledger_buffer)
        event.listen(self._sessions, "after_transaction_end", drop_ledger_buffer)
        self.reads = Reads(self._sessions, self.engine)
        # What turns in this process read of transcripts: a model call reads what is new.
        self.transcripts = TranscriptCache(
            settings.transcript_cache_agents,
            settings.transcript_cache_entries,
            settings.transcript_cache_bytes,
        )
        self._after_commit: AfterCommit | None = None

    # ------------------------------------------------------------------ plumbing

    def set_publisher(self, after_commit: AfterCommit | None) -> None:
        """Install the one after-commit path: every transaction that wrote outbox rows hands
        them to ``after_commit`` once it committed. Without one, the rows stay unpublished
        for a later re-publish."""
        self._after_commit = after_commit

    def create_schema(self) -> None:
        """The tables (and on PostgreSQL the store's functions), created directly."""
        Base.metadata.create_all(self.engine)
        if not self.settings.is_sqlite:
            with self.engine.begin() as conn:
                # Room in each page of ar_agents for the new versions of its rows: every send
                # and append bumps a counter (next_seq, next_position), no indexed column, so
                # the update is HOT as long as the page has room (models.AGENTS_FILLFACTOR; set
                # here, as migration 0010 sets it, for the table options SQLAlchemy 2.0 lacks).
                conn.execute(sa.text("ALTER TABLE ar_agents SET (fillfactor = 50)"))
                functions.install(conn)

    def dispose(self, *, close: bool = True) -> None:
        """Drop the connection pool; ``close=False`` in a forked child leaves the parent's
        connections alone."""
        self.engine.dispose(close=close)

    @contextmanager
    def _tx(self) -> Iterator[Tx]:
        tx = Tx(self._sessions(), self.settings)
        committing = False
        try:
            with tx.session.begin():
                yield tx
                # Everything but the COMMIT itself is sent first: a connection lost from here
                # on leaves the outcome unknown, one lost before it left nothing written.
                write_ledger_buffer(tx.session)
                tx.session.flush()
                committing = True
        except Refused as refused:
            tx.session.close()
            self._write_ledger(refused.action, **refused.ledger)
            raise refused.error from None
        except errors.AgentRouterError:
            raise
        except SQLAlchemyError as exc:
            raise faults.store_error(exc, committing=committing) from exc
        finally:
            tx.session.close()
        self._published(tx.entries)

    def _published(self, entries: list[OutboxEntry]) -> None:
        """Hand the outbox rows a committed transaction wrote to the after-commit path."""
        if entries and self._after_commit is not None:
            self._after_commit(entries)

    @faults.retrying
    def _write_ledger(self, action: LedgerAction, **fields: Any) -> None:
        with self._sessions() as session, session.begin():
            tx = Tx(session, self.settings)
            if action is LedgerAction.SEND_REJECTED and lifecycle.aggregate_refusal(tx, fields):
                return
            tx.ledger(action, **fields)

    # ------------------------------------------------------------------ teams and agents

    @faults.retrying
    def create_team(
        self,
        lead: NewAgent,
        *,
        budget: Mapping[BudgetName, float | None] | None = None,
        model: str | None = None,
        user_task: str | None = None,
    ) -> Team:
        """A team, its ``lead`` and its budget row (the defaults, ``budget`` overriding some);
        its agents run on ``model`` when it is given; ``user_task`` receives its messages to
        the user."""
        with self._tx() as tx:
            team = agents.create_team(tx, lead, model, user_task)
            budgets.create(tx, team.id, budget)
            return team

    @faults.retrying
    def create_agent(
        self, team_id: int, new: NewAgent, *, task: SendRequest | None = None
    ) -> tuple[Agent, Delivery | None]:
        """Add a sub-agent and, when ``task`` is given, route that message to it in the same
        transaction: both exist, or neither."""
        new = replace(new, role=agents.check_role(new.role))
        if new.display_name is not None:
            routing.check_display_name(new.display_name)
        try:
            with self._tx() as tx:
                return agents.create_agent(tx, team_id, new, task)
        except IntegrityError as exc:  # pragma: no cover - the team lock makes this unreachable
            raise errors.DuplicateDisplayNameError(str(exc.orig)) from exc

    @faults.retrying
    def terminate(self, agent_id: int, *, reason: str) -> None:
        """Final: fence any running turn, drop pending messages with ``reason``, cancel the
        questions it asked, and release agents blocked on a question to it."""
        with self._tx() as tx:
            agents.terminate(tx, agent_id, reason=reason)

    @faults.retrying
    def request_stop(self, agent_id: int, *, reason: str) -> AgentState:
        """Stop a sub-agent cooperatively; the state after the request."""
        with self._tx() as tx:
            return agents.request_stop(tx, agent_id, reason=reason)

    @faults.retrying
    def seed_mailbox(
        self, agent_id: int, count: int, *, content: str, sender: str = "system"
    ) -> None:
        with self._tx() as tx:
            agents.seed_mailbox(tx, agent_id, count, content=content, sender=sender)

    # ------------------------------------------------------------------ routing

    @faults.retrying
    def send(self, req: SendRequest) -> Delivery:
        """Accept one message and deliver it by the receiver's state."""
        with self._tx() as tx:
            return routing.route(tx, req)

    @faults.retrying
    def interrupt(self, req: SendRequest) -> Delivery:
        """The user's message to the lead; a running turn of the lead stops at its next
        boundary and one new turn starts for the message."""
        with self._tx() as tx:
            return routing.interrupt(tx, req)

    @faults.retrying
    def send_many(self, reqs: Sequence[SendRequest]) -> list[Delivery]:
        """Route several messages of one team in one transaction: all of them, or none (the
        first refusal is raised and only it is ledgered)."""
        with self._tx() as tx:
            return routing.send_many(tx, reqs)

    @faults.retrying
    def record_refusal(self, team_id: int | None, reason: str, **detail: Any) -> None:
        """Ledger a send refused before it reached the store (malformed input)."""
        self._write_ledger(
            LedgerAction.SEND_REJECTED,
            team_id=team_id,
            outcome=RouteOutcome.REJECTED,
            reason=reason,
            **detail,
        )

    # ------------------------------------------------------------------ turns

    @faults.retrying
    def claim_turn(
        self,
        agent_id: int,
        epoch: int | None = None,
        *,
        builtin: bool = False,
        first: FirstCall | None = None,
    ) -> Claim | None:
        """Claim a turn (:func:`turns.claim_turn`); ``builtin``: for the built-in loop, which
        claims no turn of an agent a host's task runs (``HostOwnedTurnError``); ``first``: the
        transition before its first model call made too (:class:`FirstCall`)."""
        with self._tx() as tx:
            return turns.claim_turn(tx, agent_id, epoch, builtin=builtin, first=first)

    @faults.retrying
    def drain(self, turn: TurnRecord, *, limit: int | None = None) -> list[Message]:
        with self._tx() as tx:
            return turns.drain(tx, turn, limit=limit)

    @faults.retrying
    def append_assistant(self, turn: TurnRecord, message: dict[str, Any]) -> None:
        """Append the model's reply (:func:`turns.append_assistant`)."""
        payload = turns.validate_assistant(message)
        with self._tx() as tx:
            turns.append_assistant(tx, turn, payload)

    @faults.retrying
    def append_tool_result(
        self,
        turn: TurnRecord,
        tool_call_id: str,
        content: str,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Append the result of an open tool call (:func:`turns.append_tool_result`);
        ``meta``: how the call ran (:class:`~agent_router.domain.ToolRun`), kept with it."""
        if not isinstance(content, str):
            raise errors.InvalidTranscriptEntryError("a tool result's content must be a string")
        with self._tx() as tx:
            turns.append_tool_result(tx, turn, tool_call_id, content, meta=meta)

    @faults.retrying
    def before_call(
        self, turn: TurnRecord, *, results: Sequence[Result] = (), since: Since | None = None
    ) -> BeforeCall:
        """What a turn does before a model call (:func:`turns.before_call`)."""
        with self._tx() as tx:
            return turns.before_call(tx, turn, results=results, since=since)

    @faults.retrying
    def after_call(
        self, turn: TurnRecord, message: dict[str, Any], *, usage: CallUsage | None
    ) -> AfterCall:
        """What a turn does after a model call (:func:`turns.after_call`)."""
        payload = turns.validate_assistant(message)
        with self._tx() as tx:
            return turns.after_call(tx, turn, payload, usage=usage)

    @faults.retrying
    def end_turn(
        self,
        turn: TurnRecord,
        *,
        failed: bool = False,
        error: str | None = None,
        results: Sequence[Result] = (),
        answers: Sequence[tuple[str, str]] = (),
        reports: Sequence[SendRequest] = (),
    ) -> EndOfTurn:
        """End the turn (:func:`turns.end_turn`), its final output written first in the same
        transaction: ``answers`` (content and dedup key of each part) to the user as
        :func:`users.tell_user` writes them, or ``reports`` to the lead as
        :func:`routing.send_many` routes them. A refused output refuses the end."""
        with self._tx() as tx:
            if answers or reports:
                turns.fenced(tx, turn, "end")
            for content, key in answers:
                users.tell_user(tx, turn, UserMessageKind.ANSWER, content, dedup_key=key)
            deliveries = routing.send_many(tx, reports)
            end = turns.end_turn(tx, turn, failed=failed, error=error, results=results)
            return replace(end, deliveries=tuple(deliveries))

    @faults.retrying
    def renew_lease(self, turn: TurnRecord) -> bool:
        with self._tx() as tx:
            return turns.renew_lease(tx, turn)

    @faults.retrying
    def suspend(self, turn: TurnRecord) -> bool:
        with self._tx() as tx:
            return turns.suspend(tx, turn)

    @faults.retrying
    def finish_stop(self, turn: TurnRecord, *, reason: str | None = None) -> None:
        with self._tx() as tx:
            turns.finish_stop(tx, turn, reason=reason)

    # ------------------------------------------------------------------ waits

    @faults.retrying
    def ask(self, turn: TurnRecord, asked: Ask) -> tuple[Question, Delivery]:
        with self._tx() as tx:
            return waits.ask(tx, turn, asked)

    @faults.retrying
    def wait_output(
        self,
        turn: TurnRecord,
        *,
        target: str,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> Question:
        with self._tx() as tx:
            return waits.wait_output(
                tx, turn, target=target, tool_call_id=tool_call_id, timeout_seconds=timeout_seconds
            )

    # ------------------------------------------------------------------ the user

    @faults.retrying
    def tell_user(
        self,
        turn: TurnRecord,
        kind: UserMessageKind,
        content: str,
        *,
        dedup_key: str | None = None,
    ) -> tuple[UserMessage, bool]:
        """A message to the user from the turn's agent (:func:`users.tell_user`)."""
        with self._tx() as tx:
            return users.tell_user(tx, turn, kind, content, dedup_key=dedup_key)

    @faults.retrying
    def ask_user(
        self,
        turn: TurnRecord,
        question: str,
        *,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> tuple[Question, UserMessage]:
        """Ask the user and suspend the turn (:func:`users.ask_user`)."""
        with self._tx() as tx:
            return users.ask_user(
                tx, turn, question, tool_call_id=tool_call_id, timeout_seconds=timeout_seconds
            )

    @faults.retrying
    def expire_questions(self, *, question_id: int | None = None) -> int:
        """Expire open questions past their deadline; how many were expired."""
        with self._tx() as tx:
            return waits.expire_questions(tx, question_id=question_id)

    @faults.retrying
    def remind_user(self) -> int:
        """Send the user once more each question to the user open at half its time; how many."""
        with self._tx() as tx:
            return users.remind_user(tx)

    # ------------------------------------------------------------------ recovery

    @faults.retrying
    def take_over(
        self,
        agent_id: int,
        *,
        reason: str,
        expected_turn_id: int | None = None,
        lease_check: bool = False,
    ) -> int:
        """Fence a running agent whose turn is presumed dead; the new epoch."""
        with self._tx() as tx:
            return recovery.take_over(
                tx,
                agent_id,
                reason=reason,
                expected_turn_id=expected_turn_id,
                lease_check=lease_check,
            )

    @faults.retrying
    def take_over_expired(self, agent_id: int) -> int | None:
        """:meth:`take_over`, but only if the lease is still expired under the lock (a heartbeat
        may have renewed it since it was listed); the new epoch, or ``None``."""
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
                return None
        try:
            return self.take_over(
                agent_id, reason="lease expired", expected_turn_id=turn.id, lease_check=True
            )
        except errors.TurnError:
            return None

    @faults.retrying
    def reenqueue(self, agent: recovery.Scheduled, *, windows: int) -> bool:
        """Enqueue again the turn task of an agent found lost (:func:`recovery.reenqueue`)."""
        with self._tx() as tx:
            return recovery.reenqueue(tx, agent, windows=windows)

    @faults.retrying
    def record_sweep_failure(
        self, agent_id: int, step: SweepStep, error: str, *, period_seconds: float
    ) -> Quarantine | None:
        """A sweeper repair failed for the agent (:func:`quarantine.record_failure`)."""
        with self._tx() as tx:
            return quarantine.record_failure(
                tx, agent_id, step, error, period_seconds=period_seconds
            )

    @faults.retrying
    def lift_quarantine(self, agent_id: int, *, reason: str) -> bool:
        """A repair succeeded for the agent: its failures are behind it."""
        with self._tx() as tx:
            return quarantine.lift(tx, agent_id, reason=reason)

    @faults.retrying
    def lift_settled_quarantines(self, *, keep: set[int]) -> list[int]:
        """Lift the agents no repair needs any more (:func:`quarantine.settled`)."""
        with self._tx() as tx:
            return quarantine.settled(tx, keep=keep)

    @faults.retrying
    def claim_unpublished(
        self, *, older_than_seconds: float = 0.0, limit: int = 500
    ) -> list[OutboxEntry]:
        with self._tx() as tx:
            return recovery.claim_unpublished(
                tx, older_than_seconds=older_than_seconds, limit=limit
            )

    def mark_published(self, ids: Sequence[int]) -> None:
        """Mark outbox rows published, after their publish."""
        if not ids:
            return
        with self._tx() as tx:  # SQLite writes under BEGIN IMMEDIATE (make_engine)
            tx.session.execute(_MARK_PUBLISHED, {"b_ids": list(ids), "b_now": utcnow()})

    # ------------------------------------------------------------------ budgets and usage

    @faults.retrying
    def charge(self, team_id: int, agent_id: int, turn_id: int) -> BudgetCheck:
        """Count a model call against the team's budgets; refused (nothing counted) when one is
        spent. (A turn is counted by its claim.)"""
        with self._tx() as tx:
            return budgets.charge_model_call(tx, team_id, agent_id, turn_id)

    @faults.retrying
    def record_usage(
        self,
        team_id: int,
        agent_id: int,
        turn_id: int | None,
        *,
        model: str | None,
        usage: TokenUsage,
        estimated: bool,
        agent: str | None = None,
        context: Mapping[str, Any] | None = None,
        window: Mapping[str, Any] | None = None,
        ms: int | None = None,
    ) -> BudgetCheck:
        """``agent``: the display name the ``model_call`` log line shows; ``context``: what
        the request left out, on the call where that changed (the event's ``context``);
        ``window``: where the agent's request window then stood (its ``context_window``);
        ``ms``: how long the call took (the event's ``ms``; it ended at the event's time)."""
        with self._tx() as tx:
            return budgets.record_usage(
                tx,
                team_id,
                agent_id,
                turn_id,
                model=model,
                usage=usage,
                estimated=estimated,
                agent=agent,
                context=context,
                window=window,
                ms=ms,
            )

    @faults.retrying
    def charge_sub_agent(self, team_id: int, role: str) -> None:
        with self._tx() as tx:
            budgets.charge_sub_agent(tx, team_id, role)

    @faults.retrying
    def set_limits(
        self, team_id: int, limits: Mapping[BudgetName, float | None], *, by: str
    ) -> Budget:
        with self._tx() as tx:
            return budgets.set_limits(tx, team_id, limits, by=by)

    @faults.retrying
    def budget(self, team_id: int) -> Budget:
        """A team's limits and usage (a locked read: the row is made if the team has none)."""
        with self._tx() as tx:
            return budgets.budget(tx, team_id)

    # ------------------------------------------------------------------ background jobs

    @faults.retrying
    def start_job(self, team_id: int, agent: str, *, name: str, task_id: str) -> BackgroundJob:
        with self._tx() as tx:
            return jobs.start_job(tx, team_id, agent, name=name, task_id=task_id)

    @faults.retrying
    def finish_job(
        self, job_id: int, *, ok: bool, result: str, batch_seconds: float = 0.0
    ) -> BackgroundJob:
        with self._tx() as tx:
            return jobs.finish_job(tx, job_id, ok=ok, result=result, batch_seconds=batch_seconds)

    # ------------------------------------------------------------------ lifecycle

    @faults.retrying
    def delete_team(
        self, team_id: int, *, dry_run: bool = False, include_undelivered: bool = False
    ) -> lifecycle.Deletion:
        """Delete a team and every row it owns (``dry_run``: count them, delete nothing); one
        that still owes rows is refused unless ``include_undelivered`` (then ledgered)."""
        with self._tx() as tx:  # a dry run only reads (and locks) what it counts
            return lifecycle.delete_team(
                tx, team_id, dry_run=dry_run, include_undelivered=include_undelivered
            )

    @faults.retrying
    def prune_ledger(
        self, *, older_than_seconds: float, dry_run: bool = False, batches: int | None = None
    ) -> int:
        """Retention of live teams' ledgers: delete routine ledger events
        (:data:`~agent_router.store.lifecycle.ROUTINE_LEDGER`) older than
        ``older_than_seconds``, a batch per transaction, at most ``batches`` of them (``None``:
        until none is left); how many."""
        before = utcnow() - timedelta(seconds=older_than_seconds)
        if dry_run:
            with self._tx() as tx:
                return lifecycle.prune_ledger(tx, before=before, limit=0, dry_run=True)
        deleted = 0
        done = 0
        while batches is None or done < batches:
            with self._tx() as tx:
                count = lifecycle.prune_ledger(
                    tx, before=before, limit=lifecycle.LEDGER_PRUNE_BATCH, dry_run=False
                )
            deleted += count
            done += 1
            if count < lifecycle.LEDGER_PRUNE_BATCH:
                break
        return deleted

    @faults.retrying
    def prune(
        self, *, older_than_seconds: float, dry_run: bool = False, include_undelivered: bool = False
    ) -> lifecycle.Deletion:
        """Retention: delete finished teams (nothing in flight, no activity within
        ``older_than_seconds``: no message, turn, model call or ledger event) that owe nothing
        (with ``include_undelivered``: those that do too, their drop ledgered) and published
        outbox rows older than that, in batches. A team that a send reaches while the prune
        runs is kept (in the result's ``kept``), never deleted nor a reason to fail."""
        before = utcnow() - timedelta(seconds=older_than_seconds)
        with self._tx() as tx:  # first, so that a dry run counts each row once
            published = lifecycle.prune_outbox(tx, before=before, dry_run=dry_run)
        teams: list[int] = []
        kept: list[int] = []
        rows: dict[str, int] = {}
        owed: dict[str, int] = {}
        questions: list[int] = []
        while True:
            with self._tx() as tx:
                batch, held = lifecycle.finished_teams(
                    tx,
                    before=before,
                    limit=lifecycle.PRUNE_BATCH,
                    after=max(teams + kept, default=0),
                    include_undelivered=include_undelivered,
                )
                deletion = lifecycle.delete_teams(
                    tx,
                    batch,
                    dry_run=dry_run,
                    outbox_pruned_before=before,
                    include_undelivered=include_undelivered,
                    by="prune",
                    idle_since=before,
                )
            teams += deletion.teams
            kept += held + list(deletion.kept)
            questions += deletion.questions
            for name, count in deletion.rows.items():
                rows[name] = rows.get(name, 0) + count
            for kind, count in deletion.owed.items():
                owed[kind] = owed.get(kind, 0) + count
            if len(batch) + len(held) < lifecycle.PRUNE_BATCH:
                break
        rows["ar_outbox"] = rows.get("ar_outbox", 0) + published
        return lifecycle.Deletion(
            teams=tuple(teams),
            rows=rows,
            questions=tuple(questions),
            dry_run=dry_run,
            owed=owed,
            kept=tuple(kept),
        )


__all__ = ["SendRequest", "Store", "make_engine", "utcnow"]
