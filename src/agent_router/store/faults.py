"""Driver errors turned into the library's own: a store call raises a
:class:`~agent_router.errors.StoreError` (nothing written) or a
:class:`~agent_router.errors.CommitUnknownError` (the connection was lost during COMMIT, so the
write may have happened), never a SQLAlchemy, psycopg or sqlite3 exception."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from agent_router import errors


def connection_lost(exc: BaseException) -> bool:
    """The error says the connection broke (server restart, backend terminated, network)."""
    return isinstance(exc, DBAPIError) and (
        exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)
    )


def store_error(exc: SQLAlchemyError, *, committing: bool) -> errors.StoreError:
    """The library's error for ``exc``; ``committing``: it was raised by the COMMIT itself."""
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    if committing and connection_lost(exc):
        return errors.CommitUnknownError(
            f"the connection was lost while committing; the write may have happened: {cause!r}"
        )
    return errors.StoreError(f"database error: {cause!r}")
