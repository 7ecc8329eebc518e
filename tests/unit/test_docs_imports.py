"""Every module and name the integration guide and the README import exists: an integrator who
copies an import from the docs never meets an ImportError."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from agent_router.constants import BACKGROUND_DONE, RUN_AGENT_TURN, SWEEP

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "integration.md", ROOT / "docs" / "deployment.md"]
#: Where a dotted `agent_router.x` names a module or an attribute (deployment.md also names
#: spans and metrics that way).
CODE_DOCS = [ROOT / "README.md", ROOT / "docs" / "integration.md"]
FROM_IMPORT = re.compile(r"^\s*from (agent_router[\w.]*) import ([\w, ]+)", re.M)
DOTTED = re.compile(r"`(agent_router(?:\.\w+)+)")
#: Celery task names, which look like dotted names but name tasks, not modules.
TASK_NAMES = {RUN_AGENT_TURN, SWEEP, BACKGROUND_DONE}


def _imports() -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for doc in DOCS:
        for module, names in FROM_IMPORT.findall(doc.read_text()):
            found.update((module, n.strip()) for n in names.split(",") if n.strip())
    return sorted(found)


def _dotted() -> list[str]:
    names = {m for doc in CODE_DOCS for m in DOTTED.findall(doc.read_text())}
    return sorted(names - TASK_NAMES)


@pytest.mark.parametrize(("module", "name"), _imports())
def test_documented_import_exists(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    if not hasattr(imported, name):
        importlib.import_module(f"{module}.{name}")  # a submodule


@pytest.mark.parametrize("dotted", _dotted())
def test_documented_dotted_name_resolves(dotted: str) -> None:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return
    pytest.fail(f"{dotted} does not resolve")
