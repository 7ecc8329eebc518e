"""Every function docs/architecture.md names as keeping a guarantee exists under that name."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from agent_router.store import functions

ROOT = Path(__file__).resolve().parents[2]
CLASSES = {
    "Router": "agent_router.router",
    "Store": "agent_router.store.store",
    "SqliteStore": "agent_router.store.sqlite",
    "PostgresStore": "agent_router.store.postgres",
    "Turn": "agent_router.turn",
}


def resolve(dotted: str) -> Any:
    """``Router.send`` (a class of the package and its attribute) or ``store.turns.drain`` (a
    module under ``agent_router`` and its attribute)."""
    parts = dotted.split(".")
    if parts[0] in CLASSES:
        obj: Any = getattr(importlib.import_module(CLASSES[parts[0]]), parts[0])
        rest = parts[1:]
    else:
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module("agent_router." + ".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            rest = parts[i:]
            break
        else:
            raise AssertionError(f"no module for {dotted}")
    for name in rest:
        obj = getattr(obj, name)
    return obj


def kept_by_names() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    blocks = re.findall(r"^\*Kept by\*:(.*?)(?:\n\n)", text, re.S | re.M)
    return {n for block in blocks for n in re.findall(r"`([A-Za-z_][\w.]*)`", block)}


def test_every_guarantee_names_its_keepers() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    guarantees = re.findall(r"^### \d+\. .*\n\*Kept by\*:", text, re.M)
    assert len(guarantees) == 10


def test_every_named_keeper_exists() -> None:
    names = {n for n in kept_by_names() if "." in n or n in CLASSES}
    assert len(names) > 30
    for name in sorted(names):
        resolve(name)
    # The keepers of the PostgreSQL implementation: functions the store installs.
    defined = set(functions.names())
    sql = {n for n in kept_by_names() if n.startswith("ar_")}
    assert len(sql) > 8
    assert sql <= defined, sorted(sql - defined)
