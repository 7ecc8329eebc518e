"""Two releases' store functions in one PostgreSQL database: an upgrade adds this release's set
beside the previous release's, which its workers go on calling; ``agent-router db upgrade
--finish`` drops every other set, the unversioned one of the releases before names had a
version included; a process of a release whose set is missing says so in one line with what
to run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from psycopg import sql as psql

from agent_router import Router, Settings, StoreError
from agent_router.ops import preflight
from agent_router.store import functions, migrate

CLI = str(Path(sys.executable).parent / "agent-router")

#: The version of a set another release installed.
OTHER = "0123456789abcdef"


@pytest.fixture
def engine(fresh_pg_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(fresh_pg_url)
    yield engine
    engine.dispose()


def _install_unversioned(conn: sa.Connection) -> None:
    """The functions as a release before names had versions installed them: the files' names
    as written, the version in the comment of ``ar__now``."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    cursor.execute(functions.source())
    cursor.execute("COMMENT ON FUNCTION ar__now() IS 'agent-router functions 00000000000000ff'")


def _install_other(conn: sa.Connection) -> None:
    """The set of another release whose names have a version (:data:`OTHER`)."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    cursor.execute(functions.versioned(functions.source(), OTHER))
    cursor.execute(
        psql.SQL("COMMENT ON FUNCTION {}() IS {}").format(
            psql.Identifier(functions.installed_name("ar__now", OTHER)),
            psql.Literal(f"agent-router functions {OTHER}"),
        )
    )


def _ours(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(sa.text("SELECT proname FROM pg_proc WHERE proname LIKE 'ar\\_%'"))
            .scalars()
            .all()
        )


def _call(conn: sa.Connection, query: str, release: str | None, **params: object) -> Any:
    """The named statement ``query`` sent to one set (``None``: the unversioned one)."""
    text = str(functions.queries()[query])
    text = text.replace(f"_v{functions.version()}", "" if release is None else f"_v{release}")
    return conn.execute(sa.text(text), params).scalar_one()


def _create_team(conn: sa.Connection, release: str | None) -> int:
    """A team made by a direct call of ``ar_create_team`` of one set."""
    result = _call(
        conn,
        "create_team",
        release,
        name="Team Leader",
        role="lead",
        system_prompt=None,
        runner=None,
        limits="{}",
        model=None,
        user_task=None,
    )
    return int(result["team"]["id"])


def _send(conn: sa.Connection, team: int, content: str) -> int:
    """A message to the team's lead through the unversioned ``ar_send``: its seq."""
    result = _call(
        conn,
        "send",
        None,
        team=team,
        to="Team Leader",
        sender="user",
        external=True,
        type="message",
        subtype=None,
        content=content,
        body=None,
        question_id=None,
        wake=False,
        dedup_key=None,
    )
    return int(result["delivery"]["seq"])


def test_an_upgrade_adds_its_set_beside_the_previous_releases(
    fresh_pg_url: str, engine: sa.Engine
) -> None:
    """The previous release (unversioned names) migrated the database and installed its set;
    this release's upgrade adds its own and drops nothing: both sets answer, on the same rows."""
    migrate.upgrade(fresh_pg_url)
    with engine.begin() as conn:
        functions.drop(conn)
        _install_unversioned(conn)
        _install_other(conn)
        old_team = _create_team(conn, None)
        assert _send(conn, old_team, "before the upgrade") == 1
    unversioned = {name for name in _ours(engine) if not name.endswith(f"_v{OTHER}")}
    assert unversioned == set(functions.names())

    migrate.upgrade(fresh_pg_url)

    with engine.connect() as conn:
        assert functions.installed(conn) == [functions.UNVERSIONED, OTHER, functions.version()]
        assert functions.is_installed(conn)
    check = preflight.schema(fresh_pg_url)
    assert check.ok and f"other releases (unversioned, {OTHER})" in check.detail
    assert "db upgrade --finish" in check.detail
    assert _ours(engine) == (
        set(functions.names())
        | {functions.installed_name(name, OTHER) for name in functions.names()}
        | {functions.installed_name(name) for name in functions.names()}
    )
    with engine.begin() as conn:
        # The previous release's calls go on, to the team this release made too.
        assert _send(conn, old_team, "after the upgrade") == 2
        assert _send(conn, _create_team(conn, functions.version()), "to a new team") == 1
    router = Router(Settings(database_url=fresh_pg_url), publisher=None)
    try:
        assert router.send(old_team, to="Team Leader", content="from this release").seq == 3
        assert [m.content for m in router.messages(old_team)] == [
            "before the upgrade",
            "after the upgrade",
            "from this release",
        ]
    finally:
        router.close()


def test_finish_drops_every_other_releases_set(fresh_pg_url: str, engine: sa.Engine) -> None:
    """``agent-router db upgrade --finish``: the unversioned set and another release's are
    dropped, this release's stays and serves; running it again drops nothing more."""
    migrate.upgrade(fresh_pg_url)
    with engine.begin() as conn:
        _install_unversioned(conn)
        _install_other(conn)
    run = [CLI, "db", "upgrade", "--finish", "--database-url", fresh_pg_url]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    dropped = 2 * len(functions.names())
    assert f"{dropped} store functions of other releases dropped" in done.stderr
    with engine.connect() as conn:
        assert functions.installed(conn) == [functions.version()]
    assert preflight.schema(fresh_pg_url).detail == "the router's tables and functions exist"
    assert _ours(engine) == {functions.installed_name(name) for name in functions.names()}
    router = Router(Settings(database_url=fresh_pg_url), publisher=None)
    try:
        team = router.create_team()
        assert router.send(team.id, to="Team Leader", content="go").seq == 1
    finally:
        router.close()
    assert migrate.finish_upgrade(fresh_pg_url) == []


def test_finish_is_refused_while_this_releases_set_is_missing(
    fresh_pg_url: str, engine: sa.Engine
) -> None:
    """Dropping the other sets would leave none: refused, nothing dropped."""
    migrate.upgrade(fresh_pg_url)
    with engine.begin() as conn:
        functions.drop(conn)
        _install_unversioned(conn)
    before = _ours(engine)
    with engine.begin() as conn, pytest.raises(StoreError, match="run `agent-router db upgrade`"):
        migrate.finish_upgrade_connection(conn)
    assert _ours(engine) == before


def test_a_worker_of_a_release_whose_set_is_missing_refuses_in_one_line(
    fresh_pg_url: str, engine: sa.Engine, redis_url: str
) -> None:
    """Only another release's set installed: the worker's preflight refuses to start (one
    line, naming the sets found and what to run), and a call says what to run."""
    migrate.upgrade(fresh_pg_url)
    with engine.begin() as conn:
        functions.drop(conn)
        _install_unversioned(conn)
    check = preflight.schema(fresh_pg_url)
    assert not check.ok
    assert "only other releases' agent-router functions (unversioned)" in check.detail
    assert functions.version() in check.detail and "agent-router db upgrade" in check.hint
    run = [CLI, "worker", "--database-url", fresh_pg_url, "--broker-url", redis_url]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "agent-router db upgrade" in lines[0], done.stderr
    router = Router(Settings(database_url=fresh_pg_url), publisher=None)
    try:
        with pytest.raises(StoreError, match=r"lacks this release's store functions .*db upgrade"):
            router.create_team()
    finally:
        router.close()


def test_a_newer_releases_revision_passes_while_this_releases_set_is_there(
    fresh_pg_url: str, engine: sa.Engine
) -> None:
    """A newer release upgraded the schema (a revision this release does not know) and added
    its set beside this one's: this release's workers may still start; once that release
    finished the upgrade (this set gone), they may not."""
    migrate.upgrade(fresh_pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999'"))
    assert preflight.schema(fresh_pg_url).ok
    with engine.begin() as conn:
        functions.drop(conn)
        _install_other(conn)
    check = preflight.schema(fresh_pg_url)
    assert not check.ok and f"({OTHER})" in check.detail
