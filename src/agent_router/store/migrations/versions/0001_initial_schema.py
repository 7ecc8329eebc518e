"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 04:15:36.754218
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "ar_teams",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_teams")),
    )
    op.create_table(
        "ar_agents",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=200), nullable=False),
        sa.Column("is_lead", sa.Boolean(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "idle",
                "scheduled",
                "running",
                "waiting",
                "completed",
                "terminated",
                name="ar_agent_state",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("suspended", sa.Boolean(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column(
            "pending_trigger",
            sa.Enum(
                "new",
                "follow_up",
                "continuation",
                "recovery",
                name="ar_turn_trigger",
                create_constraint=True,
            ),
            nullable=True,
        ),
        sa.Column("next_seq", sa.Integer(), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=True),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("scheduled_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["team_id"], ["ar_teams.id"], name=op.f("fk_ar_agents_team_id_ar_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_agents")),
        sa.UniqueConstraint("team_id", "display_name", name="uq_ar_agents_team_display_name"),
    )
    with op.batch_alter_table("ar_agents", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ar_agents_team_id"), ["team_id"], unique=False)

    op.create_table(
        "ar_ledger",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column(
            "action",
            sa.Enum(
                "team_created",
                "agent_created",
                "route",
                "send_rejected",
                "duplicate_send",
                "turn_claimed",
                "claim_refused",
                "drain",
                "turn_ended",
                "follow_up",
                "ask",
                "ask_refused",
                "question_resolved",
                "take_over",
                "stale_write_refused",
                "synthetic_tool_result",
                "outbox_published",
                "terminated",
                "message_dropped",
                "question_cancelled",
                "question_expired",
                "reenqueued",
                "job_started",
                "job_finished",
                "wait_output",
                "stop_requested",
                "stopped",
                name="ar_ledger_action",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column(
            "outcome",
            sa.Enum(
                "resolved",
                "injected_inline",
                "coalesced",
                "triggered_new_turn",
                "queued",
                "rejected",
                name="ar_route_outcome",
                create_constraint=True,
            ),
            nullable=True,
        ),
        sa.Column(
            "message_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("turn_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column(
            "detail",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["ar_agents.id"], name=op.f("fk_ar_ledger_agent_id_ar_agents")
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["ar_teams.id"], name=op.f("fk_ar_ledger_team_id_ar_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_ledger")),
    )
    with op.batch_alter_table("ar_ledger", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ar_ledger_team_id"), ["team_id"], unique=False)

    op.create_table(
        "ar_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("enqueue_turn", "wake_waiter", name="ar_outbox_kind", create_constraint=True),
            nullable=False,
        ),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("published_at", sa.DateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("attempted_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["ar_agents.id"], name=op.f("fk_ar_outbox_agent_id_ar_agents")
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["ar_teams.id"], name=op.f("fk_ar_outbox_team_id_ar_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_outbox")),
    )
    with op.batch_alter_table("ar_outbox", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ar_outbox_team_id"), ["team_id"], unique=False)
        batch_op.create_index("ix_ar_outbox_unpublished", ["published_at", "id"], unique=False)

    op.create_table(
        "ar_questions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "asker_agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column(
            "target_agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("tool_call_id", sa.String(length=200), nullable=False),
        sa.Column("asker_epoch", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "open",
                "answered",
                "expired",
                "cancelled",
                name="ar_question_status",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column(
            "kind",
            sa.Enum("ask", "output", name="ar_question_kind", create_constraint=True),
            nullable=False,
        ),
        sa.Column("waiting", sa.Boolean(), nullable=False),
        sa.Column(
            "answer_message_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("deadline", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("closed_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["asker_agent_id"],
            ["ar_agents.id"],
            name=op.f("fk_ar_questions_asker_agent_id_ar_agents"),
        ),
        sa.ForeignKeyConstraint(
            ["target_agent_id"],
            ["ar_agents.id"],
            name=op.f("fk_ar_questions_target_agent_id_ar_agents"),
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["ar_teams.id"], name=op.f("fk_ar_questions_team_id_ar_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_questions")),
    )
    with op.batch_alter_table("ar_questions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_ar_questions_asker_agent_id"), ["asker_agent_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_ar_questions_team_id"), ["team_id"], unique=False)

    op.create_table(
        "ar_turns",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column(
            "trigger",
            sa.Enum(
                "new",
                "follow_up",
                "continuation",
                "recovery",
                name="ar_turn_trigger",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column(
            "status",
            sa.Enum(
                "running",
                "ended",
                "failed",
                "suspended",
                "fenced",
                "stopped",
                name="ar_turn_status",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["ar_agents.id"], name=op.f("fk_ar_turns_agent_id_ar_agents")
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["ar_teams.id"], name=op.f("fk_ar_turns_team_id_ar_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_turns")),
        sa.UniqueConstraint("agent_id", "epoch", name="uq_ar_turns_agent_epoch"),
    )
    with op.batch_alter_table("ar_turns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ar_turns_team_id"), ["team_id"], unique=False)

    op.create_table(
        "ar_messages",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("source_name", sa.String(length=200), nullable=False),
        sa.Column(
            "source_agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column(
            "target_agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column(
            "type",
            sa.Enum(
                "task",
                "output",
                "ask",
                "answer",
                "message",
                "notice",
                name="ar_message_type",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column(
            "subtype",
            sa.Enum(
                "progress_output",
                "completion_report",
                "ask_master",
                "ask_other",
                name="ar_message_subtype",
                create_constraint=True,
            ),
            nullable=True,
        ),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "question_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("wake", sa.Boolean(), nullable=False),
        sa.Column("dedup_key", sa.String(length=200), nullable=True),
        sa.Column(
            "outcome",
            sa.Enum(
                "resolved",
                "injected_inline",
                "coalesced",
                "triggered_new_turn",
                "queued",
                "rejected",
                name="ar_route_outcome",
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column(
            "status",
            sa.Enum(
                "pending", "delivered", "dropped", name="ar_message_status", create_constraint=True
            ),
            nullable=False,
        ),
        sa.Column(
            "consumed_turn_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("consumed_at", sa.DateTime(), nullable=True),
        sa.Column("drop_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["consumed_turn_id"],
            ["ar_turns.id"],
            name=op.f("fk_ar_messages_consumed_turn_id_ar_turns"),
        ),
        sa.ForeignKeyConstraint(
            ["question_id"],
            ["ar_questions.id"],
            name=op.f("fk_ar_messages_question_id_ar_questions"),
        ),
        sa.ForeignKeyConstraint(
            ["source_agent_id"],
            ["ar_agents.id"],
            name=op.f("fk_ar_messages_source_agent_id_ar_agents"),
        ),
        sa.ForeignKeyConstraint(
            ["target_agent_id"],
            ["ar_agents.id"],
            name=op.f("fk_ar_messages_target_agent_id_ar_agents"),
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["ar_teams.id"], name=op.f("fk_ar_messages_team_id_ar_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_messages")),
        sa.UniqueConstraint("target_agent_id", "dedup_key", name="uq_ar_messages_target_dedup"),
        sa.UniqueConstraint("target_agent_id", "seq", name="uq_ar_messages_target_seq"),
    )
    with op.batch_alter_table("ar_messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_ar_messages_mailbox", ["target_agent_id", "status", "seq"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_ar_messages_team_id"), ["team_id"], unique=False)

    op.create_table(
        "ar_transcript_entries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "meta",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "message_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.Column("tool_call_id", sa.String(length=200), nullable=True),
        sa.Column("turn_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["ar_agents.id"], name=op.f("fk_ar_transcript_entries_agent_id_ar_agents")
        ),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["ar_messages.id"],
            name=op.f("fk_ar_transcript_entries_message_id_ar_messages"),
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"], ["ar_turns.id"], name=op.f("fk_ar_transcript_entries_turn_id_ar_turns")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_transcript_entries")),
        sa.UniqueConstraint("agent_id", "position", name="uq_ar_transcript_agent_position"),
        sa.UniqueConstraint("message_id", name=op.f("uq_ar_transcript_entries_message_id")),
    )
    op.create_table(
        "ar_background_jobs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("agent_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column(
            "status",
            sa.Enum("running", "succeeded", "failed", name="ar_job_status", create_constraint=True),
            nullable=False,
        ),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column(
            "notice_message_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["ar_agents.id"], name=op.f("fk_ar_background_jobs_agent_id_ar_agents")
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["ar_teams.id"], name=op.f("fk_ar_background_jobs_team_id_ar_teams")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ar_background_jobs")),
        sa.UniqueConstraint("task_id", name=op.f("uq_ar_background_jobs_task_id")),
    )
    with op.batch_alter_table("ar_background_jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_ar_background_jobs_status", ["status", "created_at"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_ar_background_jobs_team_id"), ["team_id"], unique=False
        )


def downgrade() -> None:

    op.drop_table("ar_background_jobs")
    op.drop_table("ar_transcript_entries")
    with op.batch_alter_table("ar_messages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ar_messages_team_id"))
        batch_op.drop_index("ix_ar_messages_mailbox")

    op.drop_table("ar_messages")
    with op.batch_alter_table("ar_turns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ar_turns_team_id"))

    op.drop_table("ar_turns")
    with op.batch_alter_table("ar_questions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ar_questions_team_id"))
        batch_op.drop_index(batch_op.f("ix_ar_questions_asker_agent_id"))

    op.drop_table("ar_questions")
    with op.batch_alter_table("ar_outbox", schema=None) as batch_op:
        batch_op.drop_index("ix_ar_outbox_unpublished")
        batch_op.drop_index(batch_op.f("ix_ar_outbox_team_id"))

    op.drop_table("ar_outbox")
    with op.batch_alter_table("ar_ledger", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ar_ledger_team_id"))

    op.drop_table("ar_ledger")
    with op.batch_alter_table("ar_agents", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ar_agents_team_id"))

    op.drop_table("ar_agents")
    op.drop_table("ar_teams")

    # PostgreSQL keeps enum types after their tables are gone.
    if op.get_bind().dialect.name == "postgresql":
        for name in ENUM_TYPES:
            op.execute(sa.text(f"DROP TYPE IF EXISTS {name}"))


ENUM_TYPES = (
    "ar_agent_state",
    "ar_turn_trigger",
    "ar_message_type",
    "ar_message_subtype",
    "ar_route_outcome",
    "ar_message_status",
    "ar_question_status",
    "ar_question_kind",
    "ar_turn_status",
    "ar_outbox_kind",
    "ar_job_status",
    "ar_ledger_action",
)
