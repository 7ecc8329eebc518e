"""Driver errors turned into the library's own: a store call raises a
:class:`~agent_router.errors.StoreError` (nothing written) or a
:class:`~agent_router.errors.CommitUnknownError` (the connection was lost during COMMIT, so the
write may have happened), never a SQLAlchemy, psycopg or sqlite3 exception."""

from __future__ import annotations

import functools
import inspect
import sqlite3
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import psycopg
from sqlalchemy.exc import (
    DBAPIError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
    StatementError,
)

from agent_router import errors
from agent_router.logfields import get_logger

logger = get_logger("agent_router.store")

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type[Any])


def connection_lost(exc: BaseException) -> bool:
    """The error says the connection broke (server restart, backend terminated, network). An
    error the server answered with a SQLSTATE of its own (a statement cancelled by a timeout or
    an operator, a lock not available, a deadlock) came over a live connection: the statement
    failed and rolled back, whatever its class; only connection exceptions (class 08) and
    operator intervention that ends the session (57P01-57P03) are a broken connection."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    state = sqlstate(exc)
    if state is not None and not state.startswith(("08", "57P")):
        return False
    return isinstance(exc, OperationalError | InterfaceError)


def rolled_back(exc: BaseException) -> bool:
    """The server rolled the transaction back to end a conflict with another (a deadlock, a
    serialization failure: SQLSTATE class 40): nothing was written, and it may run again."""
    state = sqlstate(exc)
    return state is not None and state.startswith("40")


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE the server answered with (psycopg's), if any."""
    state = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return state if isinstance(state, str) else None


def said(cause: BaseException) -> str:
    """What the database said, in one line: psycopg's primary message and its SQLSTATE, or the
    first line of any other driver's text. Never the rest of the driver's text (PL/pgSQL's
    ``CONTEXT`` with the function's arguments, the statement, the exception's class), which is
    logged at DEBUG for whoever digs."""
    diag = getattr(cause, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary if isinstance(primary, str) and primary else str(cause)
    text = text.strip().split("\n", 1)[0] or type(cause).__name__
    state = getattr(cause, "sqlstate", None)
    return f"{text} (SQLSTATE {state})" if isinstance(state, str) else text


def store_error(exc: SQLAlchemyError, *, committing: bool) -> errors.StoreError:
    """The library's error for ``exc``; ``committing``: it was raised by the COMMIT itself (or
    by a statement that is its own transaction). Its message is the router's, with what the
    database said (:func:`said`); the driver's whole text goes to the log at DEBUG."""
    # A statement's error: the driver's, or a value a column's type refused as it was bound.
    cause = exc.orig if isinstance(exc, StatementError) and exc.orig is not None else exc
    logger.debug("driver error: %r", cause, extra={"action": "driver_error"})
    words = said(cause)
    if rolled_back(exc):  # the server answered: known not written, whatever was committing
        return errors.StoreError(f"database conflict, rolled back: {words}", retryable=True)
    if committing and connection_lost(exc):
        return errors.CommitUnknownError(
            f"the connection was lost while committing; the write may have happened: {words}"
        )
    return errors.StoreError(f"database error: {words}", retryable=connection_lost(exc))


#: A value no column can hold: an integer beyond 64 bits, refused before any database sees it
#: (SQLite's driver cannot send one; PostgreSQL would look for a function taking ``numeric``).
OUT_OF_RANGE = "database error: a number is out of range (beyond 64 bits)"
#: The integers a store call may send.
INT64 = range(-(2**63), 2**63)


def check_integers(params: dict[str, Any]) -> None:
    """Refuse a call whose integers no column can hold (:data:`OUT_OF_RANGE`), as SQLite's
    driver refuses them, so both databases give the same error."""
    for value in params.values():
        if isinstance(value, int) and not isinstance(value, bool) and value not in INT64:
            raise errors.StoreError(OUT_OF_RANGE)


#: Runs of a transaction after the first when its connection is lost before COMMIT: with the
#: sleeps between them (0.05 s doubling) about 3 s, what a database restart or fail-over takes.
RETRIES = 6


def retrying(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a store method (one transaction, or several that are each safe to repeat) again
    when its connection was lost before COMMIT or the server rolled it back to end a conflict:
    nothing was written, and the transaction re-reads and re-checks its fences, so the repeat
    is idempotent. A commit whose outcome is unknown is never repeated here."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(RETRIES + 1):
            try:
                return fn(*args, **kwargs)
            except errors.StoreError as exc:
                if not exc.retryable or attempt == RETRIES:
                    raise
                logger.info(  # the caller sees the error if every run fails
                    "nothing was written; running the transaction again",
                    extra={"action": "store_retry", "operation": fn.__name__, "error": str(exc)},
                )
                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    return wrapper


def wrapped_read(fn: Callable[P, R]) -> Callable[P, R]:
    """A read: driver errors become :class:`~agent_router.errors.StoreError`, and a read
    whose connection was lost runs again."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except SQLAlchemyError as exc:
            raise store_error(exc, committing=False) from exc

    return retrying(wrapper)


#: The errors of the drivers themselves: one that a path below the store did not wrap (a
#: pool's checkout, a connection made for a statement on the driver) is wrapped here.
_DRIVER_ERRORS = {psycopg.Error: "psycopg", sqlite3.Error: "sqlite3"}


def boundary_error(exc: BaseException) -> errors.AgentRouterError | None:
    """The library's error for ``exc`` raised below a public store method, or ``None`` for an
    error of the library's own or a bug: a driver's error is a
    :class:`~agent_router.errors.StoreError` as :func:`store_error` makes it (a connection
    that could not be had: retryable, nothing was written), and a value the driver could not
    send (an integer beyond 64 bits, which SQLite's driver refuses as ``OverflowError`` where
    PostgreSQL answers "out of range"; a value nested too deep to serialize) is one too, on
    either database."""
    if isinstance(exc, errors.AgentRouterError):
        return None
    if isinstance(exc, SQLAlchemyError):
        return store_error(exc, committing=False)
    for base in _DRIVER_ERRORS:
        if isinstance(exc, base):
            wrapped = DBAPIError.instance(None, None, exc, base)
            assert isinstance(wrapped, DBAPIError)
            return store_error(wrapped, committing=False)
    if isinstance(exc, OverflowError):
        return errors.StoreError(OUT_OF_RANGE)
    if isinstance(exc, RecursionError):
        return errors.StoreError("database error: a value nests too deep to be written")
    return None


def guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, a public method of the store, raising only the library's errors (see
    :func:`boundary_error`), whatever runs below it."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            error = boundary_error(exc)
            if error is None:
                raise
            raise error from exc

    return wrapper


def boundary(cls: C) -> C:
    """Every public method of ``cls`` :func:`guarded`: the store's public surface raises the
    library's errors only, whichever path below it (a transaction, a statement on the driver,
    a pool's checkout) met the database's."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, guarded(member))
    return cls
