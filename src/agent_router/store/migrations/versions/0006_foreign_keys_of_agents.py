"""foreign keys of agents: a row of an agent refers to the agent's (id, team_id), not to its team

Every row that belongs to an agent (a message's sender and target, a question's asker and
target, a turn, an outbox row, a background job, a ledger event, a model call) had a foreign
key on ``ar_teams`` and one on ``ar_agents``. Each check of the first locked the team's one row
(``FOR KEY SHARE``) in every concurrent writer of the team. Now one foreign key on the agent's
``(id, team_id)`` checks both on the agent's row, which the hot paths' writers hold locked
already, and also that the row's team is its agent's.

Create Date: 2026-12-06 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Each table, and its columns that hold the id of an agent of the row's team.
AGENT_COLUMNS = {
    "ar_messages": ("source_agent_id", "target_agent_id"),
    "ar_questions": ("asker_agent_id", "target_agent_id"),
    "ar_turns": ("agent_id",),
    "ar_outbox": ("agent_id",),
    "ar_background_jobs": ("agent_id",),
    "ar_ledger": ("agent_id",),
    "ar_model_calls": ("agent_id",),
}
AGENT_KEY = "ix_ar_agents_id_team"


def upgrade() -> None:
    with op.batch_alter_table("ar_agents", schema=None) as batch_op:
        batch_op.create_index(AGENT_KEY, ["id", "team_id"], unique=True)
    for table, columns in AGENT_COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f"fk_{table}_team_id_ar_teams", type_="foreignkey")
            for column in columns:
                name = f"fk_{table}_{column}_ar_agents"
                batch_op.drop_constraint(name, type_="foreignkey")
                batch_op.create_foreign_key(
                    name, "ar_agents", [column, "team_id"], ["id", "team_id"]
                )


def downgrade() -> None:
    for table, columns in AGENT_COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in columns:
                name = f"fk_{table}_{column}_ar_agents"
                batch_op.drop_constraint(name, type_="foreignkey")
                batch_op.create_foreign_key(name, "ar_agents", [column], ["id"])
            batch_op.create_foreign_key(
                f"fk_{table}_team_id_ar_teams", "ar_teams", ["team_id"], ["id"]
            )
    with op.batch_alter_table("ar_agents", schema=None) as batch_op:
        batch_op.drop_index(AGENT_KEY)
