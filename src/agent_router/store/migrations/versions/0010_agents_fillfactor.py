"""agents fillfactor: ar_agents leaves half of each page to the updates of its rows

Every send bumps its target's ``next_seq`` and every transcript append its agent's
``next_position``: neither is indexed, so PostgreSQL writes the update HOT (no new index entry,
the dead version pruned within the page) when the row's page has room for the new version.
A full page makes each such update a new tuple elsewhere plus an entry in each of the table's
five indexes, and the table and its indexes bloat wherever autovacuum lags. Pages filled to
half on insert keep that room. The setting applies to pages written from now on; ``VACUUM
FULL ar_agents`` (a small table, locked while it runs) rewrites the existing ones. SQLite has no
such setting: nothing to do there.

Create Date: 2026-12-06 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Frozen here: a later change of the models' value must not change what this revision does.
FILLFACTOR = 50


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE ar_agents SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE ar_agents RESET (fillfactor)")
