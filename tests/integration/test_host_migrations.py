"""A host's Alembic project and the router migrate the same PostgreSQL database, in both orders,
from the CLI and from the host's own ``env.py``; a database migrated when the router's revision
lived in ``alembic_version`` keeps its state; a failed migration is one line on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from agent_router import Router, Settings
from agent_router.store import migrate

CLI = str(Path(sys.executable).parent / "agent-router")

ENV_PY = """
from alembic import context
from sqlalchemy import create_engine, pool

WITH_ROUTER = {with_router}

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url, poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
    if WITH_ROUTER:
        from agent_router.store import migrate

        migrate.upgrade_connection(connection)
"""

REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "{rev}"
down_revision = {down!r}
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("{table}", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("{table}")
"""


def _host_project(root: Path, url: str, *, with_router: bool = False) -> Config:
    """A chat backend's Alembic project: two revisions of its own, default version table."""
    (root / "versions").mkdir(parents=True)
    (root / "env.py").write_text(ENV_PY.format(with_router=with_router))
    (root / "script.py.mako").write_text("")
    for rev, down, table in (("a1", None, "chat_rooms"), ("b2", "a1", "chat_messages")):
        (root / "versions" / f"{rev}.py").write_text(
            REVISION.format(rev=rev, down=down, table=table)
        )
    cfg = Config()
    cfg.set_main_option("script_location", str(root))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    return subprocess.run(
        [CLI, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **(env or {})},
    )


def _revisions(url: str) -> dict[str, set[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            return {
                table: {r for (r,) in conn.execute(sa.text(f"SELECT version_num FROM {table}"))}
                for table in ("alembic_version", migrate.VERSION_TABLE)
                if inspector.has_table(table)
            }
    finally:
        engine.dispose()


def _head() -> str:
    head = ScriptDirectory(str(migrate.MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def _router_works(url: str) -> None:
    router = Router(Settings(database_url=url))
    try:
        team = router.create_team()
        assert router.agents(team.id)[0].display_name == "Team Leader"
    finally:
        router.close()


@pytest.mark.parametrize("router_first", [False, True], ids=["host-first", "router-first"])
def test_host_and_router_migrate_the_same_database_in_either_order(
    fresh_pg_url: str, tmp_path: Path, router_first: bool
) -> None:
    host = _host_project(tmp_path / "host", fresh_pg_url)
    steps = ["router", "host"] if router_first else ["host", "router"]
    for step in [*steps, *steps]:  # and again: each is a no-op the second time
        if step == "host":
            command.upgrade(host, "head")
        else:
            done = _cli("db", "upgrade", "--database-url", fresh_pg_url)
            assert done.returncode == 0, done.stderr
    assert _revisions(fresh_pg_url) == {
        "alembic_version": {"b2"},
        migrate.VERSION_TABLE: {_head()},
    }
    # Either side can step back through its own history without touching the other's.
    command.downgrade(host, "a1")
    assert _revisions(fresh_pg_url)[migrate.VERSION_TABLE] == {_head()}
    _router_works(fresh_pg_url)


def test_a_hosts_env_py_runs_the_routers_migrations(fresh_pg_url: str, tmp_path: Path) -> None:
    host = _host_project(tmp_path / "host", fresh_pg_url, with_router=True)
    command.upgrade(host, "head")
    command.upgrade(host, "head")  # nothing left to do on either side
    assert _revisions(fresh_pg_url) == {
        "alembic_version": {"b2"},
        migrate.VERSION_TABLE: {_head()},
    }
    assert migrate.current(fresh_pg_url) == _head()
    _router_works(fresh_pg_url)


def _as_before_the_own_table(url: str, *, host_revision: str | None) -> None:
    """The state a database migrated by an earlier release is in: the router's revision in
    ``alembic_version`` (beside a host's, when the host had one)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {migrate.VERSION_TABLE}"))
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS alembic_version (version_num text)"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES (:r)"), {"r": _head()})
        if host_revision:
            conn.execute(sa.text("INSERT INTO alembic_version VALUES (:r)"), {"r": host_revision})
    engine.dispose()


@pytest.mark.parametrize("host_revision", [None, "b2"], ids=["router-only", "shared"])
def test_upgrade_moves_the_routers_revision_out_of_alembic_version(
    fresh_pg_url: str, host_revision: str | None
) -> None:
    migrate.upgrade(fresh_pg_url)
    _router_works(fresh_pg_url)
    _as_before_the_own_table(fresh_pg_url, host_revision=host_revision)
    # The schema is at head already: re-running 0001 would fail on the existing tables.
    done = _cli("db", "upgrade", "--database-url", fresh_pg_url)
    assert done.returncode == 0, done.stderr
    expected = {migrate.VERSION_TABLE: {_head()}}
    if host_revision:
        expected["alembic_version"] = {host_revision}
    assert _revisions(fresh_pg_url) == expected
    _router_works(fresh_pg_url)


def test_a_failed_migration_is_one_line_unless_a_traceback_is_asked_for(
    fresh_pg_url: str,
) -> None:
    done = _cli("db", "upgrade", "--database-url", fresh_pg_url, "--revision", "nope")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        "agent-router: error: migration error: Can't locate revision identified by 'nope'"
    )
    for extra_args, env in (
        (["--traceback"], None),
        ([], {"AGENT_ROUTER_TRACEBACK": "1"}),
    ):
        args = [*extra_args, "db", "upgrade", "--database-url", fresh_pg_url, "--revision", "x"]
        traced = _cli(*args, env=env)
        assert traced.returncode == 1
        assert "Traceback (most recent call last)" in traced.stderr
        assert "CommandError" in traced.stderr
