"""How the CLI reports a failure: one line on stderr, ``agent-router: error: WHAT (hint: WHAT TO
DO)``, exit status 1; the whole traceback with ``--traceback`` (or AGENT_ROUTER_TRACEBACK=1)."""

from __future__ import annotations

import errno
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_router import errors
from agent_router.ops import preflight

if TYPE_CHECKING:
    pass

#: Exit status of every failure reported on one line (usage errors exit 2, as Click's do).
EXIT_FAILURE = 1
#: Exit status of a malformed argument (a usage error), as Click's.
EXIT_USAGE = 2


@dataclass
class _Options:
    traceback: bool = False


OPTIONS = _Options(traceback=os.environ.get("AGENT_ROUTER_TRACEBACK", "") not in ("", "0"))

_SCHEMA_MISSING = ("no such table", "undefinedtable", "does not exist")
#: A table is there but not a column this release reads: the schema is an older release's.
_SCHEMA_BEHIND = ("no such column", "undefinedcolumn")


def explain(exc: BaseException) -> tuple[str, str | None]:
    """What went wrong, in one line, and what to do about it (``None`` when nothing helps)."""
    import kombu.exceptions
    import pydantic
    import redis
    from alembic.util import CommandError

    hint: str | None = getattr(exc, "hint", None)
    if (
        type(exc) is errors.StoreError  # the driver's error says more (a commit unknown is kept)
        and exc.__cause__ is not None
        and _driver_error(exc.__cause__) is not None
    ):
        return explain(exc.__cause__)
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        return f"invalid setting {where}: {first['msg']}", (
            "docs/configuration.md lists every setting and its AGENT_ROUTER_* variable"
        )
    if (driver := _driver_error(exc)) is not None:
        return _database(driver, hint)
    if isinstance(exc, redis.RedisError):
        return f"Redis error: {exc}", "is Redis running? `agent-router doctor` checks it"
    if isinstance(exc, kombu.exceptions.OperationalError):
        return f"broker unreachable: {exc}", (
            "start the broker or check --broker-url; `agent-router doctor` checks it"
        )
    if isinstance(exc, errors.ModelError):
        return str(exc), hint or (
            "check --base-url (AGENT_ROUTER_OPENAI_BASE_URL), the model name and the API key"
        )
    if isinstance(exc, errors.AgentRouterError):
        return str(exc), hint
    if isinstance(exc, CommandError):
        return f"migration error: {exc}", (
            "the router's revision is in agent_router_alembic_version; `agent-router db upgrade` "
            "upgrades to head"
        )
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return "the port is in use: another process listens on it", (
            "stop that process, or pass another --port"
        )
    if (
        isinstance(exc, OSError)
        and exc.filename is not None
        and not isinstance(exc, ConnectionError)
    ):
        return f"cannot use {exc.filename}: {exc.strerror or type(exc).__name__}", (
            "check the path: its directory must exist and be writable"
        )
    if isinstance(exc, ConnectionError | OSError):
        return f"{type(exc).__name__}: {exc}", hint or "`agent-router doctor` checks every service"
    return f"{type(exc).__name__}: {exc}", "run again with --traceback for the whole traceback"


def _driver_error(exc: BaseException) -> BaseException | None:
    """The database driver's own error in ``exc``: SQLAlchemy's wrapper's, or ``exc`` itself
    when the driver's error reached here unwrapped (psycopg, sqlite3)."""
    import sqlite3

    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        return exc.orig
    try:
        import psycopg
    except ImportError:  # pragma: no cover - a dependency; only its absence is guarded
        return exc if isinstance(exc, sqlite3.Error) else None
    return exc if isinstance(exc, psycopg.Error | sqlite3.Error) else None


#: Driver errors that say the server could not be reached (or the connection was lost).
_CONNECTION_ERRORS = ("OperationalError", "InterfaceError")


def _database(orig: BaseException, hint: str | None) -> tuple[str, str | None]:
    """A driver's error: a missing or older schema says so, a connection failure names the URL."""
    text = str(orig).strip() or type(orig).__name__
    said = f"{type(orig).__name__} {text}".lower()
    if any(s in said for s in _SCHEMA_MISSING + _SCHEMA_BEHIND) and ("ar_" in text):
        line = text.splitlines()[0]
        if any(s in said for s in _SCHEMA_BEHIND):
            return (
                f"the database's agent-router schema is older than this release ({line})",
                "upgrade it with `agent-router db upgrade --database-url URL`",
            )
        return (
            f"the database has no agent-router schema ({line})",
            "create it with `agent-router db upgrade --database-url URL`",
        )
    kinds = {cls.__name__ for cls in type(orig).__mro__}
    missing = preflight.missing_database(text)
    if missing is not None:  # the server answered: it has no database of that name
        return missing
    if kinds & set(_CONNECTION_ERRORS):
        return f"database error: {text}", (
            "is the database server running? check --database-url (or "
            "AGENT_ROUTER_DATABASE_URL); `agent-router doctor` checks every service"
        )
    return f"database error: {text}", hint


#: The longest one-line message; a longer one is cut between words, marked with an ellipsis.
MAX_LINE = 300


def error_line(exc: BaseException, *, hint: str | None = None) -> str:
    """The one line printed for ``exc`` (without the ``agent-router: error:`` prefix)."""
    what, explained = explain(exc)
    hint = hint or explained
    line = preflight.one_line(what, MAX_LINE) or type(exc).__name__
    return f"{line} (hint: {hint})" if hint else line


def report(exc: BaseException, *, hint: str | None = None) -> None:
    """Print the one line of ``exc``; ``hint`` replaces the one :func:`explain` gives."""
    print(f"agent-router: error: {error_line(exc, hint=hint)}", file=sys.stderr, flush=True)


def warn(text: str) -> None:
    """A warning through the CLI's logging: one line on stderr (``agent-router: warning:``), or
    a JSON object with ``--log-format json``."""
    logging.getLogger("agent_router.cli").warning(text)


def run_quietly_on_broken_pipe(main: object) -> None:
    """Run the CLI; a reader that stops early (``agent-router ledger 3 | head -1``) ends it
    quietly, as it ends ``cat``."""
    assert callable(main)
    try:
        main()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that this cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)
