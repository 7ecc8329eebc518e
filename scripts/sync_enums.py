"""Pre-release helper: rewrite the enum label lists of migration 0001 from the Python enums.
Once a version is released, new labels need a new migration instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import sqlalchemy as sa

from agent_router.store.models import Base

path = (
    Path(__file__).parents[1] / "src/agent_router/store/migrations/versions/0001_initial_schema.py"
)
enums = {
    col.type.name: list(col.type.enums)
    for table in Base.metadata.tables.values()
    for col in table.columns
    if isinstance(col.type, sa.Enum)
}
text = path.read_text()
for name, labels in enums.items():
    rendered = ", ".join(f'"{label}"' for label in labels)
    pattern = rf"sa\.Enum\([^)]*name=[\"']{name}[\"']"
    text = re.sub(pattern, f'sa.Enum({rendered}, name="{name}"', text)
path.write_text(text)
subprocess.run(["ruff", "format", str(path)], check=True)
