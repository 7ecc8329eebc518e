"""The rules and constants both stores apply: the texts a transition writes (synthetic tool
results, reasons, dedup keys), the checks at the store's door, and how budgets are stored and
read. :class:`~agent_router.store.sqlite.SqliteStore`'s modules and
:class:`~agent_router.store.postgres.PostgresStore` (which hands them to the functions) import
them from here, so one text, one check, holds on both databases."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_router import errors, limits, validation
from agent_router.domain import Budget, BudgetName, TokenUsage
from agent_router.settings import Settings
from agent_router.store.models import BudgetRow

# ---------------------------------------------------------------------------- what is written

#: The synthetic result of a tool call whose turn died or ended first. It says that the call may
#: have taken effect (a sub-agent created, a message sent) so that the model looks before it
#: repeats a call that is not idempotent.
INTERRUPTED_RESULT = (
    "interrupted: the turn running this tool call ended before it returned; it may or may not "
    "have taken effect, so check (list_sub_agents, list_agents, get_sub_agent_status) before "
    "repeating it"
)

#: The synthetic result of a tool call left open when its agent was stopped.
STOPPED_RESULT = "cancelled: the agent was stopped before this tool call ran"

#: The tool result of a question that expired unanswered.
EXPIRED_RESULT = "expired: no answer arrived before the question's deadline"

#: The reason of the stop a user's interrupt requests (its ``stop_requested`` event).
INTERRUPT_REASON = "interrupted by the user"

#: The dedup key of a question's reminder is this and the question's id: one per question.
REMINDER_PREFIX = "remind:"

#: A burst of background-job completions delays its agent's turn by at most this many batch
#: windows (``Settings.background_batch_seconds``) after the first completion.
JOB_BATCH_MAX_WINDOWS = 10

# ---------------------------------------------------------------------------- the store's door


def is_external(sender: str) -> bool:
    """Whether ``sender`` is no agent of the team: the user, the system, a background job."""
    return sender in validation.EXTERNAL_SENDERS or (
        sender.startswith(validation.EXTERNAL_PREFIX)
        and len(sender) > len(validation.EXTERNAL_PREFIX)
    )


def check_display_name(name: str) -> None:
    """The rule the router applies to a sub-agent's display name (one rule:
    :func:`agent_router.validation.display_name`), again at the store's door."""
    validation.display_name(name)


def check_role(role: str) -> str:
    """The role name, stripped; refused if empty, too long, or shaped like a markup or an
    external sender."""
    role = role.strip()
    if (
        not role
        or len(role) > validation.MAX_ROLE_CHARS
        or any(c in role for c in '"\n\r<>')
        or role.startswith(validation.EXTERNAL_PREFIX)
    ):
        raise errors.InvalidMessageError(f"invalid role name {role!r}")
    return role


def validate_assistant(message: dict[str, Any]) -> dict[str, Any]:
    """The model's reply as the transcript stores it; refused
    (:class:`~agent_router.errors.InvalidTranscriptEntryError`) unless it is an assistant
    message with content or well-formed tool calls of distinct ids."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise errors.InvalidTranscriptEntryError("an assistant message needs role 'assistant'")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise errors.InvalidTranscriptEntryError("assistant content must be a string or None")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise errors.InvalidTranscriptEntryError("tool_calls must be a list")
    seen: set[str] = set()
    for call in calls:
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("id"), str)
            or not call["id"]
            or not isinstance(call.get("function"), dict)
            or not isinstance(call["function"].get("name"), str)
        ):
            raise errors.InvalidTranscriptEntryError(f"malformed tool call {call!r}")
        if call["id"] in seen:
            raise errors.InvalidTranscriptEntryError(f"duplicate tool call id {call['id']!r}")
        seen.add(call["id"])
    if content is None and not calls:
        raise errors.InvalidTranscriptEntryError("an assistant message needs content or tool calls")
    payload: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        payload["tool_calls"] = calls
    return payload


# ---------------------------------------------------------------------------- budgets

#: Costs are stored in nano-dollars (1e-9 USD): integer sums, no rounding drift.
NANO = limits.NANO

#: The column of each limit on ``ar_budgets`` (the boundary checks a limit against its column).
LIMIT_COLUMNS: Mapping[BudgetName, str] = {
    BudgetName.MODEL_CALLS: "max_model_calls",
    BudgetName.TURNS: "max_turns",
    BudgetName.TOKENS: "max_tokens",
    BudgetName.COST: "max_cost_nano",
    BudgetName.WALL_SECONDS: "max_wall_seconds",
    BudgetName.SUB_AGENTS_CREATED: "max_sub_agents_created",
    BudgetName.SUB_AGENTS_ACTIVE: "max_sub_agents_active",
}

#: The most a cost (nano-dollars) or a team's total holds: the 64-bit columns' range.
MAX_STORED = limits.integer_range(sa.BigInteger())[1]


def default_limits(settings: Settings) -> dict[BudgetName, float | None]:
    """A new team's limits, from the ``budget_*`` settings."""
    return {
        BudgetName.MODEL_CALLS: settings.budget_model_calls,
        BudgetName.TURNS: settings.budget_turns,
        BudgetName.TOKENS: settings.budget_tokens,
        BudgetName.COST: settings.budget_cost_usd,
        BudgetName.WALL_SECONDS: settings.budget_wall_seconds,
        BudgetName.SUB_AGENTS_CREATED: settings.budget_sub_agents_created,
        BudgetName.SUB_AGENTS_ACTIVE: settings.budget_sub_agents_active,
    }


def stored_limits(limits: Mapping[BudgetName, float | None]) -> dict[str, float | int | None]:
    """``limits`` as the budget row's columns store them (cost in nano-dollars), by column."""
    return {LIMIT_COLUMNS[name]: stored_limit(name, value) for name, value in limits.items()}


def stored_limit(name: BudgetName, value: float | None) -> float | int | None:
    """One limit as its column stores it; refused when negative, or fractional but for wall
    time and cost."""
    if value is None:
        return None
    if value < 0:
        raise errors.InvalidMessageError(f"budget {name.value} must not be negative")
    if name is BudgetName.COST:
        return round(value * NANO)
    if name is BudgetName.WALL_SECONDS:
        return float(value)
    if value != int(value):
        raise errors.InvalidMessageError(f"budget {name.value} must be a whole number")
    return int(value)


def budget_limit(row: BudgetRow, name: BudgetName) -> float | None:
    """The team's limit ``name`` as its budget row holds it (cost in dollars); ``None``: none."""
    value: float | None = getattr(row, LIMIT_COLUMNS[name])
    if value is None:
        return None
    return value / NANO if name is BudgetName.COST else value


def budget_used(
    row: BudgetRow, name: BudgetName, now: datetime, sub_agents: tuple[int, int]
) -> float:
    """What the team used of ``name`` at ``now``, by its budget row and its sub-agents
    (created, active)."""
    if name is BudgetName.MODEL_CALLS:
        return row.model_calls
    if name is BudgetName.TURNS:
        return row.turns
    if name is BudgetName.TOKENS:
        return row.prompt_tokens + row.completion_tokens
    if name is BudgetName.COST:
        return row.cost_nano / NANO
    if name is BudgetName.WALL_SECONDS:
        return max(0.0, (now - row.started_at).total_seconds())
    created, active = sub_agents
    return created if name is BudgetName.SUB_AGENTS_CREATED else active


def budget_of(row: BudgetRow, counts: tuple[int, int], now: datetime) -> Budget:
    """A team's limits and use, from its budget row and its sub-agents (created, active)."""
    return Budget(
        team_id=row.team_id,
        limits={name: budget_limit(row, name) for name in BudgetName},
        used={name: budget_used(row, name, now, counts) for name in BudgetName},
        usage=TokenUsage(
            model_calls=row.model_calls,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            cached_tokens=row.cached_tokens,
            cost_usd=row.cost_nano / NANO,
        ),
        warned=row.warned,
        exhausted=row.exhausted,
        started_at=row.started_at,
    )


def priced(settings: Settings, model: str | None) -> bool:
    """Whether the ``models`` price table lists ``model``: a model call of one it does not list
    costs $0 by the table, and its ``model_call`` event says ``unpriced``."""
    return model is not None and model in settings.models


def call_cost_nano(cost_usd: float) -> int:
    """A model call's cost in nano-dollars as its column holds it: one past the column's range,
    or not a finite number (a price times 2**40 tokens, an infinite price), is the most the
    column holds (:data:`MAX_STORED`); a negative one is 0."""
    nano = cost_usd * NANO
    if math.isnan(nano) or nano >= MAX_STORED:
        return MAX_STORED
    return max(0, round(nano))
