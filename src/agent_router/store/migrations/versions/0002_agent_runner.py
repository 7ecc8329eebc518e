"""agent runner: the Celery task that runs a host-owned agent's turns

Create Date: 2026-12-01 00:05:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ar_agents") as batch:
        batch.add_column(sa.Column("runner", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ar_agents") as batch:
        batch.drop_column("runner")
