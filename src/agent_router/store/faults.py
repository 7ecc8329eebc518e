"""Driver errors turned into the library's own: a store call raises a
:class:`~agent_router.errors.StoreError` (nothing written) or a
:class:`~agent_router.errors.CommitUnknownError` (the connection was lost during COMMIT, so the
write may have happened), never a SQLAlchemy, psycopg or sqlite3 exception."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from agent_router import errors

logger = logging.getLogger("agent_router.store")

P = ParamSpec("P")
R = TypeVar("R")


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


def store_error(exc: SQLAlchemyError, *, committing: bool) -> errors.StoreError:
    """The library's error for ``exc``; ``committing``: it was raised by the COMMIT itself (or
    by a statement that is its own transaction)."""
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    if rolled_back(exc):  # the server answered: known not written, whatever was committing
        return errors.StoreError(f"database conflict, rolled back: {cause!r}", retryable=True)
    if committing and connection_lost(exc):
        return errors.CommitUnknownError(
            f"the connection was lost while committing; the write may have happened: {cause!r}"
        )
    return errors.StoreError(f"database error: {cause!r}", retryable=connection_lost(exc))


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
