"""agent-router: durable, receiver-state message routing between LLM agents on Celery.

``Router``, ``Settings`` and ``Turn`` are imported on first use: importing the package (or one
of its modules, such as the CLI) does not load SQLAlchemy, pydantic-settings and redis-py
until something needs them, so a short command like ``agent-router status`` starts quickly."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent_router.domain import (
    Agent,
    AgentState,
    Delivery,
    Delta,
    EndOfTurn,
    FeedItem,
    LedgerAction,
    LedgerEvent,
    Message,
    MessageStatus,
    MessageSubtype,
    MessageType,
    Question,
    QuestionStatus,
    RouteOutcome,
    Team,
    TurnStatus,
    TurnTrigger,
    UserMessage,
    UserMessageKind,
    WaitOutcome,
)
from agent_router.errors import (
    AgentRouterError,
    AgentTerminatedError,
    AskRefusedError,
    BudgetExhaustedError,
    CommitUnknownError,
    ContentTooLargeError,
    DedupConflictError,
    DuplicateDisplayNameError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidNameError,
    OwedRowsError,
    QuestionClosedError,
    RefusedError,
    ReservedNameError,
    StaleTurnError,
    StoreError,
    ToolCallsPendingError,
    UnknownAgentError,
    UnknownQuestionError,
    UnknownTeamError,
)

if TYPE_CHECKING:
    from agent_router.router import Router
    from agent_router.settings import Settings
    from agent_router.turn import Turn

#: The public names loaded on first use, and the module each lives in.
_LAZY = {
    "Router": "agent_router.router",
    "Settings": "agent_router.settings",
    "Turn": "agent_router.turn",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
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
