"""The store on SQLite: each transition runs, over SQLAlchemy, the Python module that holds its
branches (``routing``, ``turns``, ``waits``, ``users``, ``agents``, ``budgets``, ``jobs``,
``recovery``, ``quarantine``, ``lifecycle``), in one transaction
(:meth:`SqliteStore._tx`) that takes the database's write lock up front
(``BEGIN IMMEDIATE``).

:class:`SqliteStore` is the sibling of :class:`~agent_router.store.postgres.PostgresStore`: each
defines every transition :class:`~agent_router.store.store.Store` declares, whose docstrings
are the contract.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

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
    TurnRecord,
    UserMessage,
    UserMessageKind,
)
from agent_router.store import (
    agents,
    budgets,
    faults,
    jobs,
    lifecycle,
    quarantine,
    recovery,
    routing,
    rules,
    turns,
    users,
    waits,
)
from agent_router.store.models import OutboxRow, utcnow
from agent_router.store.store import Store
from agent_router.store.tx import Refused, Tx, write_ledger_buffer
from agent_router.store.values import (
    AfterCall,
    Ask,
    BeforeCall,
    CallUsage,
    Claim,
    Deletion,
    FirstCall,
    NewAgent,
    Result,
    Scheduled,
    SendRequest,
    Since,
)

# Marking outbox rows published follows every send that enqueues a turn or wakes a waiter:
# built once.
_MARK_PUBLISHED = (
    sa.update(OutboxRow)
    .where(
        OutboxRow.id.in_(sa.bindparam("b_ids", expanding=True)), OutboxRow.published_at.is_(None)
    )
    .values(published_at=sa.bindparam("b_now"), attempts=OutboxRow.attempts + 1)
)


class SqliteStore(Store):
    """The store whose transitions run as Python over SQLAlchemy (SQLite)."""

    @contextmanager
    def _tx(self) -> Iterator[Tx]:
        """A transaction of SQLAlchemy sessions (:class:`Tx`) for the Python transitions: the
        modules ``routing``, ``turns``, ... run in it. A :class:`Refused` transition is rolled
        back and its ledger event written in a transaction of its own; once it committed, the
        outbox rows it wrote go to the after-commit path."""
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
        with self._tx() as tx:
            team = agents.create_team(tx, lead, model, user_task)
            budgets.create(tx, team.id, budget)
            return team

    @faults.retrying
    def create_agent(
        self, team_id: int, new: NewAgent, *, task: SendRequest | None = None
    ) -> tuple[Agent, Delivery | None]:
        new = replace(new, role=rules.check_role(new.role))
        if new.display_name is not None:
            rules.check_display_name(new.display_name)
        try:
            with self._tx() as tx:
                return agents.create_agent(tx, team_id, new, task)
        except IntegrityError as exc:  # pragma: no cover - the team lock makes this unreachable
            raise errors.DuplicateDisplayNameError(str(exc.orig)) from exc

    @faults.retrying
    def terminate(self, agent_id: int, *, reason: str) -> None:
        with self._tx() as tx:
            agents.terminate(tx, agent_id, reason=reason)

    @faults.retrying
    def request_stop(self, agent_id: int, *, reason: str) -> AgentState:
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
        with self._tx() as tx:
            return routing.route(tx, req)

    @faults.retrying
    def interrupt(self, req: SendRequest) -> Delivery:
        with self._tx() as tx:
            return agents.interrupt(tx, req)

    @faults.retrying
    def send_many(self, reqs: Sequence[SendRequest]) -> list[Delivery]:
        with self._tx() as tx:
            return routing.send_many(tx, reqs)

    @faults.retrying
    def record_refusal(self, team_id: int | None, reason: str, **detail: Any) -> None:
        self._write_ledger(
            LedgerAction.SEND_REJECTED,
            team_id=team_id,
            outcome=RouteOutcome.REJECTED,
            reason=reason,
            **detail,
        )

    # ------------------------------------------------------------------ turns

    @faults.retrying
    def claim(
        self,
        agent_id: int,
        epoch: int | None = None,
        *,
        builtin: bool = False,
        first: FirstCall | None = None,
    ) -> Claim | None:
        with self._tx() as tx:
            return turns.claim(tx, agent_id, epoch, builtin=builtin, first=first)

    @faults.retrying
    def drain(self, turn: TurnRecord, *, limit: int | None = None) -> list[Message]:
        with self._tx() as tx:
            return turns.drain(tx, turn, limit=limit)

    @faults.retrying
    def append_assistant(self, turn: TurnRecord, message: dict[str, Any]) -> None:
        payload = rules.validate_assistant(message)
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
        if not isinstance(content, str):
            raise errors.InvalidTranscriptEntryError("a tool result's content must be a string")
        with self._tx() as tx:
            turns.append_tool_result(tx, turn, tool_call_id, content, meta=meta)

    @faults.retrying
    def before_call(
        self, turn: TurnRecord, *, results: Sequence[Result] = (), since: Since | None = None
    ) -> BeforeCall:
        with self._tx() as tx:
            return turns.before_call(tx, turn, results=results, since=since)

    @faults.retrying
    def after_call(
        self, turn: TurnRecord, message: dict[str, Any], *, usage: CallUsage | None
    ) -> AfterCall:
        payload = rules.validate_assistant(message)
        with self._tx() as tx:
            return turns.after_call(tx, turn, payload, usage=usage)

    @faults.retrying
    def end(
        self,
        turn: TurnRecord,
        *,
        failed: bool = False,
        error: str | None = None,
        results: Sequence[Result] = (),
        answers: Sequence[tuple[str, str]] = (),
        reports: Sequence[SendRequest] = (),
    ) -> EndOfTurn:
        with self._tx() as tx:
            if answers or reports:
                turns.fenced(tx, turn, "end")
            for content, key in answers:
                users.tell_user(tx, turn, UserMessageKind.ANSWER, content, dedup_key=key)
            deliveries = routing.send_many(tx, reports)
            ended = turns.end(tx, turn, failed=failed, error=error, results=results)
            return replace(ended, deliveries=tuple(deliveries))

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
        with self._tx() as tx:
            return users.ask_user(
                tx, turn, question, tool_call_id=tool_call_id, timeout_seconds=timeout_seconds
            )

    @faults.retrying
    def expire_questions(self, *, question_id: int | None = None) -> int:
        with self._tx() as tx:
            return waits.expire_questions(tx, question_id=question_id)

    @faults.retrying
    def remind_user(self) -> int:
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
        with self._sessions() as session:
            turn_id = recovery.expired_turn(session, agent_id)
        if turn_id is None:
            return None
        try:
            return self.take_over(
                agent_id, reason="lease expired", expected_turn_id=turn_id, lease_check=True
            )
        except errors.TurnError:
            return None

    @faults.retrying
    def reenqueue(self, agent: Scheduled, *, windows: int) -> bool:
        with self._tx() as tx:
            return recovery.reenqueue(tx, agent, windows=windows)

    @faults.retrying
    def record_sweep_failure(
        self, agent_id: int, step: SweepStep, error: str, *, period_seconds: float
    ) -> Quarantine | None:
        with self._tx() as tx:
            return quarantine.record_failure(
                tx, agent_id, step, error, period_seconds=period_seconds
            )

    @faults.retrying
    def lift_quarantine(self, agent_id: int, *, reason: str) -> bool:
        with self._tx() as tx:
            return quarantine.lift(tx, agent_id, reason=reason)

    @faults.retrying
    def lift_settled_quarantines(self, *, keep: set[int]) -> list[int]:
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
        if not ids:
            return
        with self._tx() as tx:  # SQLite writes under BEGIN IMMEDIATE (make_engine)
            tx.session.execute(_MARK_PUBLISHED, {"b_ids": list(ids), "b_now": utcnow()})

    # ------------------------------------------------------------------ budgets and usage

    @faults.retrying
    def charge_model_call(self, team_id: int, agent_id: int, turn_id: int) -> BudgetCheck:
        with self._tx() as tx:
            return budgets.charge_model_call(tx, team_id, agent_id, turn_id)

    @faults.retrying
    def record_usage(
        self,
        team_id: int,
        agent_id: int,
        turn_id: int | None,
        usage: CallUsage,
        *,
        agent: str | None = None,
    ) -> BudgetCheck:
        with self._tx() as tx:
            return budgets.record_usage(tx, team_id, agent_id, turn_id, usage, agent=agent)

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
    ) -> Deletion:
        with self._tx() as tx:  # a dry run only reads (and locks) what it counts
            return lifecycle.delete_team(
                tx, team_id, dry_run=dry_run, include_undelivered=include_undelivered
            )

    @faults.retrying
    def prune_ledger(
        self, *, older_than_seconds: float, dry_run: bool = False, batches: int | None = None
    ) -> int:
        before = utcnow() - timedelta(seconds=older_than_seconds)
        return lifecycle.prune_ledger_batches(
            self._tx, before=before, dry_run=dry_run, batches=batches
        )

    @faults.retrying
    def prune(
        self, *, older_than_seconds: float, dry_run: bool = False, include_undelivered: bool = False
    ) -> Deletion:
        before = utcnow() - timedelta(seconds=older_than_seconds)
        return lifecycle.prune(
            self._tx, before=before, dry_run=dry_run, include_undelivered=include_undelivered
        )


__all__ = ["SqliteStore"]
