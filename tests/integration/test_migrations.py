"""`alembic upgrade head` produces the schema the models describe, on both backends."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from agent_router import Router, Settings, StoreError
from agent_router.domain import LedgerAction
from agent_router.ops import preflight
from agent_router.store import functions, migrations
from agent_router.store.migrate import VERSION_TABLE, downgrade, upgrade
from agent_router.store.models import Base

from ..conftest import _new_database


def _diff(url: str) -> list[object]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "version_table": VERSION_TABLE}
            )
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_head_matches_models_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    assert _diff(url) == []


def test_upgrade_head_matches_models_on_postgresql(fresh_pg_url: str) -> None:
    upgrade(fresh_pg_url)
    assert _diff(fresh_pg_url) == []
    # Alembic does not compare enum labels: check every enum type against its Python enum.
    engine = sa.create_engine(fresh_pg_url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT t.typname, e.enumlabel FROM pg_type t JOIN pg_enum e "
                "ON e.enumtypid = t.oid ORDER BY t.typname, e.enumsortorder"
            )
        ).all()
    engine.dispose()
    in_db: dict[str, list[str]] = {}
    for typname, label in rows:
        in_db.setdefault(typname, []).append(label)
    in_models = {
        col.type.name: list(col.type.enums)
        for table in Base.metadata.tables.values()
        for col in table.columns
        if isinstance(col.type, sa.Enum)
    }
    assert in_db == in_models


def test_downgrade_base_removes_everything(fresh_pg_url: str) -> None:
    upgrade(fresh_pg_url)
    downgrade(fresh_pg_url, "base")
    engine = sa.create_engine(fresh_pg_url)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names()) - {VERSION_TABLE}
        enums = conn.execute(sa.text("SELECT count(*) FROM pg_type WHERE typname LIKE 'ar_%'"))
        assert (tables, enums.scalar()) == (set(), 0)
    engine.dispose()


def test_budget_events_fit_a_migrated_database_and_0004_goes_back(
    tmp_path: Path, fresh_pg_url: str
) -> None:
    """SQLite checks enum labels with a CHECK constraint, PostgreSQL with its enum type: both
    take the ledger actions 0004 adds, and lose them again on the way down."""
    from agent_router import Router, Settings
    from agent_router.domain import BudgetName, LedgerAction

    for url in (f"sqlite:///{tmp_path / 'b.db'}", fresh_pg_url):
        upgrade(url)
        router = Router(Settings(database_url=url))
        team = router.create_team(budget={BudgetName.MODEL_CALLS: 0})
        router.send(team.id, to="Team Leader", content="go")
        assert router.claim_turn(team.id, "Team Leader") is None
        actions = [e.action for e in router.ledger(team.id)]
        assert LedgerAction.BUDGET_EXHAUSTED in actions
        router.close()
        downgrade(url, "0003")
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        engine.dispose()
        assert not {"ar_budgets", "ar_model_calls"} & tables
        upgrade(url)
        assert _diff(url) == []


def _revision(name: str) -> ModuleType:
    path = Path(migrations.__file__).parent / "versions" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"revision_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_revision_states_the_ledger_labels_it_starts_from(fresh_pg_url: str) -> None:
    """0004 starts from the ledger actions a database at 0001 holds and adds its own: the labels
    of today's code are exactly those, so a new label needs a new revision."""
    budgets = _revision("0004_budgets_usage")
    upgrade(fresh_pg_url, "0001")
    engine = sa.create_engine(fresh_pg_url)
    with engine.connect() as conn:
        at_0001 = conn.execute(
            sa.text(
                "SELECT e.enumlabel FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid "
                "WHERE t.typname = 'ar_ledger_action' ORDER BY e.enumsortorder"
            )
        ).scalars()
        assert tuple(at_0001) == budgets.OLD_ACTIONS
    engine.dispose()
    bulkheads = _revision("0009_sweep_bulkheads")
    assert (*budgets.OLD_ACTIONS, *budgets.NEW_ACTIONS) == bulkheads.OLD_ACTIONS
    channel = _revision("0013_user_channel")
    assert (*bulkheads.OLD_ACTIONS, *bulkheads.NEW_ACTIONS) == channel.OLD_ACTIONS
    (added,) = [
        label for _table, _column, name, _old, label in channel.LABELS if name == "ar_ledger_action"
    ]
    assert [a.value for a in LedgerAction] == [*channel.OLD_ACTIONS, added]


def test_0005_counts_each_transcript_from_the_entries_it_already_holds(
    tmp_path: Path, fresh_pg_url: str
) -> None:
    """An agent whose transcript was written before 0005 gets its next position from its last
    entry: the next append after the upgrade goes after it, on both backends; 0005 goes back."""
    from agent_router import Router, Settings

    for url in (f"sqlite:///{tmp_path / 'p.db'}", fresh_pg_url):
        upgrade(url)
        router = Router(Settings(database_url=url))
        team = router.create_team(lead_system_prompt="You lead.")
        router.send(team.id, to="Team Leader", content="first")
        turn = router.claim_turn(team.id, "Team Leader")
        assert turn is not None
        turn.drain()
        turn.append_assistant({"role": "assistant", "content": "done"})
        turn.end()
        router.close()
        downgrade(url, "0004")
        upgrade(url)
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            counters = conn.execute(
                sa.text("SELECT display_name, next_position FROM ar_agents ORDER BY id")
            ).all()
        engine.dispose()
        # The system prompt, the message and the reply: positions 0 to 2.
        assert counters == [("Team Leader", 3)]
        router = Router(Settings(database_url=url))
        router.send(team.id, to="Team Leader", content="second")
        turn = router.claim_turn(team.id, "Team Leader")
        assert turn is not None
        turn.drain()
        turn.append_assistant({"role": "assistant", "content": "again"})
        entries = router.store.reads.transcript_entries(turn.agent_id)
        router.close()
        assert [e["position"] for e in entries] == [0, 1, 2, 3, 4]
        assert [e["payload"]["role"] for e in entries][2:] == ["assistant", "user", "assistant"]
        assert entries[-1]["payload"]["content"] == "again"


def test_0006_moves_each_agent_rows_foreign_keys_from_the_team_to_the_agent(
    tmp_path: Path, fresh_pg_url: str
) -> None:
    """Before 0006 a row of an agent has a foreign key on its team and one on its agent; after
    it, one on the agent's (id, team_id) and none on ar_teams; 0006 goes back; on both
    backends, with a team's rows in the database."""
    from agent_router import Router, Settings

    def keys(url: str) -> dict[str, set[tuple[str, tuple[str, ...]]]]:
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            found = {
                table: {
                    (fk["referred_table"], tuple(fk["constrained_columns"]))
                    for fk in inspector.get_foreign_keys(table)
                    if fk["referred_table"] in ("ar_teams", "ar_agents")
                }
                for table in ("ar_messages", "ar_turns", "ar_ledger", "ar_model_calls")
            }
        engine.dispose()
        return found

    for url in (f"sqlite:///{tmp_path / 'k.db'}", fresh_pg_url):
        upgrade(url)
        router = Router(Settings(database_url=url))
        team = router.create_team()
        router.create_agent(team.id, role="Engineer")
        router.send(team.id, to="Engineer_1", content="build it", sender="Team Leader")
        router.close()
        assert keys(url) == {
            "ar_messages": {
                ("ar_agents", ("source_agent_id", "team_id")),
                ("ar_agents", ("target_agent_id", "team_id")),
            },
            "ar_turns": {("ar_agents", ("agent_id", "team_id"))},
            "ar_ledger": {("ar_agents", ("agent_id", "team_id"))},
            "ar_model_calls": {("ar_agents", ("agent_id", "team_id"))},
        }
        downgrade(url, "0005")
        assert keys(url) == {
            "ar_messages": {
                ("ar_teams", ("team_id",)),
                ("ar_agents", ("source_agent_id",)),
                ("ar_agents", ("target_agent_id",)),
            },
            "ar_turns": {("ar_teams", ("team_id",)), ("ar_agents", ("agent_id",))},
            "ar_ledger": {("ar_teams", ("team_id",)), ("ar_agents", ("agent_id",))},
            "ar_model_calls": {("ar_teams", ("team_id",)), ("ar_agents", ("agent_id",))},
        }
        upgrade(url)
        router = Router(Settings(database_url=url))
        assert [m.content for m in router.messages(team.id)] == ["build it"]
        router.close()


def _installed(url: str) -> tuple[list[str], set[str]]:
    """The sets of the store's functions a database holds, and the names of ours in it."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            names = set(
                conn.execute(
                    sa.text("SELECT proname FROM pg_proc WHERE proname LIKE 'ar\\_%'")
                ).scalars()
            )
            return functions.installed(conn), names
    finally:
        engine.dispose()


def test_an_upgrade_installs_the_functions_and_0006_takes_them_away(fresh_pg_url: str) -> None:
    """The store's functions come with every upgrade to the newest revision, under this
    release's names; going back to a release that calls none removes them all, and upgrading
    again brings this release's."""
    upgrade(fresh_pg_url)
    sets, names = _installed(fresh_pg_url)
    assert sets == [functions.version()]
    assert names == {functions.installed_name(name) for name in functions.names()}
    assert {"ar_send", "ar_claim", "ar_end"}.isdisjoint(names)
    downgrade(fresh_pg_url, "0006")
    assert _installed(fresh_pg_url) == ([], set())
    upgrade(fresh_pg_url)
    assert _installed(fresh_pg_url)[0] == [functions.version()]


def test_a_database_without_this_releases_functions_says_what_to_run(fresh_pg_url: str) -> None:
    """Tables at the newest revision but the functions missing (dropped by hand, or a schema
    made by another release's create_schema): the preflight check and a send both say to run
    `agent-router db upgrade`; after it, the send goes through."""
    upgrade(fresh_pg_url)
    engine = sa.create_engine(fresh_pg_url)
    with engine.begin() as conn:
        functions.drop(conn)
    engine.dispose()
    check = preflight.schema(fresh_pg_url)
    assert not check.ok and "none of agent-router's functions" in check.detail
    assert "db upgrade" in check.hint
    router = Router(Settings(database_url=fresh_pg_url))
    try:
        with pytest.raises(StoreError, match="agent-router db upgrade"):
            router.create_team()
        upgrade(fresh_pg_url)
        assert preflight.schema(fresh_pg_url).ok
        team = router.create_team()
        assert router.send(team.id, to="Team Leader", content="go").seq == 1
    finally:
        router.close()


def _agents_options(url: str) -> list[str] | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found: list[str] | None = conn.execute(
                sa.text("SELECT reloptions FROM pg_class WHERE relname = 'ar_agents'")
            ).scalar_one()
            return found
    finally:
        engine.dispose()


def test_ar_agents_leaves_room_for_hot_updates_after_upgrade_and_create_schema(
    fresh_pg_url: str,
) -> None:
    """0010 sets ar_agents' fillfactor as create_schema does; going back resets it."""
    from agent_router.store.models import AGENTS_FILLFACTOR

    upgrade(fresh_pg_url)
    assert _agents_options(fresh_pg_url) == [f"fillfactor={AGENTS_FILLFACTOR}"]
    downgrade(fresh_pg_url, "0009")
    assert _agents_options(fresh_pg_url) is None
    upgrade(fresh_pg_url)
    assert _agents_options(fresh_pg_url) == [f"fillfactor={AGENTS_FILLFACTOR}"]
    with _new_database("ar_fill") as url:
        router = Router(Settings(database_url=url))
        router.create_schema()
        router.close()
        assert _agents_options(url) == [f"fillfactor={AGENTS_FILLFACTOR}"]


#: The tables whose ids the database gives: revision 0014 gives them AUTOINCREMENT on SQLite.
ID_TABLES = _revision("0014_sqlite_ids_never_reused").TABLES


def _table_schema(inspector: sa.Inspector, table: str) -> tuple[object, ...]:
    """A table's columns, primary key, indexes, unique, foreign key and CHECK constraints, each
    as a sorted list (a copy may list them in another order)."""
    columns = inspector.get_columns(table)
    foreign_keys = inspector.get_foreign_keys(table)
    return (
        sorted((c["name"], str(c["type"]), c["nullable"], c["default"]) for c in columns),
        inspector.get_pk_constraint(table)["constrained_columns"],
        sorted(
            (i["name"], tuple(i["column_names"]), i["unique"]) for i in inspector.get_indexes(table)
        ),
        sorted(
            (u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(table)
        ),
        sorted(
            (
                k["name"],
                k["referred_table"],
                *k["constrained_columns"],
                "->",
                *k["referred_columns"],
            )
            for k in foreign_keys
        ),
        sorted((c["name"], c["sqltext"]) for c in inspector.get_check_constraints(table)),
    )


def _sqlite_state(url: str) -> tuple[dict[str, object], dict[str, list[tuple[Any, ...]]]]:
    """The schema of each of the router's tables and its rows."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            tables = sorted(t for t in inspector.get_table_names() if t.startswith("ar_"))
            schema: dict[str, object] = {t: _table_schema(inspector, t) for t in tables}
            rows = {
                t: [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY 1"))]
                for t in tables
            }
    finally:
        engine.dispose()
    return schema, rows


def _sequence(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT name, seq FROM sqlite_sequence"))
            return {name: seq for name, seq in found}
    finally:
        engine.dispose()


def _busy_team(router: Router) -> int:
    team = router.create_team(lead_system_prompt="You lead.")
    router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Team Leader", content="plan it")
    turn = router.claim_turn(team.id, "Team Leader")
    assert turn is not None
    turn.drain()
    router.tell_user(turn, "on it")
    router.send(team.id, to="Engineer_1", content="build it", sender="Team Leader")
    return team.id


def test_0014_copies_sqlite_tables_into_ones_that_never_give_an_id_twice(tmp_path: Path) -> None:
    """A SQLite database at 0013 with teams in it (its newest deleted before the upgrade: the
    ids that team had are known nowhere, the limit of the upgrade): after 0014 every table keeps
    its rows, columns, indexes and constraints, has AUTOINCREMENT like a new database's, and
    remembers its largest id; the newest team deleted after it, the next team's ids are all
    above that team's. 0014 goes back, to the same tables without it."""
    url = f"sqlite:///{tmp_path / 'ids.db'}"
    upgrade(url, "0013")
    router = Router(Settings(database_url=url))
    first = _busy_team(router)
    second = _busy_team(router)
    router.delete_team(_busy_team(router), include_undelivered=True)
    router.close()
    schema, rows = _sqlite_state(url)

    upgrade(url)
    assert _sqlite_state(url) == (schema, rows)
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    Router(Settings(database_url=fresh)).create_schema()
    assert _sqlite_state(fresh)[0] == schema
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        ddl = {n: sql for n, sql in conn.execute(sa.text("SELECT name, sql FROM sqlite_master"))}
        assert conn.execute(sa.text("PRAGMA foreign_key_check")).all() == []
    engine.dispose()
    assert {t for t in ID_TABLES if "AUTOINCREMENT" in ddl[t]} == set(ID_TABLES)
    largest = {table: max((r[0] for r in rows[table]), default=0) for table in ID_TABLES}
    assert _sequence(url) == largest

    router = Router(Settings(database_url=url))
    router.delete_team(second, include_undelivered=True)
    before = _sqlite_state(url)[1]
    third = _busy_team(router)
    router.close()
    after = _sqlite_state(url)[1]
    assert third > second > first
    for table in ("ar_teams", "ar_agents", "ar_messages", "ar_user_messages", "ar_turns",
                  "ar_transcript_entries", "ar_outbox", "ar_ledger"):  # fmt: skip
        new = {r[0] for r in after[table]} - {r[0] for r in before[table]}
        assert new and min(new) > largest[table], table

    downgrade(url, "0013")
    assert _sqlite_state(url)[0] == schema
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        ddl = {n: sql for n, sql in conn.execute(sa.text("SELECT name, sql FROM sqlite_master"))}
    engine.dispose()
    assert not any("AUTOINCREMENT" in ddl[t] for t in ID_TABLES)
    upgrade(url)
    assert _diff(url) == []


def test_0014_changes_nothing_on_postgresql(fresh_pg_url: str) -> None:
    """PostgreSQL's sequences never give an id twice: 0014 leaves its tables as they were."""
    upgrade(fresh_pg_url, "0013")
    engine = sa.create_engine(fresh_pg_url)
    query = sa.text(
        "SELECT table_name, column_name, column_default FROM information_schema.columns "
        "WHERE table_name LIKE 'ar\\_%' ORDER BY 1, 2"
    )
    with engine.connect() as conn:
        before = conn.execute(query).all()
    upgrade(fresh_pg_url)
    with engine.connect() as conn:
        assert conn.execute(query).all() == before
    engine.dispose()


def test_0014_is_refused_on_a_sqlite_connection_that_enforces_foreign_keys(tmp_path: Path) -> None:
    """SQLite drops a table others refer to only with foreign keys off, which a transaction
    cannot turn off: a host's connection with them on gets one error, and nothing changes."""
    from sqlalchemy import event

    from agent_router.store.migrate import current, upgrade_connection

    url = f"sqlite:///{tmp_path / 'fk.db'}"
    upgrade(url, "0013")
    router = Router(Settings(database_url=url))
    _busy_team(router)
    router.close()
    before = _sqlite_state(url)
    engine = sa.create_engine(url)

    @event.listens_for(engine, "connect")
    def _enforce(dbapi_conn: object, _record: object) -> None:
        dbapi_conn.execute("PRAGMA foreign_keys=ON")  # type: ignore[attr-defined]

    with engine.connect() as conn, pytest.raises(StoreError, match="foreign keys off"):
        upgrade_connection(conn)
    engine.dispose()
    assert (current(url), _sqlite_state(url)) == ("0013", before)
    upgrade(url)
    assert current(url) == "0014"
