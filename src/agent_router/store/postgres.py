"""The store on PostgreSQL: every transition one call of its function (``postgresql/*.sql``).

:class:`PostgresStore` is the :class:`~agent_router.store.store.Store` whose transitions are
the database's functions: a call is one statement, its own transaction (autocommit), so each
transition is one round trip in every branch, and the function decides every branch. What a
function decided comes back as one JSON object: the transition's result, the ledger events it
wrote (logged here, as the SQLite implementation logs its own), the outbox rows to publish
after the commit, or a refusal (the error to raise; its event is written by the function).

A connection lost while a call ran leaves it unknown whether it committed
(:class:`~agent_router.errors.CommitUnknownError`); one lost before it was sent is retried
(:func:`~agent_router.store.faults.retrying`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from agent_router import errors, formats
from agent_router.domain import (
    Delivery,
    LedgerAction,
    OutboxEntry,
    OutboxKind,
    RouteOutcome,
)
from agent_router.store import faults, functions, routing
from agent_router.store.engine import closed_by_server
from agent_router.store.store import Store
from agent_router.store.tx import log_event
from agent_router.store.values import SendRequest


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
            try:
                yield conn.execution_options(isolation_level="AUTOCOMMIT")
            except SQLAlchemyError as exc:
                if faults.connection_lost(exc) and not conn.invalidated:
                    conn.invalidate()
                raise faults.store_error(exc, committing=True) from exc

    def _call(self, name: str, **params: Any) -> dict[str, Any]:
        """Run the named statement (one transition); its result, once the events it wrote are
        logged and the outbox rows it wrote handed to the publisher. A refusal raises its
        error."""
        with self._alone() as conn:
            result: dict[str, Any] = conn.execute(functions.queries()[name], params).scalar_one()
        for event in result.get("events", ()):
            log_event(_event(event))
        refused = result.get("refused")
        if refused is not None:
            raise _error(refused)
        self._published([_entry(row) for row in result.get("outbox", ())])
        return result

    # ------------------------------------------------------------------ routing

    @faults.retrying
    def route(self, req: SendRequest) -> Delivery:
        return _delivery(self._call("send", **_sent(req), **_sender(req)))

    @faults.retrying
    def route_many(self, reqs: Sequence[SendRequest]) -> list[Delivery]:
        if len({req.team_id for req in reqs}) > 1:
            raise errors.InvalidMessageError("the messages of one send_many go to one team")
        if not reqs:
            return []
        messages = [_sent(req) for req in reqs]
        result = self._call("send_many", messages=json.dumps(messages), **_sender(reqs[0]))
        return [_delivery({"delivery": found}) for found in result["deliveries"]]

    @faults.retrying
    def record_rejection(self, team_id: int | None, reason: str, **detail: Any) -> None:
        event = {
            "action": LedgerAction.SEND_REJECTED.value,
            "team_id": team_id,
            "outcome": RouteOutcome.REJECTED.value,
            "detail": {"reason": reason, **detail},
        }
        self._call("record_refusal", event=json.dumps(event, default=str))


def _sent(req: SendRequest) -> dict[str, Any]:
    """A message's own fields, as the send functions take them."""
    body = formats.escape(req.content)
    return {
        "to": req.to,
        "type": req.type.value,
        "subtype": req.subtype.value if req.subtype else None,
        "content": req.content,
        "body": body if body != req.content else None,
        "question_id": req.question_id,
        "wake": req.wake,
        "dedup_key": req.dedup_key,
    }


def _sender(req: SendRequest) -> dict[str, Any]:
    return {
        "team": req.team_id,
        "sender": req.sender,
        "external": routing.is_external(req.sender),
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
    """The error a function refused with: a class of :mod:`agent_router.errors` by name."""
    cls = getattr(errors, refused["error"], None)
    if not (isinstance(cls, type) and issubclass(cls, errors.AgentRouterError)):
        return errors.StoreError(f"the database refused with an unknown error: {refused!r}")
    error: errors.AgentRouterError = cls(refused["message"], **(refused.get("fields") or {}))
    return error
