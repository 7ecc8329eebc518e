"""user channel: ar_user_messages, ar_teams.user_task, and the labels that route to the user

The lead (and a sub-agent whose role allows it) tells the user things: its final reply
(``answer``), a note while the team works (``progress``), a question it waits on
(``question``, through ``ask_user``). Each is a row of ``ar_user_messages``, written in the
transaction that decides it and under the lead's row lock, so a team's ids are in commit order
and a reader reading on from the last id it saw misses none. A team created with a user task
(``Router.create_team(user_task=...)``, kept in ``ar_teams.user_task``) gets each one through
the outbox (``deliver_user``), published after the commit and again by the sweeper. The labels:
``ar_question_kind`` ``user`` (a wait for the user's reply), ``ar_outbox_kind``
``deliver_user``, ``ar_ledger_action`` ``user_message``. Additive only.

Create Date: 2026-12-07 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agent_router.store.migrations.initial_labels import ENUMS

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
KINDS = ("answer", "progress", "question")

#: The labels before this revision, frozen: those revision 0001 created and those revisions
#: 0004 and 0009 added.
OLD_ACTIONS = (
    *ENUMS["ar_ledger_action"],
    "model_call",
    "budget_warning",
    "budget_exhausted",
    "budget_refused",
    "budget_changed",
    "sweep_failed",
    "quarantined",
    "quarantine_lifted",
    "owed_dropped",
)
#: (table, column, type, labels before, label added)
LABELS = (
    ("ar_questions", "kind", "ar_question_kind", ENUMS["ar_question_kind"], "user"),
    ("ar_outbox", "kind", "ar_outbox_kind", ENUMS["ar_outbox_kind"], "deliver_user"),
    ("ar_ledger", "action", "ar_ledger_action", OLD_ACTIONS, "user_message"),
)


def _type(name: str, labels: Sequence[str]) -> sa.Enum:
    return sa.Enum(*labels, name=name, create_constraint=True)


def upgrade() -> None:
    with op.batch_alter_table("ar_teams") as batch:
        batch.add_column(sa.Column("user_task", sa.String(300), nullable=True))
    op.create_table(
        "ar_user_messages",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("team_id", BIG_ID, nullable=False),
        sa.Column("agent_id", BIG_ID, nullable=False),
        sa.Column("kind", _type("ar_user_message_kind", KINDS), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("question_id", BIG_ID, nullable=True),
        sa.Column("turn_id", BIG_ID, nullable=True),
        sa.Column("dedup_key", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id", "team_id"],
            ["ar_agents.id", "ar_agents.team_id"],
            name=op.f("fk_ar_user_messages_agent_id_ar_agents"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_user_messages")),
        sa.UniqueConstraint("team_id", "dedup_key", name="uq_ar_user_messages_team_dedup"),
    )
    op.create_index("ix_ar_user_messages_team_id", "ar_user_messages", ["team_id", "id"])
    if op.get_bind().dialect.name == "postgresql":
        for _table, _column, name, _old, label in LABELS:
            op.execute(sa.text(f"ALTER TYPE {name} ADD VALUE IF NOT EXISTS '{label}'"))
        return
    # SQLite: the CHECK constraint of the column lists the labels; the copy renews it.
    for table, column, name, old, label in LABELS:
        with op.batch_alter_table(table, recreate="always") as batch_op:
            batch_op.alter_column(
                column,
                existing_type=_type(name, old),
                type_=_type(name, (*old, label)),
                existing_nullable=False,
            )


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM ar_ledger WHERE CAST(action AS VARCHAR) = 'user_message'"))
    op.execute(sa.text("DELETE FROM ar_outbox WHERE CAST(kind AS VARCHAR) = 'deliver_user'"))
    op.execute(sa.text("DELETE FROM ar_questions WHERE CAST(kind AS VARCHAR) = 'user'"))
    # PostgreSQL cannot drop an enum label, and rebuilding the types would take the store's
    # functions with them: the labels stay, unused. SQLite's CHECK lists them; the copy renews it.
    if op.get_bind().dialect.name != "postgresql":
        for table, column, name, old, label in LABELS:
            with op.batch_alter_table(table, recreate="always") as batch_op:
                batch_op.alter_column(
                    column,
                    existing_type=_type(name, (*old, label)),
                    type_=_type(name, old),
                    existing_nullable=False,
                )
    op.drop_index("ix_ar_user_messages_team_id", table_name="ar_user_messages")
    op.drop_table("ar_user_messages")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.text("DROP TYPE IF EXISTS ar_user_message_kind"))
    with op.batch_alter_table("ar_teams") as batch:
        batch.drop_column("user_task")
