"""initial schema

Create Date: 2026-11-30 04:15:36.754218
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from agent_router.store.migrations.initial_labels import ENUMS

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


#: Ids and references to them: BIGINT, INTEGER on SQLite (its autoincrementing rowid type).
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
#: JSON documents: JSONB on PostgreSQL.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

#: Each table's indexes (name, columns), created in this order just after the table.
INDEXES: dict[str, tuple[tuple[str, list[str]], ...]] = {
    "ar_agents": (("ix_ar_agents_team_id", ["team_id"]),),
    "ar_ledger": (("ix_ar_ledger_team_id", ["team_id"]),),
    "ar_outbox": (
        ("ix_ar_outbox_team_id", ["team_id"]),
        ("ix_ar_outbox_unpublished", ["published_at", "id"]),
    ),
    "ar_questions": (
        ("ix_ar_questions_asker_agent_id", ["asker_agent_id"]),
        ("ix_ar_questions_team_id", ["team_id"]),
    ),
    "ar_turns": (("ix_ar_turns_team_id", ["team_id"]),),
    "ar_messages": (
        ("ix_ar_messages_mailbox", ["target_agent_id", "status", "seq"]),
        ("ix_ar_messages_team_id", ["team_id"]),
    ),
    "ar_background_jobs": (
        ("ix_ar_background_jobs_status", ["status", "created_at"]),
        ("ix_ar_background_jobs_team_id", ["team_id"]),
    ),
}

#: The tables in the order they are created (dropped in the reverse order).
TABLES = (
    "ar_teams",
    "ar_agents",
    "ar_ledger",
    "ar_outbox",
    "ar_questions",
    "ar_turns",
    "ar_messages",
    "ar_transcript_entries",
    "ar_background_jobs",
)


def _ref(name: str, *, nullable: bool, to: str | None = None) -> sa.Column[Any]:
    """A column holding an id: of a row of the table ``to`` (a foreign key), or of a row it does
    not constrain."""
    return sa.Column(name, BIG_ID, nullable=nullable, info={"to": to} if to else {})


def _json(name: str, *, nullable: bool) -> sa.Column[Any]:
    return sa.Column(name, JSON, nullable=nullable)


def _enum(name: str, type_name: str, *, nullable: bool) -> sa.Column[Any]:
    """A column of the enum type ``type_name`` (its labels: ``ENUMS``)."""
    labels = ENUMS[type_name]
    return sa.Column(
        name, sa.Enum(*labels, name=type_name, create_constraint=True), nullable=nullable
    )


def _create_table(
    table: str, *columns: sa.Column[Any], unique: Mapping[str, Sequence[str]] | None = None
) -> None:
    """Create ``table``: its ``id`` key, then ``columns``; the foreign keys of its ``_ref``
    columns (by column name), then the ``unique`` constraints (name -> columns) in the order
    given; then its ``INDEXES``."""
    foreign_keys = [
        sa.ForeignKeyConstraint(
            [column.name], [f"{target}.id"], name=op.f(f"fk_{table}_{column.name}_{target}")
        )
        for column in sorted(columns, key=lambda c: c.name)
        if (target := column.info.get("to"))
    ]
    op.create_table(
        table,
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        *columns,
        *foreign_keys,
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}")),
        *(sa.UniqueConstraint(*names, name=op.f(name)) for name, names in (unique or {}).items()),
    )
    if table in INDEXES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name, index_columns in INDEXES[table]:
                batch_op.create_index(batch_op.f(name), index_columns, unique=False)


def upgrade() -> None:
    _create_table(
        "ar_teams",
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    _create_table(
        "ar_agents",
        _ref("team_id", nullable=False, to="ar_teams"),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=200), nullable=False),
        sa.Column("is_lead", sa.Boolean(), nullable=False),
        _enum("state", "ar_agent_state", nullable=False),
        sa.Column("suspended", sa.Boolean(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        _enum("pending_trigger", "ar_turn_trigger", nullable=True),
        sa.Column("next_seq", sa.Integer(), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=True),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("scheduled_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        unique={"uq_ar_agents_team_display_name": ("team_id", "display_name")},
    )
    _create_table(
        "ar_ledger",
        _ref("team_id", nullable=True, to="ar_teams"),
        _ref("agent_id", nullable=True, to="ar_agents"),
        _enum("action", "ar_ledger_action", nullable=False),
        _enum("outcome", "ar_route_outcome", nullable=True),
        _ref("message_id", nullable=True),
        _ref("turn_id", nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=True),
        _json("detail", nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    _create_table(
        "ar_outbox",
        _ref("team_id", nullable=False, to="ar_teams"),
        _ref("agent_id", nullable=False, to="ar_agents"),
        _enum("kind", "ar_outbox_kind", nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        _json("payload", nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("published_at", sa.DateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("attempted_at", sa.DateTime(), nullable=True),
    )
    _create_table(
        "ar_questions",
        _ref("team_id", nullable=False, to="ar_teams"),
        _ref("asker_agent_id", nullable=False, to="ar_agents"),
        _ref("target_agent_id", nullable=False, to="ar_agents"),
        sa.Column("tool_call_id", sa.String(length=200), nullable=False),
        sa.Column("asker_epoch", sa.Integer(), nullable=False),
        _enum("status", "ar_question_status", nullable=False),
        _enum("kind", "ar_question_kind", nullable=False),
        sa.Column("waiting", sa.Boolean(), nullable=False),
        _ref("answer_message_id", nullable=True),
        sa.Column("deadline", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("closed_at", sa.DateTime(), nullable=True),
    )
    _create_table(
        "ar_turns",
        _ref("team_id", nullable=False, to="ar_teams"),
        _ref("agent_id", nullable=False, to="ar_agents"),
        sa.Column("epoch", sa.Integer(), nullable=False),
        _enum("trigger", "ar_turn_trigger", nullable=False),
        _enum("status", "ar_turn_status", nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        unique={"uq_ar_turns_agent_epoch": ("agent_id", "epoch")},
    )
    _create_table(
        "ar_messages",
        _ref("team_id", nullable=False, to="ar_teams"),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("source_name", sa.String(length=200), nullable=False),
        _ref("source_agent_id", nullable=True, to="ar_agents"),
        _ref("target_agent_id", nullable=False, to="ar_agents"),
        _enum("type", "ar_message_type", nullable=False),
        _enum("subtype", "ar_message_subtype", nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        _ref("question_id", nullable=True, to="ar_questions"),
        sa.Column("wake", sa.Boolean(), nullable=False),
        sa.Column("dedup_key", sa.String(length=200), nullable=True),
        _enum("outcome", "ar_route_outcome", nullable=False),
        _enum("status", "ar_message_status", nullable=False),
        _ref("consumed_turn_id", nullable=True, to="ar_turns"),
        sa.Column("consumed_at", sa.DateTime(), nullable=True),
        sa.Column("drop_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        unique={
            "uq_ar_messages_target_dedup": ("target_agent_id", "dedup_key"),
            "uq_ar_messages_target_seq": ("target_agent_id", "seq"),
        },
    )
    _create_table(
        "ar_transcript_entries",
        _ref("agent_id", nullable=False, to="ar_agents"),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        _json("payload", nullable=False),
        _json("meta", nullable=True),
        _ref("message_id", nullable=True, to="ar_messages"),
        sa.Column("tool_call_id", sa.String(length=200), nullable=True),
        _ref("turn_id", nullable=True, to="ar_turns"),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        unique={
            "uq_ar_transcript_agent_position": ("agent_id", "position"),
            "uq_ar_transcript_entries_message_id": ("message_id",),
        },
    )
    _create_table(
        "ar_background_jobs",
        _ref("team_id", nullable=False, to="ar_teams"),
        _ref("agent_id", nullable=False, to="ar_agents"),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        _enum("status", "ar_job_status", nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        _ref("notice_message_id", nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        unique={"uq_ar_background_jobs_task_id": ("task_id",)},
    )


def downgrade() -> None:
    for table in reversed(TABLES):
        if table in INDEXES:
            with op.batch_alter_table(table, schema=None) as batch_op:
                for name, _columns in reversed(INDEXES[table]):
                    batch_op.drop_index(batch_op.f(name))
        op.drop_table(table)

    # PostgreSQL keeps enum types after their tables are gone.
    if op.get_bind().dialect.name == "postgresql":
        for name in ENUMS:
            op.execute(sa.text(f"DROP TYPE IF EXISTS {name}"))
