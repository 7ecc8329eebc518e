"""ledger in time order per team: the timeline reads windows of a team's events

The index on ``ar_ledger (team_id)`` becomes one on ``(team_id, created_at, id)``: it still
serves every lookup by team, and a window of a team's events (the timeline, the live page) or
its latest event is now a range of it instead of a scan of the team's whole history. One index
for one: a ledger insert maintains as many as before.

Create Date: 2026-12-06 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ar_ledger", schema=None) as batch_op:
        batch_op.create_index(
            "ix_ar_ledger_team_time", ["team_id", "created_at", "id"], unique=False
        )
        batch_op.drop_index("ix_ar_ledger_team_id")


def downgrade() -> None:
    with op.batch_alter_table("ar_ledger", schema=None) as batch_op:
        batch_op.create_index("ix_ar_ledger_team_id", ["team_id"], unique=False)
        batch_op.drop_index("ix_ar_ledger_team_time")
