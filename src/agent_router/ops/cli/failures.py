"""How the CLI reports a failure: one line on stderr, ``agent-router: error: WHAT (hint: WHAT TO
DO)``, exit status 1; the whole traceback with ``--traceback`` (or AGENT_ROUTER_TRACEBACK=1)."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_router import errors

if TYPE_CHECKING:
    import sqlalchemy.exc

#: Exit status of every failure reported on one line (usage errors exit 2, as Click's do).
EXIT_FAILURE = 1


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
    import sqlalchemy.exc
    from alembic.util import CommandError

    hint: str | None = getattr(exc, "hint", None)
    if (
        type(exc) is errors.StoreError  # the driver's error says more (a commit unknown is kept)
        and isinstance(exc.__cause__, sqlalchemy.exc.DBAPIError)
    ):
        return explain(exc.__cause__)
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        return f"invalid setting {where}: {first['msg']}", (
            "docs/configuration.md lists every setting and its AGENT_ROUTER_* variable"
        )
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
        return _database(exc, hint)
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
    if isinstance(exc, ConnectionError | OSError):
        return f"{type(exc).__name__}: {exc}", hint or "`agent-router doctor` checks every service"
    return f"{type(exc).__name__}: {exc}", "run again with --traceback for the whole traceback"


def _database(exc: sqlalchemy.exc.DBAPIError, hint: str | None) -> tuple[str, str | None]:
    """A driver's error: a missing or older schema says so, a connection failure names the URL."""
    import sqlalchemy.exc

    text = str(exc.orig)
    said = f"{type(exc.orig).__name__} {text}".lower()
    if isinstance(exc, sqlalchemy.exc.ProgrammingError | sqlalchemy.exc.OperationalError) and (
        any(s in said for s in _SCHEMA_MISSING + _SCHEMA_BEHIND) and ("ar_" in text)
    ):
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
    if isinstance(exc, sqlalchemy.exc.OperationalError):
        return f"database error: {text}", (
            "check --database-url (or AGENT_ROUTER_DATABASE_URL); `agent-router doctor` "
            "checks every service"
        )
    return f"database error: {text}", hint


def _squash(text: str) -> str:
    return " ".join(text.split())[:200]


def error_line(exc: BaseException) -> str:
    """The one line printed for ``exc`` (without the ``agent-router: error:`` prefix)."""
    what, hint = explain(exc)
    line = _squash(what) or type(exc).__name__
    return f"{line} (hint: {hint})" if hint else line


def report(exc: BaseException) -> None:
    print(f"agent-router: error: {error_line(exc)}", file=sys.stderr, flush=True)


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
