"""agent context window: ar_agents.context_window, where an agent's request window stands

The built-in loop keeps an agent's requests near a target size by leaving out the older part of
its transcript (the cut), keeping the system prompt, the first task and the open questions. When
the cut moves, the model call's usage is recorded with the window's checkpoint: the cut, the
positions every request keeps, and the transcript's length then. A worker that has not kept the
window in memory builds it again from this and the entries from the cut on, so a model call
reads what its request holds, never the whole history. NULL: the cut never moved (the whole
transcript fits), or the agent's turns are a host's.

Create Date: 2026-12-07 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    json_type = sa.JSON().with_variant(JSONB(), "postgresql")
    with op.batch_alter_table("ar_agents") as batch:
        batch.add_column(sa.Column("context_window", json_type, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ar_agents") as batch:
        batch.drop_column("context_window")
