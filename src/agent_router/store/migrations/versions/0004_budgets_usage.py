"""budgets and usage: ar_budgets, ar_model_calls, five ledger actions

Create Date: 2026-11-30 23:55:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from agent_router.store.migrations.initial_labels import ENUMS

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
BUDGET_NAMES = (
    "model_calls",
    "turns",
    "tokens",
    "cost",
    "wall_seconds",
    "sub_agents_created",
    "sub_agents_active",
)
NEW_ACTIONS = (
    "model_call",
    "budget_warning",
    "budget_exhausted",
    "budget_refused",
    "budget_changed",
)


#: The ledger action labels before this revision, in their order: those revision 0001 created,
#: read from its frozen labels, never from today's code (a label a later version adds must not
#: change what this revision does).
OLD_ACTIONS = ENUMS["ar_ledger_action"]


def _ledger_type(labels: Sequence[str]) -> sa.Enum:
    return sa.Enum(*labels, name="ar_ledger_action", create_constraint=True)


#: The columns of a team's limits (NULL: unlimited) and their types.
LIMITS: tuple[tuple[str, type[sa.types.TypeEngine[Any]]], ...] = (
    ("max_model_calls", sa.BigInteger),
    ("max_turns", sa.BigInteger),
    ("max_tokens", sa.BigInteger),
    ("max_cost_nano", sa.BigInteger),
    ("max_wall_seconds", sa.Float),
    ("max_sub_agents_created", sa.Integer),
    ("max_sub_agents_active", sa.Integer),
)
#: The tokens and cost of model calls: one call's (ar_model_calls), a team's sum (ar_budgets).
USAGE = ("prompt_tokens", "completion_tokens", "cached_tokens", "cost_nano")


def _counters(*names: str) -> list[sa.Column[Any]]:
    return [sa.Column(name, sa.BigInteger(), nullable=False) for name in names]


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    """The foreign key of ``table.column`` on ``target.id``."""
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=op.f(f"fk_{table}_{column}_{target}")
    )


def upgrade() -> None:
    op.create_table(
        "ar_budgets",
        sa.Column("team_id", BIG_ID, nullable=False),
        *(sa.Column(name, type_(), nullable=True) for name, type_ in LIMITS),
        *_counters("model_calls", "turns", *USAGE),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("deadline_at", sa.DateTime(), nullable=True),
        sa.Column("warned", sa.Boolean(), nullable=False),
        sa.Column(
            "exhausted",
            sa.Enum(*BUDGET_NAMES, name="ar_budget_name", create_constraint=True),
            nullable=True,
        ),
        _fk("ar_budgets", "team_id", "ar_teams"),
        sa.PrimaryKeyConstraint("team_id", name=op.f("pk_ar_budgets")),
    )
    op.create_table(
        "ar_model_calls",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("team_id", BIG_ID, nullable=False),
        sa.Column("agent_id", BIG_ID, nullable=False),
        sa.Column("turn_id", BIG_ID, nullable=True),
        sa.Column("model", sa.String(length=200), nullable=True),
        *_counters(*USAGE),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        _fk("ar_model_calls", "agent_id", "ar_agents"),
        _fk("ar_model_calls", "team_id", "ar_teams"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_model_calls")),
    )
    with op.batch_alter_table("ar_model_calls", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ar_model_calls_agent_id"), ["agent_id"])
        batch_op.create_index(batch_op.f("ix_ar_model_calls_team_id"), ["team_id"])

    old = OLD_ACTIONS
    if op.get_bind().dialect.name == "postgresql":
        for label in NEW_ACTIONS:
            op.execute(sa.text(f"ALTER TYPE ar_ledger_action ADD VALUE IF NOT EXISTS '{label}'"))
    else:  # SQLite: the CHECK constraint of the column lists the labels; the copy renews it
        with op.batch_alter_table("ar_ledger", recreate="always") as batch_op:
            batch_op.alter_column(
                "action",
                existing_type=_ledger_type(old),
                type_=_ledger_type((*old, *NEW_ACTIONS)),
                existing_nullable=False,
            )


def downgrade() -> None:
    old = OLD_ACTIONS
    labels = ", ".join(f"'{label}'" for label in NEW_ACTIONS)
    op.execute(sa.text(f"DELETE FROM ar_ledger WHERE CAST(action AS VARCHAR) IN ({labels})"))
    if op.get_bind().dialect.name == "postgresql":
        # PostgreSQL cannot drop an enum label: the type is rebuilt without them.
        op.execute(sa.text("ALTER TYPE ar_ledger_action RENAME TO ar_ledger_action_old"))
        _ledger_type(old).create(op.get_bind())
        op.execute(
            sa.text(
                "ALTER TABLE ar_ledger ALTER COLUMN action TYPE ar_ledger_action "
                "USING action::text::ar_ledger_action"
            )
        )
        op.execute(sa.text("DROP TYPE ar_ledger_action_old"))
    else:
        with op.batch_alter_table("ar_ledger", recreate="always") as batch_op:
            batch_op.alter_column(
                "action",
                existing_type=_ledger_type((*old, *NEW_ACTIONS)),
                type_=_ledger_type(old),
                existing_nullable=False,
            )
    with op.batch_alter_table("ar_model_calls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ar_model_calls_team_id"))
        batch_op.drop_index(batch_op.f("ix_ar_model_calls_agent_id"))
    op.drop_table("ar_model_calls")
    op.drop_table("ar_budgets")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.text("DROP TYPE IF EXISTS ar_budget_name"))
