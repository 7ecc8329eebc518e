"""`alembic upgrade head` produces the schema the models describe, on both backends."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from agent_router.migrate import downgrade, upgrade
from agent_router.models import Base

from ..conftest import PG_ADMIN_URL


@pytest.fixture
def empty_pg(pg_url: str) -> Iterator[str]:
    name = f"ar_mig_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield pg_url.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _diff(url: str) -> list[object]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_head_matches_models_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    upgrade(url)
    assert _diff(url) == []


def test_upgrade_head_matches_models_on_postgresql(empty_pg: str) -> None:
    upgrade(empty_pg)
    assert _diff(empty_pg) == []
    # Alembic does not compare enum labels: check every enum type against its Python enum.
    engine = sa.create_engine(empty_pg)
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


def test_downgrade_base_removes_everything(empty_pg: str) -> None:
    upgrade(empty_pg)
    downgrade(empty_pg, "base")
    engine = sa.create_engine(empty_pg)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names()) - {"alembic_version"}
        enums = conn.execute(sa.text("SELECT count(*) FROM pg_type WHERE typname LIKE 'ar_%'"))
        assert (tables, enums.scalar()) == (set(), 0)
    engine.dispose()
