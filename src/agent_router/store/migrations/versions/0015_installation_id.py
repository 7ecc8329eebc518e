"""installation id: ar_installation, one row naming the database's Redis channels and keys

Redis pub/sub channels are shared by every database of a Redis server, and a Redis database
may be shared by several deployments: a team's feed channel and a question's wake list named
by the team's or question's id alone would reach another deployment's readers with the same
ids. The id in ``ar_installation`` (random, written here once, never changed) goes in every
such name. Additive only: the previous release never reads the table.

Create Date: 2026-12-07 21:00:00
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "ar_installation",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_installation")),
    )
    op.bulk_insert(
        table,
        [{"id": uuid.uuid4().hex, "created_at": datetime.now(UTC).replace(tzinfo=None)}],
    )


def downgrade() -> None:
    op.drop_table("ar_installation")
