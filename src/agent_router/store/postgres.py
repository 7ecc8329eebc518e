"""The store on PostgreSQL: every transition one call of its function (``postgresql/*.sql``).

:class:`PostgresStore` is the sibling of :class:`~agent_router.store.sqlite.SqliteStore` whose
transitions are the database's functions (their contract: :class:`~agent_router.store.store.Store`):
a call is one statement, its own transaction (autocommit), so each transition is one round trip in
every branch, and the function decides every branch. What a function decided comes back as one
JSON object: the transition's result, the ledger events it wrote (logged here, as the SQLite
implementation logs its own), the outbox rows to publish after the commit, or a refusal (the
error to raise; its event is written by the function). A retention that runs in batches
(``prune``, ``prune_ledger``) is one call per batch.

A connection lost while a call ran leaves it unknown whether it committed
(:class:`~agent_router.errors.CommitUnknownError`); one lost before it was sent is retried
(:func:`~agent_router.store.faults.retrying`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from agent_router import errors, formats, limits
from agent_router.domain import (
    Agent,
    AgentState,
    BackgroundJob,
    Budget,
    BudgetCheck,
    BudgetName,
    Delivery,
    EndOfTurn,
    JobStatus,
    LedgerAction,
    Message,
    MessageStatus,
    MessageSubtype,
    MessageType,
    OutboxEntry,
    OutboxKind,
    Quarantine,
    Question,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
    SweepStep,
    Team,
    TurnRecord,
    TurnStatus,
    TurnTrigger,
    UserMessage,
    UserMessageKind,
)
from agent_router.store import (
    faults,
    functions,
    lifecycle,
    quarantine,
    refusals,
    rules,
    values,
)
from agent_router.store.engine import closed_by_server
from agent_router.store.models import BudgetRow, utcnow
from agent_router.store.store import Store
from agent_router.store.tx import log_event, logging_events
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

#: The SQLSTATE of a call to a function the database does not have.
_UNDEFINED_FUNCTION = "42883"

#: The parameters of a model call's usage, in the statements that record it.
_USAGE_PARAMS = (
    "model",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_nano",
    "estimated",
    "priced",
    "context",
    "window",
    "ms",
)


class PostgresStore(Store):
    """The store whose transitions are PostgreSQL functions."""

    @contextmanager
    def _alone(self) -> Iterator[sa.Connection]:
        """A pooled connection in autocommit, for one call that is its own transaction. Driver
        errors leave as :class:`~agent_router.errors.StoreError`; one raised while the call
        ran is :class:`~agent_router.errors.CommitUnknownError` when the connection was lost."""
        try:
            connected = self.engine.connect()
        except SQLAlchemyError as exc:  # nothing was sent
            raise faults.store_error(exc, committing=False) from exc
        with connected as conn:
            # A last look, without a round trip: a connection that died after the pool's check
            # at checkout is found before anything is sent, and the call runs again on another.
            if closed_by_server(conn.connection.dbapi_connection):
                conn.invalidate()
                raise errors.StoreError(
                    "the server closed the connection before the statement", retryable=True
                )
            # Autocommit on the driver's connection itself, for this checkout only (a
            # transaction of store/tx.py gets the connection back as the pool keeps it):
            # cheaper than SQLAlchemy's isolation level option, which it set and reset at each
            # call.
            dbapi: Any = conn.connection.dbapi_connection
            dbapi.autocommit = True
            try:
                yield conn
            except SQLAlchemyError as exc:
                if faults.sqlstate(exc) == _UNDEFINED_FUNCTION and _functions_missing(conn):
                    raise errors.StoreError(
                        f"the database lacks this release's store functions "
                        f"({functions.version()}): run `agent-router db upgrade` "
                        "(Router.create_schema() in tests)"
                    ) from exc
                if faults.connection_lost(exc) and not conn.invalidated:
                    conn.invalidate()
                raise faults.store_error(exc, committing=True) from exc
            except BaseException:
                # Interrupted while the call ran (a signal's exception: a time limit, Ctrl-C):
                # the connection may be in the middle of its query. It is closed, never given
                # back to the pool (nor rolled back, which would fail in its place), and the
                # interruption reaches the caller; whether the call committed is unknown.
                conn.invalidate()
                raise
            finally:
                if not conn.invalidated:
                    try:
                        dbapi.autocommit = False
                    except psycopg.Error:  # a connection it cannot be reset on is not kept
                        conn.invalidate()

    def _call(self, query: str, /, *, _named: str | None = None, **params: Any) -> dict[str, Any]:
        """Run the named statement (one transition); its result, once the events it wrote are
        logged (with the agent's display name: the function's, else ``_named``) and the outbox
        rows it wrote handed to the publisher. A refusal raises its error."""
        faults.check_integers(params)
        with self._alone() as conn:
            statement = functions.driver_sql(query, conn.dialect)
            result: dict[str, Any] = (
                # A listener of the engine's events (a host's SQLAlchemy instrumentation, a
                # test's) sees the call as SQLAlchemy sends it, with its execution context.
                conn.exec_driver_sql(statement, params).scalar_one()
                if conn.engine._has_events
                else _run(conn, statement, params)
            )
        if logging_events():
            for event in result.get("events", ()):
                log_event(_event(event), agent=event.get("agent") or _named)
        refused = result.get("refused")
        if refused is not None:
            raise _error(refused)
        self._published([_entry(row) for row in result.get("outbox", ())])
        return result

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
        limits = rules.default_limits(self.settings) | dict(budget or {})
        result = self._call(
            "create_team",
            name=lead.display_name or lead.role,
            role=lead.role,
            system_prompt=lead.system_prompt,
            runner=lead.runner,
            limits=json.dumps(rules.stored_limits(limits)),
            model=model,
            user_task=user_task,
        )
        team = result["team"]
        return Team(
            id=team["id"],
            lead=_agent(result["lead"]),
            created_at=datetime.fromisoformat(team["created_at"]),
            model=team.get("model"),
            user_task=team.get("user_task"),
        )

    @faults.retrying
    def create_agent(
        self, team_id: int, new: NewAgent, *, task: SendRequest | None = None
    ) -> tuple[Agent, Delivery | None]:
        role = rules.check_role(new.role)
        if new.display_name is not None:
            rules.check_display_name(new.display_name)
        sent = None if task is None else {**_sent(task), **_sender(task)}
        result = self._call(
            "create_agent",
            team=team_id,
            role=role,
            name=new.display_name,
            system_prompt=new.system_prompt,
            runner=new.runner,
            task=None if sent is None else json.dumps(sent),
        )
        return _agent(result["agent"]), None if task is None else _delivery(result)

    @faults.retrying
    def terminate(self, agent_id: int, *, reason: str) -> None:
        self._call("terminate", agent=agent_id, reason=reason)

    @faults.retrying
    def request_stop(self, agent_id: int, *, reason: str) -> AgentState:
        return AgentState(self._call("request_stop", agent=agent_id, reason=reason)["state"])

    # ------------------------------------------------------------------ routing

    @faults.retrying
    def send(self, req: SendRequest) -> Delivery:
        return _delivery(self._call("send", **_sent(req), **_sender(req)))

    @faults.retrying
    def interrupt(self, req: SendRequest) -> Delivery:
        result = self._call(
            "interrupt", **_sent(req), **_sender(req), reason=rules.INTERRUPT_REASON
        )
        return _delivery(result)

    @faults.retrying
    def send_many(self, reqs: Sequence[SendRequest]) -> list[Delivery]:
        if len({req.team_id for req in reqs}) > 1:
            raise errors.InvalidMessageError("the messages of one send_many go to one team")
        if not reqs:
            return []
        messages = [_sent(req) for req in reqs]
        result = self._call("send_many", messages=json.dumps(messages), **_sender(reqs[0]))
        return [_delivery({"delivery": found}) for found in result["deliveries"]]

    @faults.retrying
    def record_refusal(self, team_id: int | None, reason: str, **detail: Any) -> None:
        event = {
            "action": LedgerAction.SEND_REJECTED.value,
            "team_id": team_id,
            "outcome": RouteOutcome.REJECTED.value,
            "detail": {"reason": reason, **detail},
        }
        self._call("record_refusal", event=json.dumps(event, default=str))

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
        kept = None if first is None else first.kept
        result = self._call(
            "claim",
            agent=agent_id,
            epoch=epoch,
            builtin=builtin,
            lease_seconds=self.settings.lease_seconds,
            first=first is not None,
            kept=kept is not None,
            after=None if kept is None else kept.position,
            limit=self.settings.drain_batch_size,
            stopped=rules.STOPPED_RESULT,
            **self._budget_params(),
        )
        claim = result["claim"]
        if claim is None:
            return None
        before = result.get("before")
        read = kept if kept is not None or claim["checkpoint"] is not None else Since(None)
        return Claim(
            _turn(claim["turn"]),
            claim["team_id"],
            claim["display_name"],
            _check(result["budget"]),
            _agent(claim["agent"]),
            claim["lead"],
            claim["checkpoint"],
            tuple(claim["open_calls"]),
            None if before is None else _before_call(before),
            None if before is None else read,
        )

    @faults.retrying
    def drain(self, turn: TurnRecord, *, limit: int | None = None) -> list[Message]:
        result = self._call("drain", **_of(turn), limit=limit or self.settings.drain_batch_size)
        return [_message(row, result["target"]) for row in result["messages"]]

    @faults.retrying
    def append_assistant(self, turn: TurnRecord, message: dict[str, Any]) -> None:
        payload = rules.validate_assistant(message)
        self._call("append", **_of(turn), payload=json.dumps(payload), call=None, meta=None)

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
        if not isinstance(tool_call_id, str):  # matches no open call
            tool_call_id = repr(tool_call_id)
        payload = {"role": "tool", "tool_call_id": tool_call_id, "content": content}
        self._call(
            "append",
            **_of(turn),
            payload=json.dumps(payload),
            call=tool_call_id,
            meta=None if meta is None else json.dumps(dict(meta)),
        )

    @faults.retrying
    def before_call(
        self, turn: TurnRecord, *, results: Sequence[Result] = (), since: Since | None = None
    ) -> BeforeCall:
        result = self._call(
            "before_call",
            **_of(turn),
            results=_results(results),
            read=since is not None,
            after=None if since is None else since.position,
            limit=self.settings.drain_batch_size,
            lease_seconds=self.settings.lease_seconds,
            stopped=rules.STOPPED_RESULT,
            **self._budget_params(),
        )
        return _before_call(result)

    @faults.retrying
    def after_call(
        self, turn: TurnRecord, message: dict[str, Any], *, usage: CallUsage | None
    ) -> AfterCall:
        payload = rules.validate_assistant(message)
        result = self._call(
            "after_call",
            **_of(turn),
            payload=json.dumps(payload),
            lease_seconds=self.settings.lease_seconds,
            stopped=rules.STOPPED_RESULT,
            **self._usage(usage),
            **self._budget_params(),
        )
        return AfterCall(
            stopped=bool(result.get("stopped")),
            budget=_check(result["budget"]) if "budget" in result else None,
            questions=[
                replace(_question(row), asker=row["asker"], target=row["target"])
                for row in result["questions"]
            ],
        )

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
        result = self._call(
            "end",
            **_of(turn),
            failed=failed,
            error=error,
            interrupted=rules.INTERRUPTED_RESULT,
            stopped=rules.STOPPED_RESULT,
            results=_results(results),
            answers=json.dumps([{"content": c, "dedup_key": k} for c, k in answers])
            if answers
            else None,
            reports=json.dumps([_sent(req) for req in reports]) if reports else None,
        )
        ended = result["ended"]
        return EndOfTurn(
            follow_up=ended["follow_up"],
            state=AgentState(ended["state"]),
            epoch=ended["epoch"],
            synthetic_results=ended["synthetic_results"],
            deliveries=tuple(_delivery({"delivery": d}) for d in result.get("deliveries", ())),
        )

    @faults.retrying
    def renew_lease(self, turn: TurnRecord) -> bool:
        params = {"turn": turn.id, "agent": turn.agent_id}
        with self._alone() as conn:
            renewed = conn.execute(
                functions.queries()["renew_lease"],
                {**params, "lease_seconds": self.settings.lease_seconds},
            ).first()
        return renewed is not None

    @faults.retrying
    def suspend(self, turn: TurnRecord) -> bool:
        return bool(self._call("suspend", **_of(turn))["suspended"])

    @faults.retrying
    def finish_stop(self, turn: TurnRecord, *, reason: str | None = None) -> None:
        self._call("finish_stop", **_of(turn), reason=reason, stopped=rules.STOPPED_RESULT)

    # ------------------------------------------------------------------ waits

    @faults.retrying
    def ask(self, turn: TurnRecord, asked: Ask) -> tuple[Question, Delivery]:
        result = self._call(
            "ask",
            **_of(turn),
            target=asked.target,
            content=asked.question,
            body=formats.stored_body(asked.question),
            call=asked.tool_call_id,
            subtype=asked.subtype.value,
            timeout=asked.timeout_seconds or self.settings.question_timeout_seconds,
        )
        return _question(result["question"]), _delivery(result)

    @faults.retrying
    def tell_user(
        self,
        turn: TurnRecord,
        kind: UserMessageKind,
        content: str,
        *,
        dedup_key: str | None = None,
    ) -> tuple[UserMessage, bool]:
        result = self._call(
            "tell_user", **_of(turn), kind=kind.value, content=content, dedup_key=dedup_key
        )
        return user_message(result["user_message"]), bool(result["duplicate"])

    @faults.retrying
    def ask_user(
        self,
        turn: TurnRecord,
        question: str,
        *,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> tuple[Question, UserMessage]:
        result = self._call(
            "ask_user",
            **_of(turn),
            content=question,
            call=tool_call_id,
            timeout=timeout_seconds or self.settings.question_timeout_seconds,
        )
        return _question(result["question"]), user_message(result["user_message"])

    @faults.retrying
    def wait_output(
        self,
        turn: TurnRecord,
        *,
        target: str,
        tool_call_id: str,
        timeout_seconds: float | None = None,
    ) -> Question:
        result = self._call(
            "wait_output",
            **_of(turn),
            target=target,
            call=tool_call_id,
            timeout=timeout_seconds or self.settings.question_timeout_seconds,
        )
        return _question(result["question"])

    def expire_questions(self, *, question_id: int | None = None) -> int:
        """Each overdue question expired in a transaction of its own: one that fails leaves
        the others expired."""
        with self._alone() as conn:
            overdue = (
                conn.execute(functions.queries()["overdue_questions"], {"question": question_id})
                .scalars()
                .all()
            )
        return sum(self._expire_question(question) for question in overdue)

    @faults.retrying
    def remind_user(self) -> int:
        return int(self._call("remind_user", prefix=rules.REMINDER_PREFIX)["reminded"])

    @faults.retrying
    def _expire_question(self, question_id: int) -> bool:
        result = self._call("expire_question", question=question_id, result=rules.EXPIRED_RESULT)
        return bool(result["expired"])

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
        result = self._call(
            "take_over",
            agent=agent_id,
            reason=reason,
            expected_turn=expected_turn_id,
            lease_check=lease_check,
            interrupted=rules.INTERRUPTED_RESULT,
        )
        return int(result["epoch"])

    def mark_published(self, ids: Sequence[int]) -> None:
        """Mark outbox rows published, after their publish: one statement in autocommit."""
        if not ids:
            return
        with self._alone() as conn:
            conn.execute(functions.queries()["mark_published"], {"ids": list(ids)})

    # ------------------------------------------------------------------ budgets and usage

    def _budget_params(self) -> dict[str, Any]:
        """What every budget check takes: the warning ratio, and the limits a team without a
        budget row gets (as stored)."""
        return {
            "ratio": self.settings.budget_warning_ratio,
            "defaults": json.dumps(rules.stored_limits(rules.default_limits(self.settings))),
        }

    @faults.retrying
    def charge_model_call(self, team_id: int, agent_id: int, turn_id: int) -> BudgetCheck:
        result = self._call(
            "charge_model_call", team=team_id, agent=agent_id, turn=turn_id, **self._budget_params()
        )
        return _check(result["budget"])

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
        result = self._call(
            "record_usage",
            _named=agent,
            team=team_id,
            agent=agent_id,
            turn=turn_id,
            **self._usage(usage),
            **self._budget_params(),
        )
        return _check(result["budget"])

    def _usage(self, usage: CallUsage | None) -> dict[str, Any]:
        """A model call's usage as the functions that record it take it (all ``None``: no
        usage to record)."""
        if usage is None:
            return dict.fromkeys(_USAGE_PARAMS)
        return {
            "model": usage.model,
            "prompt_tokens": usage.usage.prompt_tokens,
            "completion_tokens": usage.usage.completion_tokens,
            "cached_tokens": usage.usage.cached_tokens,
            "cost_nano": rules.call_cost_nano(usage.usage.cost_usd),
            "estimated": usage.estimated,
            "priced": rules.priced(self.settings, usage.model),
            "context": None if usage.context is None else json.dumps(dict(usage.context)),
            "window": None if usage.window is None else json.dumps(dict(usage.window)),
            "ms": None if usage.seconds is None else round(usage.seconds * 1000),
        }

    @faults.retrying
    def charge_sub_agent(self, team_id: int, role: str) -> None:
        self._call(
            "charge_sub_agent",
            team=team_id,
            role=role,
            defaults=self._budget_params()["defaults"],
        )

    @faults.retrying
    def set_limits(
        self, team_id: int, limits: Mapping[BudgetName, float | None], *, by: str
    ) -> Budget:
        result = self._call(
            "set_limits",
            team=team_id,
            limits=json.dumps(rules.stored_limits(limits)),
            given=json.dumps({name.value: value for name, value in limits.items()}),
            by=by,
            defaults=self._budget_params()["defaults"],
        )
        return _budget(result)

    @faults.retrying
    def budget(self, team_id: int) -> Budget:
        return _budget(
            self._call("budget", team=team_id, defaults=self._budget_params()["defaults"])
        )

    # ------------------------------------------------------------------ background jobs

    @faults.retrying
    def start_job(self, team_id: int, agent: str, *, name: str, task_id: str) -> BackgroundJob:
        result = self._call("start_job", team=team_id, agent=agent, name=name, task=task_id)
        return _job(result["job"])

    @faults.retrying
    def finish_job(
        self, job_id: int, *, ok: bool, result: str, batch_seconds: float = 0.0
    ) -> BackgroundJob:
        found = self._call(
            "finish_job",
            job=job_id,
            ok=ok,
            result=result,
            result_body=formats.stored_body(result),
            batch_seconds=batch_seconds,
            max_windows=rules.JOB_BATCH_MAX_WINDOWS,
        )
        return _job(found["job"])

    # ------------------------------------------------------------------ sweeper and lifecycle
    # The sweeper's repairs (postgresql/recovery.sql) and the storage lifecycle
    # (postgresql/lifecycle.sql): each a call of its function, one round trip.

    @faults.retrying
    def seed_mailbox(
        self, agent_id: int, count: int, *, content: str, sender: str = "system"
    ) -> None:
        self._call("seed_mailbox", agent=agent_id, count=count, content=content, sender=sender)

    @faults.retrying
    def take_over_expired(self, agent_id: int) -> int | None:
        result = self._call(
            "take_over_expired", agent=agent_id, interrupted=rules.INTERRUPTED_RESULT
        )
        epoch = result["epoch"]
        return None if epoch is None else int(epoch)

    @faults.retrying
    def reenqueue(self, agent: Scheduled, *, windows: int) -> bool:
        result = self._call(
            "reenqueue",
            agent=agent.agent_id,
            epoch=agent.epoch,
            last_published=agent.last_published,
            windows=windows,
        )
        return bool(result["reenqueued"])

    @faults.retrying
    def record_sweep_failure(
        self, agent_id: int, step: SweepStep, error: str, *, period_seconds: float
    ) -> Quarantine | None:
        result = self._call(
            "record_sweep_failure",
            agent=agent_id,
            step=step.value,
            error=limits.storable(error)[: quarantine.ERROR_CHARS],
            period_seconds=period_seconds,
            quarantine_after=quarantine.QUARANTINE_AFTER,
            max_periods=quarantine.MAX_BACKOFF_PERIODS,
        )
        row = result["quarantine"]
        return None if row is None else _quarantine(row)

    @faults.retrying
    def lift_quarantine(self, agent_id: int, *, reason: str) -> bool:
        result = self._call(
            "lift_quarantine",
            agent=agent_id,
            reason=reason,
            quarantine_after=quarantine.QUARANTINE_AFTER,
        )
        return bool(result["lifted"])

    @faults.retrying
    def lift_settled_quarantines(self, *, keep: set[int]) -> list[int]:
        result = self._call(
            "lift_settled_quarantines",
            keep=sorted(keep),
            reason=quarantine.SETTLED_REASON,
            quarantine_after=quarantine.QUARANTINE_AFTER,
        )
        return [int(agent_id) for agent_id in result["lifted"]]

    @faults.retrying
    def claim_unpublished(
        self, *, older_than_seconds: float = 0.0, limit: int = 500
    ) -> list[OutboxEntry]:
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        result = self._call("claim_unpublished", cutoff=cutoff, limit=limit)
        return [_entry(row) for row in result["entries"]]

    @faults.retrying
    def delete_team(
        self, team_id: int, *, dry_run: bool = False, include_undelivered: bool = False
    ) -> Deletion:
        result = self._call(
            "delete_team",
            team=team_id,
            dry_run=dry_run,
            include_undelivered=include_undelivered,
            listed=lifecycle.OWED_LISTED,
        )
        return _deletion(result["deletion"], dry_run=dry_run)

    @faults.retrying
    def prune_ledger(
        self, *, older_than_seconds: float, dry_run: bool = False, batches: int | None = None
    ) -> int:
        """A call of the function per batch, each its own transaction (a dry run: one call)."""
        params: dict[str, Any] = {
            "before": utcnow() - timedelta(seconds=older_than_seconds),
            "routine": sorted(action.value for action in lifecycle.ROUTINE_LEDGER),
            "limit": lifecycle.LEDGER_PRUNE_BATCH,
            "dry_run": dry_run,
        }
        if dry_run:
            return int(self._call("prune_ledger", **params)["deleted"])
        return lifecycle.ledger_batches(
            lambda: int(self._call("prune_ledger", **params)["deleted"]), batches
        )

    @faults.retrying
    def prune(
        self, *, older_than_seconds: float, dry_run: bool = False, include_undelivered: bool = False
    ) -> Deletion:
        """One call for the published outbox rows, then one per batch of teams, each its own
        transaction."""
        before = utcnow() - timedelta(seconds=older_than_seconds)
        # First, so that a dry run counts each row once.
        published = int(self._call("prune_outbox", before=before, dry_run=dry_run)["deleted"])

        def batch(after: int) -> tuple[Deletion, int]:
            result = self._call(
                "prune_teams",
                before=before,
                after=after,
                limit=lifecycle.PRUNE_BATCH,
                dry_run=dry_run,
                include_undelivered=include_undelivered,
                listed=lifecycle.OWED_LISTED,
            )
            return _deletion(result["deletion"], dry_run=dry_run), int(result["chosen"])

        return lifecycle.team_batches(published, batch, dry_run=dry_run)


def _deletion(found: Mapping[str, Any], *, dry_run: bool) -> Deletion:
    """What ar__delete_teams deleted (or counted): its rows and what was owed as
    [[name, count], ...] in the order they were counted."""
    return Deletion(
        teams=tuple(found["teams"]),
        rows={name: int(count) for name, count in found["rows"]},
        questions=tuple(found["questions"]),
        dry_run=dry_run,
        owed={kind: int(count) for kind, count in found["owed"]},
        kept=tuple(found["kept"]),
    )


def _quarantine(row: Mapping[str, Any]) -> Quarantine:
    return Quarantine(
        agent_id=row["agent_id"],
        team_id=row["team_id"],
        step=SweepStep(row["step"]),
        failures=row["failures"],
        error=row["error"],
        first_failed_at=datetime.fromisoformat(row["first_failed_at"]),
        last_failed_at=datetime.fromisoformat(row["last_failed_at"]),
        until=datetime.fromisoformat(row["until"]),
    )


def _run(conn: sa.Connection, statement: str, params: dict[str, Any]) -> Any:
    """The one value the call ``statement`` returns, sent on the driver's cursor of ``conn``:
    SQLAlchemy's execution around it costs more client CPU than the call itself. A driver
    error leaves as SQLAlchemy's (a disconnect marked as one), as from ``exec_driver_sql``, so
    that :meth:`PostgresStore._alone` handles it the same way."""
    dbapi: Any = conn.connection.dbapi_connection
    cursor = dbapi.cursor()
    try:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    except psycopg.Error as exc:
        lost = conn.dialect.is_disconnect(cast(Any, exc), dbapi, cursor)
        raise sa.exc.DBAPIError.instance(
            statement, params, exc, psycopg.Error, connection_invalidated=lost
        ) from exc
    finally:
        cursor.close()
    assert row is not None
    return row[0]


def _functions_missing(conn: sa.Connection) -> bool:
    """Whether the database lacks this release's functions. A call can also name no function
    when a value is of a type none takes (an integer beyond bigint is sent as numeric): that
    is an error of the call, not of the database."""
    try:
        return not functions.is_installed(conn)
    except SQLAlchemyError:
        return True


def _results(results: Sequence[Result]) -> str:
    """Carried tool call results as the turn functions take them: [[id, content, meta], ...]."""
    return json.dumps([list(result) for result in results])


def _of(turn: TurnRecord) -> dict[str, Any]:
    """A turn as the turn functions take it: checked against its agent's fence."""
    return {"turn": turn.id, "agent": turn.agent_id, "epoch": turn.epoch}


def _turn(row: Mapping[str, Any]) -> TurnRecord:
    return TurnRecord(
        id=row["id"],
        agent_id=row["agent_id"],
        epoch=row["epoch"],
        trigger=TurnTrigger(row["trigger"]),
        status=TurnStatus(row["status"]),
        started_at=datetime.fromisoformat(row["started_at"]),
        ended_at=_time(row["ended_at"]),
    )


def _message(row: Mapping[str, Any], target_name: str) -> Message:
    """A message as a function returned its row (JSON: enums and times as text)."""
    subtype = row["subtype"]
    return Message(
        **{name: row[name] for name in values.MESSAGE_FIELDS}
        | {
            "type": MessageType(row["type"]),
            "subtype": MessageSubtype(subtype) if subtype else None,
            "outcome": RouteOutcome(row["outcome"]),
            "status": MessageStatus(row["status"]),
            "created_at": datetime.fromisoformat(row["created_at"]),
        },
        target_name=target_name,
    )


def _agent(row: Mapping[str, Any]) -> Agent:
    trigger = row["pending_trigger"]
    return Agent(
        **{name: row[name] for name in values.AGENT_FIELDS}
        | {
            "state": AgentState(row["state"]),
            "pending_trigger": TurnTrigger(trigger) if trigger else None,
        }
    )


def user_message(row: Mapping[str, Any]) -> UserMessage:
    """A message to the user from its JSON form (:meth:`UserMessage.as_payload`)."""
    return UserMessage(
        id=row["id"],
        team_id=row["team_id"],
        sender=row["sender"],
        kind=UserMessageKind(row["kind"]),
        content=row["content"],
        question_id=row["question_id"],
        created_at=datetime.fromisoformat(row["created_at"]),
    )


def _question(row: Mapping[str, Any]) -> Question:
    return Question(
        **{name: row[name] for name in values.QUESTION_FIELDS}
        | {
            "status": QuestionStatus(row["status"]),
            "kind": QuestionKind(row["kind"]),
            "deadline": datetime.fromisoformat(row["deadline"]),
        }
    )


def _job(row: Mapping[str, Any]) -> BackgroundJob:
    return BackgroundJob(
        **{name: row[name] for name in values.JOB_FIELDS}
        | {
            "status": JobStatus(row["status"]),
            "created_at": datetime.fromisoformat(row["created_at"]),
            "finished_at": _time(row["finished_at"]),
        }
    )


def _check(found: Mapping[str, Any]) -> BudgetCheck:
    """A budget check as a function answered it."""
    exhausted, warn = found.get("exhausted"), found.get("warn")
    return BudgetCheck(
        ok=found["ok"],
        exhausted=BudgetName(exhausted) if exhausted else None,
        warn=BudgetName(warn) if warn else None,
        newly_exhausted=bool(found.get("newly_exhausted")),
    )


def _budget(result: Mapping[str, Any]) -> Budget:
    """A team's budget from its row as a function returned it, and its sub-agents."""
    row = dict(result["row"])
    for name in ("started_at", "deadline_at"):
        row[name] = _time(row[name])
    if row["max_wall_seconds"] is not None:  # JSON writes a whole float8 as an integer
        row["max_wall_seconds"] = float(row["max_wall_seconds"])
    exhausted = row["exhausted"]
    row["exhausted"] = BudgetName(exhausted) if exhausted else None
    created, active = result["sub_agents"]
    return rules.budget_of(BudgetRow(**row), (created, active), utcnow())


def _time(value: str | None) -> datetime | None:
    """A timestamp as a function returned it (JSON text)."""
    return None if value is None else datetime.fromisoformat(value)


def _sent(req: SendRequest) -> dict[str, Any]:
    """A message's own fields, as the send functions take them."""
    return {
        "to": req.to,
        "type": req.type.value,
        "subtype": req.subtype.value if req.subtype else None,
        "content": req.content,
        "body": formats.stored_body(req.content),
        "question_id": req.question_id,
        "wake": req.wake,
        "dedup_key": req.dedup_key,
    }


def _sender(req: SendRequest) -> dict[str, Any]:
    return {
        "team": req.team_id,
        "sender": req.sender,
        "external": rules.is_external(req.sender),
    }


def _delivery(result: Mapping[str, Any]) -> Delivery:
    found = result["delivery"]
    return Delivery(
        message_id=found["message_id"],
        outcome=RouteOutcome(found["outcome"]),
        target=found["target"],
        seq=found["seq"],
        epoch=found["epoch"],
        duplicate=found["duplicate"],
    )


def _entry(row: Mapping[str, Any]) -> OutboxEntry:
    return OutboxEntry(
        id=row["id"],
        kind=OutboxKind(row["kind"]),
        agent_id=row["agent_id"],
        epoch=row["epoch"],
        payload=row["payload"],
    )


def _event(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ledger event a function wrote, as the log takes it."""
    outcome = row.get("outcome")
    return {
        **row,
        "action": LedgerAction(row["action"]),
        "outcome": RouteOutcome(outcome) if outcome else None,
        "detail": row.get("detail") or {},
    }


def _error(refused: Mapping[str, Any]) -> errors.AgentRouterError:
    """The error a function refused with: its code and fields, as :mod:`refusals` renders
    them."""
    return refusals.error(refused["code"], **(refused.get("fields") or {}))


def _before_call(result: dict[str, Any]) -> BeforeCall:
    """What ar_before_call did and read, as its result says."""
    if result.get("stopped"):
        return BeforeCall(stopped=True, budget=None, messages=[], roster=[])
    budget = _check(result["budget"])
    if not budget.ok:
        return BeforeCall(budget=budget, messages=[], roster=[])
    rows = result["rows"]
    return BeforeCall(
        budget=budget,
        messages=[_message(row, result["target"]) for row in result["messages"]],
        more=result["more"],
        roster=[_agent(row) for row in result["roster"]],
        rows=None if rows is None else [(position, entry) for position, entry in rows],
    )
