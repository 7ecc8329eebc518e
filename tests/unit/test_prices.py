"""A model the price table does not list costs $0, so a cost budget cannot stop a team that
uses it: the process says so once per model, while a cost budget is set."""

from __future__ import annotations

import logging
import uuid

import pytest

from agent_router.budgeting import priced
from agent_router.settings import ModelSpec, Settings


def test_an_unpriced_model_is_said_once_while_a_cost_budget_is_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unpriced, listed = f"m-{uuid.uuid4().hex[:6]}", f"p-{uuid.uuid4().hex[:6]}"
    settings = Settings(models={listed: ModelSpec(input=1.0, output=2.0)})
    with caplog.at_level(logging.WARNING, logger="agent_router.budgeting"):
        for _ in range(3):
            assert priced(settings, unpriced, prompt_tokens=10, completion_tokens=5,
                          cached_tokens=0).cost_usd == 0.0  # fmt: skip
            assert priced(settings, listed, prompt_tokens=10**6, completion_tokens=0,
                          cached_tokens=0).cost_usd == 1.0  # fmt: skip
            priced(settings, None, prompt_tokens=1, completion_tokens=1, cached_tokens=0)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1
    assert said[0].startswith(f"model {unpriced!r} has no price in AGENT_ROUTER_MODELS")
    assert "$10 cost budget" in said[0]


def test_nothing_is_said_without_a_cost_budget(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(budget_cost_usd=None)
    with caplog.at_level(logging.WARNING, logger="agent_router.budgeting"):
        priced(settings, f"m-{uuid.uuid4().hex[:6]}", prompt_tokens=1, completion_tokens=1,
               cached_tokens=0)  # fmt: skip
    assert caplog.records == []
