"""message body: ar_messages.body, the content as it appears inside the router's envelope

A message's envelope is rendered where it enters a transcript: on PostgreSQL by the store's
functions, which take the content as the router escaped it when it accepted the message. Every
pending message that needs escaping gets its body here. Going back removes the column and the
store's functions (a release before this one calls none).

Create Date: 2026-12-06 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_messages = sa.table(
    "ar_messages",
    sa.column("id", sa.BigInteger),
    sa.column("content", sa.Text),
    sa.column("body", sa.Text),
    sa.column("status", sa.String),
)


def upgrade() -> None:
    from agent_router import formats

    with op.batch_alter_table("ar_messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("body", sa.Text(), nullable=True))
    conn = op.get_bind()
    pending = conn.execute(
        sa.select(_messages.c.id, _messages.c.content).where(
            sa.cast(_messages.c.status, sa.String) == "pending"
        )
    )
    bodies = [
        {"b_id": message_id, "b_body": body}
        for message_id, content in pending
        if (body := formats.escape(content)) != content
    ]
    if bodies:
        conn.execute(
            _messages.update()
            .where(_messages.c.id == sa.bindparam("b_id"))
            .values(body=sa.bindparam("b_body")),
            bodies,
        )


def downgrade() -> None:
    from agent_router.store import functions

    if op.get_bind().dialect.name == "postgresql":
        functions.drop(op.get_bind())
    with op.batch_alter_table("ar_messages", schema=None) as batch_op:
        batch_op.drop_column("body")
