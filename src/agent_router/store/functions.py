"""The store's transitions on PostgreSQL: functions of the database, and the named statements
that call them.

Every transition is a PL/pgSQL function holding all of its branches (``postgresql/*.sql``, a
file per group of transitions, as ``routing.py``, ``turns.py``, ... group them for SQLite); a
call is one statement, so a transition sent alone is one round trip whatever branch it takes.
The statements the store sends are named in ``postgresql/queries.sql``.

The functions are code, not schema, and each release's live beside the others': during a
rolling deploy the previous release's workers go on calling theirs while the new release's
start calling its own. A release's functions are installed under names of their own: every
function the files define, ``ar_send`` or ``ar__route``, is installed as ``ar_send_v<version>``
(:func:`installed_name`), where the version is the digest of the files' text
(:func:`version`), and the named statements call those names (:func:`versioned` rewrites both
texts the same way when they are read). The names are derived, not written: a function added
to the files is versioned with the others, and no release's author has to bump a number.
A digest of the whole set rather than a number per function (procrastinate's
``procrastinate_fetch_job_v2``): the pieces call one another, so a release's set is
self-contained only if every name in it changes whenever any text in it changes; two
processes of one release agree on the names without asking the database; and two releases
whose functions are the same text share one set. Names rather than a schema per release: a
schema needs the right to create one in the host's database, and calling into it by the
session's ``search_path`` is state a pooler in transaction mode does not keep.

Upgrading *adds*: every upgrade that reaches the newest revision (``agent-router db upgrade``,
a host's Alembic run through :func:`~agent_router.store.migrate.upgrade_connection`) and
:meth:`~agent_router.store.Store.create_schema` install this release's set (:func:`install`)
and leave every other release's alone, the unversioned functions of releases before names had
versions (``ar_send``, ...) included. A later step removes what only old releases call, once
their workers stopped: :func:`drop_others` (``agent-router db upgrade --finish``,
:func:`~agent_router.store.migrate.finish_upgrade`). :func:`is_installed` tells whether a
database holds this release's set, :func:`installed` which sets it holds.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from typing import Any

import sqlalchemy as sa
from psycopg import sql as psql

from agent_router.errors import StoreError

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
    "lifecycle.sql",
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


#: The longest name PostgreSQL keeps (NAMEDATALEN - 1): a longer one would be cut short.
MAX_NAME = 63


@cache
def installed_name(name: str, release: str | None = None) -> str:
    """The name ``name`` (a function of the files) is installed under in this release (or in
    the release whose version is ``release``)."""
    installed = f"{name}_v{release or version()}"
    if len(installed) > MAX_NAME:
        raise ValueError(
            f"the function {name} would be installed as {installed}, longer than PostgreSQL's "
            f"{MAX_NAME} characters: give it a shorter name in its file"
        )
    return installed


@cache
def _names_pattern() -> re.Pattern[str]:
    # A whole identifier only: ar_send is not rewritten inside ar_send_many or ar_sends.
    return re.compile(r"\b(" + "|".join(map(re.escape, names())) + r")\b")


def versioned(text: str, release: str | None = None) -> str:
    """``text`` (SQL) with every function of the files called by its installed name in this
    release (or in ``release``); the tables and types (``ar_agents``, ``ar_message_type``) are
    not functions and stay."""
    return _names_pattern().sub(lambda found: installed_name(found.group(1), release), text)


#: Our functions in the database's schema, with their signatures, whatever release installed
#: them: every versioned name, and every ``ar__*`` piece and function the files name without
#: a version (the releases before names had one); but the names that match ``kept``.
_OURS = """
SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = current_schema()
  AND (p.proname ~ '^ar_[a-z_]+_v[0-9a-f]{16}$'
       OR p.proname LIKE 'ar\\_\\_%%' OR p.proname = ANY (%(names)s))
  AND p.proname !~ %(kept)s
ORDER BY 1
"""

#: The function whose comment holds the version of its set (``ar__now_v<version>``, or
#: ``ar__now`` for the unversioned set).
_MARKED = "ar__now"

#: The comment that marks a set as installed, set last in the transaction that installs it.
_MARK = "agent-router functions "


def install(conn: sa.Connection) -> None:
    """Install this release's functions on ``conn`` (PostgreSQL), in its transaction, beside
    whatever other releases' the database holds (installing again replaces this release's
    with the same)."""
    with _cursor(conn) as cursor:
        cursor.execute(versioned(source()))
        cursor.execute(
            psql.SQL("COMMENT ON FUNCTION {}() IS {}").format(
                psql.Identifier(installed_name(_MARKED)), psql.Literal(_MARK + version())
            )
        )


def drop(conn: sa.Connection) -> list[str]:
    """Drop every function of ours, every release's, all overloads (a downgrade to a release
    that calls none). Returns the signatures dropped."""
    return _drop(conn, keep=None)


def drop_others(conn: sa.Connection) -> list[str]:
    """Drop every function of ours but this release's set: what only older releases call, once
    none of their workers runs. Refused (:class:`~agent_router.errors.StoreError`, nothing
    dropped) unless this release's set is installed, which would leave none. Returns the
    signatures dropped."""
    if not is_installed(conn):
        raise StoreError(
            f"this release's store functions ({version()}) are not installed, so none would be "
            "left: run `agent-router db upgrade` first"
        )
    return _drop(conn, keep=version())


def _drop(conn: sa.Connection, *, keep: str | None) -> list[str]:
    with _cursor(conn) as cursor:
        kept = "^$" if keep is None else f"_v{keep}$"  # "^$": no name
        found = cursor.execute(_OURS, {"names": list(names()), "kept": kept}).fetchall()
        for (signature,) in found:
            # A signature as the catalog prints it (regprocedure), not text from outside.
            cursor.execute(psql.SQL("DROP FUNCTION {} CASCADE").format(psql.SQL(signature)))
    return [signature for (signature,) in found]


def _cursor(conn: sa.Connection) -> Any:
    """A cursor of the driver's connection under ``conn`` (psycopg), in its transaction."""
    driver = conn.connection.driver_connection
    assert driver is not None
    return driver.cursor()


#: How :func:`installed` names the set of a release before names had versions.
UNVERSIONED = "unversioned"


def installed(conn: sa.Connection) -> list[str]:
    """The sets of functions the database holds: their versions, in the order they were
    installed, and :data:`UNVERSIONED` for one whose names have none; empty: none."""
    rows = conn.execute(
        sa.text(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND (p.proname = :marked OR p.proname ~ :named) "
            "AND obj_description(p.oid, 'pg_proc') LIKE :mark ORDER BY p.oid"
        ),
        {"marked": _MARKED, "named": f"^{_MARKED}_v[0-9a-f]{{16}}$", "mark": f"{_MARK}%"},
    ).scalars()
    return [UNVERSIONED if name == _MARKED else name.removeprefix(f"{_MARKED}_v") for name in rows]


def is_installed(conn: sa.Connection) -> bool:
    """Whether the database holds this release's set of functions."""
    return version() in installed(conn)


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
        name: sa.text(versioned(body.strip()))
        for name, _comment, body in _NAMED.findall(_read("queries.sql"))
    }
