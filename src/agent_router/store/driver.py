"""A statement that is its own transaction, sent on the driver's own connection.

The hot statements (a route, an answer, a claim, an end, an append) are each one round trip in
autocommit. Sent through SQLAlchemy's execution layer, the Python around that round trip (the
compiled cache's lookup, the execution context, the cursor's description, the result's
metadata) costs several times the driver's own work, and with several senders in one process
it is what they queue for. Here each statement is compiled once for the engine's dialect; a
call converts its parameters with the column types' own bind processors, sends the compiled
text on the pooled connection's driver connection, and converts the one row it returns with
the types' result processors: what SQLAlchemy does, without the layer around it.

Listeners of the engine's ``before_cursor_execute`` or ``after_cursor_execute`` events (a host's
tracing, a test watching statements) expect SQLAlchemy's execution context: when the engine has
any, the same statement runs through SQLAlchemy instead, with the same result.

Errors leave as the store's own: :class:`~agent_router.errors.StoreError`, and
:class:`~agent_router.errors.CommitUnknownError` when the connection was lost while the
statement ran (it may have committed).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from psycopg import pq
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from agent_router import errors
from agent_router.store import faults
from agent_router.store.engine import closed_by_server

Processor = Callable[[Any], Any]

#: Runs a statement that returns at most one row: that row by column name, or ``None``.
Run = Callable[[sa.Select[Any], Mapping[str, Any]], Mapping[str, Any] | None]


class Compiled:
    """``statement`` compiled for ``dialect``: its text, its parameters' processors by name,
    and its result columns' names and processors."""

    def __init__(self, statement: sa.Select[Any], dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        if compiled.escaped_bind_names:  # never: the statements' parameter names are plain
            raise ValueError("a statement whose parameter names need escaping")
        self.text = compiled.string
        # The parameters a call gives, and the statement's own constants (``agent.epoch + 1``).
        self._required = frozenset(n for b, n in compiled.bind_names.items() if b.required)
        self._constants = {
            n: b.effective_value for b, n in compiled.bind_names.items() if not b.required
        }
        self._binds: list[tuple[str, Processor]] = []
        for bind, name in compiled.bind_names.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                self._binds.append((name, process))
        self.names = tuple(str(column.key) for column in statement.exported_columns)
        self._results: list[tuple[int, Processor]] = []
        for i, column in enumerate(statement.exported_columns):
            process = column.type.dialect_impl(dialect).result_processor(dialect, None)
            if process is not None:
                self._results.append((i, process))

    def parameters(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters to send: ``values`` and the statement's own constants, processed."""
        missing = self._required.difference(values)
        if missing:  # a mistake in this package, never the caller's
            raise ValueError(f"the statement's parameters {sorted(missing)} are missing")
        sent = {**self._constants, **values}
        for name, process in self._binds:
            sent[name] = process(sent[name])
        return sent

    def row(self, raw: tuple[Any, ...]) -> dict[str, Any]:
        values = list(raw)
        for i, process in self._results:
            values[i] = process(values[i])
        return dict(zip(self.names, values, strict=True))


_compiled: weakref.WeakKeyDictionary[Dialect, dict[int, Compiled]] = weakref.WeakKeyDictionary()


def compiled(statement: sa.Select[Any], dialect: Dialect) -> Compiled:
    """``statement`` compiled for ``dialect``, once."""
    by_statement = _compiled.setdefault(dialect, {})
    found = by_statement.get(id(statement))
    if found is None:
        found = by_statement[id(statement)] = Compiled(statement, dialect)
    return found


def observed(engine: Engine) -> bool:
    """Whether listeners watch the engine's statements (then they go through SQLAlchemy)."""
    return bool(engine.dispatch.before_cursor_execute or engine.dispatch.after_cursor_execute)


def one_row(
    engine: Engine, statement: sa.Select[Any], values: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Run ``statement``, a module-level constant that returns at most one row, as its own
    transaction (autocommit): that row by column name, or ``None``."""
    if observed(engine):
        with alone(engine) as conn:
            autocommit = conn.execution_options(isolation_level="AUTOCOMMIT")
            found = autocommit.execute(statement, dict(values)).mappings().one_or_none()
            return None if found is None else dict(found)
    return _sent(engine, compiled(statement, engine.dialect), values)


def in_transaction(
    session: Session, statement: sa.Select[Any], values: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """Run ``statement`` as one statement of the session's transaction: its row, or ``None``."""
    found = session.execute(statement, dict(values)).mappings().one_or_none()
    return None if found is None else dict(found)


def _sent(engine: Engine, statement: Compiled, values: Mapping[str, Any]) -> dict[str, Any] | None:
    """``statement`` sent on a pooled connection's driver connection in autocommit. The
    connection is given back to the pool as it was taken (not in autocommit), or invalidated
    when it was lost."""
    try:
        pooled = engine.raw_connection()  # the pool's checkout runs its checks
    except SQLAlchemyError as exc:  # nothing was sent
        raise faults.store_error(exc, committing=False) from exc
    try:
        driver: Any = pooled.driver_connection
        _last_look(driver, pooled.invalidate)
        parameters = statement.parameters(values)
        driver.autocommit = True
        try:
            with driver.cursor() as cursor:
                cursor.execute(statement.text, parameters)
                raw = cursor.fetchone()
        except engine.dialect.loaded_dbapi.Error as exc:
            lost = engine.dialect.is_disconnect(exc, driver, None)
            if lost:
                pooled.invalidate()
            wrapped = DBAPIError.instance(
                statement.text,
                parameters,
                exc,
                engine.dialect.loaded_dbapi.Error,
                connection_invalidated=lost,
                dialect=engine.dialect,
            )
            raise faults.store_error(wrapped, committing=True) from exc
        finally:
            if not pooled.is_valid:
                pass  # lost, and invalidated above
            elif driver.info.transaction_status is pq.TransactionStatus.IDLE:
                driver.autocommit = False
            else:  # interrupted while the statement ran (a signal, a timeout)
                pooled.invalidate()
    finally:
        pooled.close()
    return None if raw is None else statement.row(raw)


def _last_look(dbapi_connection: Any, invalidate: Callable[[], None]) -> None:
    """A last look, without a round trip, just before the write: a connection that died after
    the pool's check at checkout is found here, before anything was sent, and the caller runs
    again on another (store.faults.retrying). Only one that dies from here on leaves the
    outcome unknown."""
    if closed_by_server(dbapi_connection):
        invalidate()
        raise errors.StoreError(
            "the server closed the connection before the statement", retryable=True
        )


@contextmanager
def alone(engine: Engine) -> Iterator[Connection]:
    """A connection for one statement that is its own transaction. Driver
    errors leave as :class:`~agent_router.errors.StoreError`; one raised while the statement
    ran is :class:`~agent_router.errors.CommitUnknownError` when the connection was lost."""
    try:
        connected = engine.connect()
    except SQLAlchemyError as exc:  # nothing was sent
        raise faults.store_error(exc, committing=False) from exc
    with connected as conn:
        _last_look(conn.connection.dbapi_connection, conn.invalidate)
        try:
            yield conn
        except SQLAlchemyError as exc:
            if faults.connection_lost(exc) and not conn.invalidated:
                conn.invalidate()
            raise faults.store_error(exc, committing=True) from exc
