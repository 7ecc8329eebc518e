"""transcript position: ar_agents.next_position, the position of an agent's next transcript entry

Create Date: 2026-12-04 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every agent's counter starts after the last entry its transcript already holds.
BACKFILL = """
UPDATE ar_agents SET next_position = (
    SELECT coalesce(max(e.position) + 1, 0) FROM ar_transcript_entries e
    WHERE e.agent_id = ar_agents.id
)
"""


def upgrade() -> None:
    with op.batch_alter_table("ar_agents", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("next_position", sa.Integer(), server_default="0", nullable=False)
        )
    op.execute(BACKFILL)


def downgrade() -> None:
    with op.batch_alter_table("ar_agents", schema=None) as batch_op:
        batch_op.drop_column("next_position")
