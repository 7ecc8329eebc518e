"""team model: ar_teams.model, the model a team's agents run on

A chat product serves its teams on different models: the model named when a team is created
(``Router.create_team(model=...)``) is what every agent of the team runs on in the built-in
loop, whatever its role names. NULL: each role's model, else the worker's
``AGENT_ROUTER_OPENAI_MODEL``. ``scripted`` names the built-in scripted model (demo, tests).

Create Date: 2026-12-07 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ar_teams") as batch:
        batch.add_column(sa.Column("model", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ar_teams") as batch:
        batch.drop_column("model")
