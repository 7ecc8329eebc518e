"""Alembic environment: the URL comes from the Config's ``sqlalchemy.url`` (set by
:func:`agent_router.store.migrate.alembic_config`) or from ``AGENT_ROUTER_DATABASE_URL``.
Revisions are recorded in the router's own version table, never in ``alembic_version``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool

from agent_router.settings import Settings
from agent_router.store.migrate import (
    VERSION_TABLE,
    adopt_default_version_table,
    install_functions_at_head,
)
from agent_router.store.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url") or Settings().database_url
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(
        url=url, target_metadata=target_metadata, literal_binds=True, version_table=VERSION_TABLE
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        # Nothing prepared on the server: a migration runs its statements once, and a statement
        # prepared on a pooler's server connection would stay there for another client to trip on.
        connect_args = {} if url.startswith("sqlite") else {"prepare_threshold": None}
        engine = engine_from_config(
            {"sqlalchemy.url": url},
            prefix="sqlalchemy.",
            poolclass=pool.NullPool,
            connect_args=connect_args,
        )
        with engine.connect() as connection:
            _run(connection)
    else:
        _run(connectable)


def _run(connection: Connection) -> None:
    # A database migrated when the router's revision lived in `alembic_version` keeps its state.
    adopt_default_version_table(connection)
    if connection.in_transaction():
        connection.commit()
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite alters tables by copying them
    )
    with context.begin_transaction():
        context.run_migrations()
        install_functions_at_head(connection)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
