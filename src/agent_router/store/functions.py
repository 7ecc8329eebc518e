"""The store's transitions on PostgreSQL: functions of the database, and the named statements
that call them.

Every transition is a PL/pgSQL function holding all of its branches (``postgresql/*.sql``, a
file per group of transitions, as ``routing.py``, ``turns.py``, ... group them for SQLite); a
call is one statement, so a transition sent alone is one round trip whatever branch it takes.
The statements the store sends are named in ``postgresql/queries.sql``.

The functions are code, not schema: every upgrade to the newest revision (``agent-router db
upgrade``, a host's Alembic run through :func:`~agent_router.store.migrate.upgrade_connection`)
and :meth:`~agent_router.store.Store.create_schema` install them anew from this package, in one
transaction, dropping first every function of ours (so a changed signature leaves no stale
overload). :func:`installed` tells whether a database holds this release's.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from typing import Any

import sqlalchemy as sa
from psycopg import sql as psql

#: The files of functions, in the order they are installed (each uses the ones before it).
FILES = (
    "common.sql",
    "routing.sql",
    "budgets.sql",
    "turns.sql",
    "waits.sql",
    "users.sql",
    "agents.sql",
    "jobs.sql",
    "recovery.sql",
)

_NAMED = re.compile(r"^-- name: ([a-z_]+)\n((?:--[^\n]*\n)*)(.*?)(?=^-- name: |\Z)", re.M | re.S)
_FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION (ar_[a-z_]+)\(")


def _read(name: str) -> str:
    return resources.files("agent_router.store").joinpath("postgresql", name).read_text("utf-8")


@cache
def source() -> str:
    """Every function's definition, as installed."""
    return "\n".join(_read(name) for name in FILES)


@cache
def version() -> str:
    """This release's functions, as a digest of their text."""
    return hashlib.sha256(source().encode()).hexdigest()[:16]


@cache
def names() -> tuple[str, ...]:
    """The names of the functions the files define."""
    return tuple(dict.fromkeys(_FUNCTION.findall(source())))


#: Our functions in the database's schema: every ``ar__*`` piece and every function the files
#: name, with their signatures, whatever release installed them.
_OURS = """
SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema()
  AND (p.proname LIKE 'ar\\_\\_%%' OR p.proname = ANY (%(names)s))
"""

#: The function whose comment holds the version of the functions installed.
_VERSIONED = "ar__now()"


def install(conn: sa.Connection) -> None:
    """Install this release's functions on ``conn`` (PostgreSQL), in its transaction."""
    drop(conn)
    with _cursor(conn) as cursor:
        cursor.execute(source())  # the definitions, as written in the files
        cursor.execute(
            psql.SQL("COMMENT ON FUNCTION {} IS {}").format(
                psql.SQL(_VERSIONED), psql.Literal(f"agent-router functions {version()}")
            )
        )


def drop(conn: sa.Connection) -> None:
    """Drop every function of ours, all overloads (a downgrade to a release that calls none)."""
    with _cursor(conn) as cursor:
        found = cursor.execute(_OURS, {"names": list(names())}).fetchall()
        for (signature,) in found:
            # A signature as the catalog prints it (regprocedure), not text from outside.
            cursor.execute(psql.SQL("DROP FUNCTION {} CASCADE").format(psql.SQL(signature)))


def _cursor(conn: sa.Connection) -> Any:
    """A cursor of the driver's connection under ``conn`` (psycopg), in its transaction."""
    driver = conn.connection.driver_connection
    assert driver is not None
    return driver.cursor()


def installed(conn: sa.Connection) -> str | None:
    """The version of the functions installed in the database (``None``: none)."""
    comment = conn.execute(
        sa.text(
            "SELECT obj_description(p.oid, 'pg_proc') FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname = 'ar__now'"
        )
    ).scalar()
    if not isinstance(comment, str) or not comment.startswith("agent-router functions "):
        return None
    return comment.removeprefix("agent-router functions ")


@cache
def driver_sql(name: str, dialect: sa.Dialect) -> str:
    """The named statement as the driver takes it (``%(name)s`` placeholders), compiled once
    by SQLAlchemy for ``dialect``: a call sent on the driver's cursor with it skips compiling
    and processing its parameters each time."""
    return str(queries()[name].compile(dialect=dialect))


@cache
def queries() -> dict[str, sa.TextClause]:
    """The statements the store sends, by their names in ``postgresql/queries.sql``."""
    return {
        name: sa.text(body.strip()) for name, _comment, body in _NAMED.findall(_read("queries.sql"))
    }
