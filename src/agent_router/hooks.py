"""Extension points of the :class:`~agent_router.router.Router`: a small hook class whose methods
do nothing, so that metrics, Celery task events or a host's own telemetry can watch routing and
turns without the core importing any of them (dramatiq's middleware shape).

Hooks run after the transition committed. A hook that raises is logged and ignored: observing
the router can never fail or undo a delivery.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from agent_router.logfields import get_logger

if TYPE_CHECKING:
    from agent_router.domain import (
        BudgetName,
        CallSpan,
        Delivery,
        Delta,
        EndOfTurn,
        TokenUsage,
        WaitOutcome,
    )
    from agent_router.errors import AgentRouterError
    from agent_router.turn import Turn

logger = get_logger(__name__)


class RouterHooks:
    """Every method is a no-op; subclass and override the ones you need."""

    def after_route(self, team_id: int, sender: str, delivery: Delivery) -> None:
        """A message was committed and delivered (``delivery.outcome`` says how)."""

    def after_reject(self, team_id: int | None, sender: str, error: AgentRouterError) -> None:
        """A send was refused (outcome ``rejected``); nothing but a ledger event was written."""

    def after_claim(self, turn: Turn) -> None:
        """A turn was claimed: the agent is ``running`` (``turn.trigger`` says why)."""

    def after_wait(self, turn: Turn, outcome: WaitOutcome, seconds: float) -> None:
        """A blocked ask stopped blocking the worker: answered (``resolved``) or ``suspended``."""

    def after_end_turn(self, turn: Turn, end: EndOfTurn, seconds: float, *, failed: bool) -> None:
        """The end-of-turn hook ran (``failed``: the loop raised); ``seconds`` since the claim."""

    def after_model_call(self, turn: Turn, model: str | None, usage: TokenUsage) -> None:
        """A model call's usage was recorded (tokens, and cost by the price table)."""

    def after_call(self, turn: Turn, span: CallSpan) -> None:
        """A model call (its usage recorded with its duration) or a tool call (its result
        appended) ended: ``span`` says which, when it started and how long it took."""

    def after_budget_exhausted(self, team_id: int, budget: BudgetName) -> None:
        """A team budget was found spent (once per team until it is raised): the team stops."""

    def after_delta(self, team_id: int, agent: str, delta: Delta) -> None:
        """A streamed model call of ``agent`` wrote a piece of its reply (nothing committed:
        the reply is stored whole when the call ends). Called in the model call's thread."""


def route_fields(team_id: int, sender: str, delivery: Delivery) -> dict[str, Any]:
    """What a hook reports of a delivered message: its team, sender, target, outcome and id."""
    return {
        "team_id": team_id,
        "sender": sender,
        "target": delivery.target,
        "outcome": delivery.outcome.value,
        "message_id": delivery.message_id,
    }


class HookChain(RouterHooks):
    """Several hooks, called in order; one that raises does not keep the others from running."""

    def __init__(self, hooks: Iterable[RouterHooks]) -> None:
        self.hooks = list(hooks)

    def after_route(self, team_id: int, sender: str, delivery: Delivery) -> None:
        for hook in self.hooks:
            _safely(hook.after_route, team_id, sender, delivery)

    def after_reject(self, team_id: int | None, sender: str, error: AgentRouterError) -> None:
        for hook in self.hooks:
            _safely(hook.after_reject, team_id, sender, error)

    def after_claim(self, turn: Turn) -> None:
        for hook in self.hooks:
            _safely(hook.after_claim, turn)

    def after_wait(self, turn: Turn, outcome: WaitOutcome, seconds: float) -> None:
        for hook in self.hooks:
            _safely(hook.after_wait, turn, outcome, seconds)

    def after_end_turn(self, turn: Turn, end: EndOfTurn, seconds: float, *, failed: bool) -> None:
        for hook in self.hooks:
            _safely(functools.partial(hook.after_end_turn, failed=failed), turn, end, seconds)

    def after_model_call(self, turn: Turn, model: str | None, usage: TokenUsage) -> None:
        for hook in self.hooks:
            _safely(hook.after_model_call, turn, model, usage)

    def after_call(self, turn: Turn, span: CallSpan) -> None:
        for hook in self.hooks:
            _safely(hook.after_call, turn, span)

    def after_budget_exhausted(self, team_id: int, budget: BudgetName) -> None:
        for hook in self.hooks:
            _safely(hook.after_budget_exhausted, team_id, budget)

    def after_delta(self, team_id: int, agent: str, delta: Delta) -> None:
        for hook in self.hooks:
            _safely(hook.after_delta, team_id, agent, delta)


def _safely(method: Callable[..., None], *args: Any) -> None:
    try:
        method(*args)
    except Exception:
        logger.exception("router hook failed", extra={"action": "hook", "hook": repr(method)})
