"""The router's Alembic history, run three ways: ``agent-router db upgrade`` (the CLI),
:func:`upgrade` from Python, and :func:`upgrade_connection` from a host's own Alembic ``env.py``;
and :func:`include_name` / :func:`include_object`, which keep the router's tables out of a host's
autogenerate and ``alembic check``.

An upgrade runs while the previous release's workers still run (a rolling deploy): it migrates
the schema, which every migration leaves usable by the previous release
(:mod:`agent_router.store.migrations` says what a migration may do), and *adds* this release's
store functions beside the previous release's (:mod:`~agent_router.store.functions`). Once the
old workers stopped, :func:`finish_upgrade` (``agent-router db upgrade --finish``) drops every
other release's functions.

Its revisions are recorded in a version table of its own, :data:`VERSION_TABLE`, so a host's
Alembic history (in the default ``alembic_version``) and the router's never see each other's
revisions, whichever migrates first. A database migrated before the router had its own table
keeps its state: the first upgrade moves the router's revision out of ``alembic_version``
(:func:`adopt_default_version_table`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.pool import NullPool

from agent_router.logfields import get_logger
from agent_router.store import functions

MIGRATIONS = Path(__file__).parent / "migrations"

#: Where the router's Alembic revision is recorded (never the host's ``alembic_version``).
VERSION_TABLE = "agent_router_alembic_version"

#: Alembic's default version table: where releases before :data:`VERSION_TABLE` kept theirs.
DEFAULT_VERSION_TABLE = "alembic_version"

#: Every table of the router starts with this (its version table is :data:`VERSION_TABLE`).
TABLE_PREFIX = "ar_"

logger = get_logger(__name__)


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def finish_upgrade(database_url: str) -> list[str]:
    """Upgrade to the newest revision, then drop every store function of other releases, once
    none of their workers runs (on SQLite, which has none, only the upgrade). Returns the
    signatures dropped."""
    upgrade(database_url)
    if not database_url.startswith("postgresql"):
        return []
    engine = sa.create_engine(database_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            return finish_upgrade_connection(conn)
    finally:
        engine.dispose()


def finish_upgrade_connection(connection: sa.Connection) -> list[str]:
    """:func:`finish_upgrade` on a host's ``connection`` (after :func:`upgrade_connection`), in
    its transaction (the caller commits): every store function of another release dropped.
    Refused (:class:`~agent_router.errors.StoreError`, nothing dropped) unless this release's
    are installed."""
    if connection.dialect.name != "postgresql":
        return []
    dropped = functions.drop_others(connection)
    logger.info(
        "store functions of other releases dropped",
        extra={"action": "migrate", "dropped": len(dropped), "kept": functions.version()},
    )
    return dropped


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


def current(database_url: str) -> str | None:
    """The router's revision in the database (``None`` before its first migration)."""
    engine = sa.create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision this release ships."""
    found = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert found is not None  # the history is never empty
    return found


def is_known(revision: str) -> bool:
    """Whether ``revision`` is in this release's history (an unknown one is a newer
    release's)."""
    return any(
        rev.revision == revision for rev in ScriptDirectory(str(MIGRATIONS)).walk_revisions()
    )


def upgrade_connection(connection: sa.Connection, revision: str = "head") -> None:
    """Upgrade the router's schema on a host's ``connection``: for a host's Alembic ``env.py``,
    called after its own ``context.run_migrations()`` (it commits its own transaction)::

        with context.begin_transaction():
            context.run_migrations()
        agent_router.store.migrate.upgrade_connection(connection)

    It uses neither the host's ``context`` nor its version table."""
    adopt_default_version_table(connection)
    script = ScriptDirectory(str(MIGRATIONS))

    def steps(heads: Any, _context: MigrationContext) -> Any:
        return script._upgrade_revs(revision, heads)

    ctx = MigrationContext.configure(
        connection,
        opts={"version_table": VERSION_TABLE, "fn": steps, "render_as_batch": True},
    )
    with Operations.context(ctx), ctx.begin_transaction():
        ctx.run_migrations()
        install_functions_at_head(connection)
    if connection.in_transaction():
        connection.commit()


def install_functions_at_head(connection: sa.Connection) -> None:
    """On PostgreSQL, once the schema is at this release's newest revision: install this
    release's functions (the store's transitions), in the migration's transaction, beside other
    releases' (:func:`finish_upgrade` drops those). At an older revision the release that
    migrated there installs its own."""
    if connection.dialect.name != "postgresql":
        return
    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    if ctx.get_current_revision() == head():
        functions.install(connection)


def adopt_default_version_table(connection: sa.Connection) -> bool:
    """Move the router's revision from ``alembic_version`` to :data:`VERSION_TABLE`, once.

    Only a revision of the router's own history moves; a host's revision stays where it is,
    and ``alembic_version`` is dropped only if the router's row was all it held. Runs in the
    connection's transaction (the caller commits). Returns whether anything moved."""
    inspector = sa.inspect(connection)
    if not inspector.has_table(DEFAULT_VERSION_TABLE) or inspector.has_table(VERSION_TABLE):
        return False
    ours = {rev.revision for rev in ScriptDirectory(str(MIGRATIONS)).walk_revisions()}
    legacy = sa.table(DEFAULT_VERSION_TABLE, sa.column("version_num", sa.String(32)))
    found = [r for (r,) in connection.execute(sa.select(legacy.c.version_num)) if r in ours]
    if not found:
        return False
    version = sa.Table(
        VERSION_TABLE,
        sa.MetaData(),
        sa.Column("version_num", sa.String(32), primary_key=True),
    )
    version.create(connection)
    connection.execute(version.insert(), [{"version_num": r} for r in found])
    connection.execute(legacy.delete().where(legacy.c.version_num.in_(found)))
    if connection.execute(sa.select(sa.func.count()).select_from(legacy)).scalar() == 0:
        connection.execute(sa.text(f"DROP TABLE {DEFAULT_VERSION_TABLE}"))
    logger.info(
        "router revision moved to its own version table",
        extra={"action": "migrate", "revisions": found, "table": VERSION_TABLE},
    )
    return True


def is_router_table(name: str | None) -> bool:
    """Is ``name`` one of the router's tables (its own version table included)?"""
    return name is not None and (name.startswith(TABLE_PREFIX) or name == VERSION_TABLE)


def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
    """For a host's Alembic ``context.configure(include_name=include_name, ...)``: the router's
    tables, and everything on them, are left out of what the host's autogenerate compares, so
    the host's ``alembic revision --autogenerate`` never drops them and its ``alembic check``
    stays clean. They are the router's history's (:func:`upgrade_connection`)."""
    if type_ == "table":
        return not is_router_table(name)
    return not is_router_table(parent_names.get("table_name"))


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """The same for a host whose ``env.py`` filters with ``include_object``: ``False`` for a
    router table and what is on it (a host's own filter can call this first)."""
    if type_ == "table":
        return not is_router_table(name)
    table = getattr(obj, "table", None)
    return not is_router_table(getattr(table, "name", None))
