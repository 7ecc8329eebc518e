"""ids never reused on SQLite: AUTOINCREMENT on every table whose id the database gives

Without AUTOINCREMENT, SQLite gives a new row the largest id present plus one: after the row
with the largest id was deleted (``delete_team``, ``prune``), the next row gets its id again. A
deleted team's ledger events then named the next team, and a host that drops a repeated
delivery by its id would drop a new message to the user as a repeat. With AUTOINCREMENT SQLite
keeps the largest id it ever gave in ``sqlite_sequence`` and gives ids above it.

SQLite cannot add AUTOINCREMENT to a table: each table is copied into a new one that has it
(batch mode, ``recreate="always"``), with its rows, indexes, foreign keys and CHECK constraints,
and ``sqlite_sequence`` is set to the largest id the table holds. An id above it given to a row
deleted before this upgrade is known nowhere any more, so it may be given once again; from this
upgrade on, none is. The copies run in the upgrade's one transaction, under the database's write
lock, and take time in proportion to the rows. The previous release reads and writes the copied
tables as before. SQLite drops a table other tables refer to only with foreign keys off (as
``agent-router db upgrade`` connects): on a connection that enforces them (``PRAGMA
foreign_keys=ON``, which a transaction cannot turn off) the upgrade is refused, changing nothing.

PostgreSQL's sequences never give an id twice: nothing to do there.

Create Date: 2026-12-07 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agent_router.errors import StoreError

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Every table whose ``id`` the database gives (ar_budgets and ar_quarantine are keyed by the
#: team's and the agent's id).
TABLES = (
    "ar_teams",
    "ar_agents",
    "ar_messages",
    "ar_user_messages",
    "ar_questions",
    "ar_turns",
    "ar_transcript_entries",
    "ar_outbox",
    "ar_background_jobs",
    "ar_ledger",
    "ar_model_calls",
)


def _copy(table: str, *, autoincrement: bool) -> None:
    with op.batch_alter_table(
        table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ):
        pass


def _copies_allowed() -> bool:
    """Whether this is SQLite, with foreign keys off (else :class:`StoreError`)."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return False
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise StoreError(
            "revision 0014 copies the router's SQLite tables, which SQLite allows only with "
            "foreign keys off: run it on a connection without PRAGMA foreign_keys=ON "
            "(agent-router db upgrade connects so)"
        )
    return True


def upgrade() -> None:
    if not _copies_allowed():
        return
    for table in TABLES:
        _copy(table, autoincrement=True)
        # The copy's INSERT has set it already; stated here, not left to that.
        op.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = :t").bindparams(t=table))
        op.execute(
            sa.text(
                f"INSERT INTO sqlite_sequence (name, seq) SELECT :t, COALESCE(MAX(id), 0) "
                f"FROM {table}"
            ).bindparams(t=table)
        )


def downgrade() -> None:
    if not _copies_allowed():
        return
    for table in TABLES:
        _copy(table, autoincrement=False)
        op.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = :t").bindparams(t=table))
