"""sweep bulkheads: ar_quarantine (agents a sweeper step kept failing for), four ledger actions

A sweeper pass repairs one agent at a time; a repair that fails is ledgered (``sweep_failed``),
the agent is left alone for a while (its row here: the step, the failures in a row, until when)
and from a few failures on is quarantined (``quarantined``, reported by ``check``), until a
repair succeeds (``quarantine_lifted``). A prune or a deletion that drops rows still owed
ledgers what it dropped (``owed_dropped``).

Create Date: 2026-12-07 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agent_router.store.migrations.initial_labels import ENUMS

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STEPS = ("republish", "take_over", "reenqueue", "expire", "poll_job")
NEW_ACTIONS = ("sweep_failed", "quarantined", "quarantine_lifted", "owed_dropped")

#: The ledger action labels before this revision, in their order: those revision 0001 created
#: and those revision 0004 added, frozen (a label a later version adds must not change what
#: this revision does).
OLD_ACTIONS = (
    *ENUMS["ar_ledger_action"],
    "model_call",
    "budget_warning",
    "budget_exhausted",
    "budget_refused",
    "budget_changed",
)


def _ledger_type(labels: Sequence[str]) -> sa.Enum:
    return sa.Enum(*labels, name="ar_ledger_action", create_constraint=True)


def upgrade() -> None:
    op.create_table(
        "ar_quarantine",
        sa.Column("agent_id", BIG_ID, nullable=False),
        sa.Column("team_id", BIG_ID, nullable=False),
        sa.Column(
            "step", sa.Enum(*STEPS, name="ar_sweep_step", create_constraint=True), nullable=False
        ),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("first_failed_at", sa.DateTime(), nullable=False),
        sa.Column("last_failed_at", sa.DateTime(), nullable=False),
        sa.Column("until", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id", "team_id"],
            ["ar_agents.id", "ar_agents.team_id"],
            name=op.f("fk_ar_quarantine_agent_id_ar_agents"),
        ),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_ar_quarantine")),
    )
    with op.batch_alter_table("ar_quarantine", schema=None) as batch_op:
        batch_op.create_index("ix_ar_quarantine_until", ["until"])
        batch_op.create_index(batch_op.f("ix_ar_quarantine_team_id"), ["team_id"])
    if op.get_bind().dialect.name == "postgresql":
        for label in NEW_ACTIONS:
            op.execute(sa.text(f"ALTER TYPE ar_ledger_action ADD VALUE IF NOT EXISTS '{label}'"))
    else:  # SQLite: the CHECK constraint of the column lists the labels; the copy renews it
        with op.batch_alter_table("ar_ledger", recreate="always") as batch_op:
            batch_op.alter_column(
                "action",
                existing_type=_ledger_type(OLD_ACTIONS),
                type_=_ledger_type((*OLD_ACTIONS, *NEW_ACTIONS)),
                existing_nullable=False,
            )


def downgrade() -> None:
    from agent_router.store import functions

    # The store's functions of the releases from this one on take ar_quarantine's rows: they go
    # with the table. A release before this one installs its own with its upgrade
    # (`agent-router db upgrade`).
    if op.get_bind().dialect.name == "postgresql":
        functions.drop(op.get_bind())
    labels = ", ".join(f"'{label}'" for label in NEW_ACTIONS)
    op.execute(sa.text(f"DELETE FROM ar_ledger WHERE CAST(action AS VARCHAR) IN ({labels})"))
    # PostgreSQL cannot drop an enum label, and rebuilding the type would take the store's
    # functions with it (they name it): the four labels stay, unused. SQLite's CHECK lists
    # the labels; the copy renews it.
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("ar_ledger", recreate="always") as batch_op:
            batch_op.alter_column(
                "action",
                existing_type=_ledger_type((*OLD_ACTIONS, *NEW_ACTIONS)),
                type_=_ledger_type(OLD_ACTIONS),
                existing_nullable=False,
            )
    with op.batch_alter_table("ar_quarantine", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ar_quarantine_team_id"))
        batch_op.drop_index("ix_ar_quarantine_until")
    op.drop_table("ar_quarantine")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.text("DROP TYPE IF EXISTS ar_sweep_step"))
