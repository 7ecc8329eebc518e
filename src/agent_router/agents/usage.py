"""Token usage of one model call, what it costs, and how a model reports it.

A Chat Completions response carries ``usage``: ``prompt_tokens``, ``completion_tokens`` and,
from servers that cache prompts, ``prompt_tokens_details.cached_tokens`` (part of the prompt
tokens, billed at a lower rate). :func:`usage_from_body` reads them. A server that sends no
usage (some compatible servers leave it out) gets an estimate from the request and the reply
(:func:`agent_router.agents.context.count_tokens`), marked ``estimated``: a budget in tokens
still holds against such a server.

Costs come from a price table: per model name, US dollars per million input, cached input and
output tokens (:class:`~agent_router.settings.ModelSpec`, the ``models`` setting). A model
missing from the table costs nothing: its tokens are still counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from agent_router.settings import ModelSpec
from agent_router.validation import MAX_TOKENS_PER_CALL


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Tokens of one model call. ``cached_tokens`` are part of ``prompt_tokens``."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False  # the server sent no usage: counted from the texts instead

    def __post_init__(self) -> None:
        if min(self.prompt_tokens, self.completion_tokens, self.cached_tokens) < 0:
            raise ValueError("token counts are never negative")
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError("cached tokens are part of the prompt tokens")

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One model call's result: the assistant message, and its usage when known."""

    message: dict[str, Any]
    usage: Usage | None = None
    model: str | None = None  # the model that answered (the request's name when unsure)


@runtime_checkable
class ReportsUsage(Protocol):
    """A model that reports what each call used (the OpenAI-compatible model does). Models that
    only have ``complete`` get their usage estimated by the loop."""

    def respond(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion: ...


def cost_of(usage: Usage, model: str | None, table: Mapping[str, ModelSpec]) -> float:
    """The cost of ``usage`` by ``model``'s row of ``table``; 0 for a model not in it."""
    spec = table.get(model or "")
    if spec is None:
        return 0.0
    return spec.cost(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def bounded(usage: Usage) -> Usage:
    """``usage`` as the team's budgets record it: a count past
    :data:`~agent_router.validation.MAX_TOKENS_PER_CALL` (far beyond any model's window, so
    a model's own report gone wrong) counted as that most, never refused: the call happened
    and its reply is kept."""
    counts = {
        name: min(getattr(usage, name), MAX_TOKENS_PER_CALL)
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens")
    }
    if all(getattr(usage, name) == count for name, count in counts.items()):
        return usage
    return replace(usage, **counts)


def _count(value: Any) -> int | None:
    """A token count as a server reports it; not one (a negative number, a string, a number
    past any window): ``None``, and the call's usage is estimated instead."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return value if 0 <= value <= MAX_TOKENS_PER_CALL else None


def usage_from_body(body: Any) -> Usage | None:
    """The ``usage`` of a Chat Completions response body; ``None`` when it is missing or
    unreadable (the caller then estimates)."""
    raw = body.get("usage") if isinstance(body, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    prompt = _count(raw.get("prompt_tokens"))
    completion = _count(raw.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    details = raw.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=min(cached or 0, prompt),
    )


__all__ = [
    "Completion",
    "ModelSpec",
    "ReportsUsage",
    "Usage",
    "bounded",
    "cost_of",
    "usage_from_body",
]
