"""hot indexes: the sweeper's scans by state, deadline and epoch

Create Date: 2026-12-01 00:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, index, columns): every sweeper pass looks these up; without them each pass scans the
# whole table, and the tables grow with the history a deployment keeps.
INDEXES = (
    ("ar_turns", "ix_ar_turns_status_lease", ["status", "lease_expires_at"]),
    ("ar_questions", "ix_ar_questions_status_deadline", ["status", "deadline"]),
    ("ar_agents", "ix_ar_agents_state_scheduled", ["state", "scheduled_at"]),
    ("ar_outbox", "ix_ar_outbox_agent_epoch", ["agent_id", "epoch"]),
)


def upgrade() -> None:
    for table, name, columns in INDEXES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.create_index(name, columns, unique=False)


def downgrade() -> None:
    for table, name, _columns in reversed(INDEXES):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(name)
