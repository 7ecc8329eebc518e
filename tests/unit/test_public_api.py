"""The public names of ``agent_router`` are pinned, and every import the README and docs/ show
works as written."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import agent_router

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PUBLIC = [
    "Agent",
    "AgentRouterError",
    "AgentState",
    "AgentTerminatedError",
    "AskRefusedError",
    "BudgetExhaustedError",
    "CommitUnknownError",
    "ContentTooLargeError",
    "DedupConflictError",
    "Delivery",
    "Delta",
    "DuplicateDisplayNameError",
    "EndOfTurn",
    "FeedItem",
    "InvalidArgumentError",
    "InvalidMessageError",
    "InvalidNameError",
    "LedgerAction",
    "LedgerEvent",
    "Message",
    "MessageStatus",
    "MessageSubtype",
    "MessageType",
    "OwedRowsError",
    "Question",
    "QuestionClosedError",
    "QuestionStatus",
    "RefusedError",
    "ReservedNameError",
    "RouteOutcome",
    "Router",
    "Settings",
    "StaleTurnError",
    "StoreError",
    "Team",
    "ToolCallsPendingError",
    "Turn",
    "TurnStatus",
    "TurnTrigger",
    "UnknownAgentError",
    "UnknownQuestionError",
    "UnknownTeamError",
    "UserMessage",
    "UserMessageKind",
    "WaitOutcome",
    "__version__",
]


def test_all_is_pinned() -> None:
    assert agent_router.__all__ == PUBLIC


def test_every_public_name_exists() -> None:
    for name in agent_router.__all__:
        assert hasattr(agent_router, name), name


def doc_imports() -> list[tuple[str, ast.Import | ast.ImportFrom]]:
    """Every ``import agent_router...`` / ``from agent_router... import ...`` in a code block of
    the README or docs/, with the file it came from."""
    found: list[tuple[str, ast.Import | ast.ImportFrom]] = []
    for path in DOCS:
        for block in re.findall(r"```(?:python|py)\n(.*?)```", path.read_text(), re.S):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                if any(name.split(".")[0] == "agent_router" for name in names):
                    found.append((path.name, node))
    return found


def test_the_docs_show_imports() -> None:
    files = {name for name, _ in doc_imports()}
    assert {"README.md", "integration.md"} <= files


def test_every_import_in_the_docs_works() -> None:
    for doc, node in doc_imports():
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
            continue
        assert node.module is not None
        module = importlib.import_module(node.module)
        for alias in node.names:
            if not hasattr(module, alias.name):  # a submodule: `from package import module`
                importlib.import_module(f"{node.module}.{alias.name}")
            if node.module == "agent_router":
                assert alias.name in agent_router.__all__, f"{doc}: {alias.name} not in __all__"
