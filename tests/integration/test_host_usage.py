"""A host's own loop is counted as the built-in loop is: each model call it makes through the
turn API (``turn.complete`` with the OpenAI SDK, or ``turn.model_call``) is charged to the team's
budgets before it is sent and its usage recorded after; a spent budget stops the turn; a reply
whose model call was not counted, or a model call left without its usage, fails the turn.

The host's task runs here in the test's process (the worker variant is in
test_host_owned.py), against a scripted OpenAI-compatible server over HTTP, on both
databases."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from agent_router import AgentState, LedgerAction, Router
from agent_router.agents import hosted
from agent_router.agents.llm import ScriptedModel
from agent_router.agents.tools import default_registry
from agent_router.domain import BudgetName
from agent_router.ops import cli
from tests.support.chat_server import (
    ChatServer,
    RecordedRequest,
    Reply,
    completion,
    scripted_lead,
    tool_call,
    usage,
)

RUNNER = "chat.lead_turn"
MODEL = "host-lead"


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer(scripted_lead("(host)", tokens=(100, 10))) as chat:
        yield chat


@pytest.fixture
def client(server: ChatServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0) as sdk:
        yield sdk


def lead_turn(router: Router, client: openai.OpenAI, team: int) -> tuple[str, list[str]]:
    """The host's task for the lead's scheduled turn, as docs/integration.md writes it; its
    outcome and the final replies it saved."""
    agent = router.agent(team, "Team Leader")
    saved: list[str] = []
    with hosted.claim(agent.id, agent.epoch, router=router, tools=default_registry()) as turn:
        assert turn is not None
        while (text := turn.step(turn.complete(client, model=MODEL))) is None:
            pass
        saved.append(text)
    return turn.outcome, saved


def _status(router: Router, team: int) -> dict[str, dict[str, Any]]:
    result = CliRunner().invoke(
        cli.app, ["status", str(team), "--json", "--database-url", router.settings.database_url]
    )
    assert result.exit_code == 0, result.output
    return {row["agent"]: row for row in map(json.loads, result.stdout.splitlines()) if row}


def _always_calls_a_tool() -> Callable[[RecordedRequest], Reply]:
    """A lead that never stops calling tools: only a budget ends its turn."""
    ids = itertools.count(1)

    def respond(_request: RecordedRequest) -> Reply:
        call = tool_call(f"call_{next(ids)}", "list_sub_agents", {})
        return completion(None, [call], usage=usage(100, 10, cached=40))

    return respond


def test_a_host_owned_lead_stops_at_its_model_call_budget_with_its_usage_recorded(
    router: Router, server: ChatServer, client: openai.OpenAI
) -> None:
    server.responder = _always_calls_a_tool()
    team = router.create_team(lead_runner=RUNNER, budget={BudgetName.MODEL_CALLS: 3}).id
    router.send(team, to="Team Leader", content="Keep an eye on the team.")
    outcome, saved = lead_turn(router, client, team)
    # The fourth call was refused before it was sent: the loop ended, nothing was saved.
    assert (outcome, saved) == ("stopped", [])
    assert len(server.requests) == 3
    lead = router.agent(team, "Team Leader")
    assert lead.state is AgentState.IDLE
    used = router.store.reads.usage_by_agent(team)[lead.id]
    assert (used.model_calls, used.prompt_tokens, used.completion_tokens) == (3, 300, 30)
    assert used.cached_tokens == 120
    budget = router.store.budget(team)
    assert budget.exhausted is BudgetName.MODEL_CALLS
    assert budget.used[BudgetName.MODEL_CALLS] == 3
    (stopped,) = [e for e in router.ledger(team) if e.action is LedgerAction.STOPPED]
    assert "model_calls budget is spent" in str(stopped.detail)
    # Every call of the three replies has its result: the turn stopped between two steps.
    transcript = router.transcript(team, "Team Leader")
    calls = [c["id"] for e in transcript if e["role"] == "assistant" for c in e["tool_calls"]]
    results = [e["tool_call_id"] for e in transcript if e["role"] == "tool"]
    assert calls == results == ["call_1", "call_2", "call_3"]
    row = _status(router, team)["Team Leader"]
    assert (row["model_calls"], row["prompt_tokens"], row["completion_tokens"]) == (3, 300, 30)


def test_a_host_owned_lead_following_the_docs_is_counted_call_by_call(
    router: Router, client: openai.OpenAI, server: ChatServer
) -> None:
    team = router.create_team(lead_runner=RUNNER).id
    router.send(team, to="Team Leader", content="Check.\n@list_sub_agents {}")
    outcome, saved = lead_turn(router, client, team)
    assert outcome == "ended"
    assert saved == ["(host) Done: 1 tool call(s), 0 refused."]
    # A tool call, then the final reply: two calls, each with the usage its server reported,
    # under the model the host asked for.
    assert len(server.requests) == 2
    assert [r.body["model"] for r in server.requests] == [MODEL, MODEL]
    lead = router.agent(team, "Team Leader")
    (per_turn,) = router.store.reads.usage_by_turn(lead.id).values()
    assert (per_turn.model_calls, per_turn.total_tokens) == (2, 220)
    calls = [e for e in router.ledger(team) if e.action is LedgerAction.MODEL_CALL]
    assert [e.detail["model"] for e in calls] == [MODEL, MODEL]
    assert router.store.budget(team).used[BudgetName.MODEL_CALLS] == 2


def test_a_model_call_of_another_client_records_the_usage_it_is_given_or_an_estimate(
    router: Router,
) -> None:
    team = router.create_team(lead_runner=RUNNER).id
    router.send(team, to="Team Leader", content="Status, please.")
    agent = router.agent(team, "Team Leader")
    model = ScriptedModel(script=None, name="Team Leader")
    with hosted.claim(agent.id, agent.epoch, router=router, tools=default_registry()) as turn:
        assert turn is not None
        with turn.model_call(model="in-house") as call:
            reply = model.complete(call.messages, call.tools)
            recorded = call.usage(None, reply=reply)  # the client reports no usage
        assert recorded.model_calls == 1
        assert recorded.prompt_tokens > 0 and recorded.completion_tokens > 0
        assert turn.step(reply) == "Noted 1 update(s) from user."
    assert turn.outcome == "ended"
    (event,) = [e for e in router.ledger(team) if e.action is LedgerAction.MODEL_CALL]
    assert event.detail["model"] == "in-house"
    assert event.detail["estimated"] is True


def test_a_reply_whose_model_call_was_not_counted_fails_the_turn(router: Router) -> None:
    team = router.create_team(lead_runner=RUNNER).id
    router.send(team, to="Team Leader", content="Status, please.")
    agent = router.agent(team, "Team Leader")
    model = ScriptedModel(script=None, name="Team Leader")
    with (
        pytest.raises(hosted.UncountedModelCallError, match="not counted"),
        hosted.claim(agent.id, agent.epoch, router=router, tools=default_registry()) as turn,
    ):
        assert turn is not None
        turn.step(model.complete(turn.messages(), turn.tools))  # the model called directly
    assert turn is not None and turn.outcome == "failed"
    assert router.transcript(team, "Team Leader")[-1]["role"] != "assistant"
    assert router.store.budget(team).used[BudgetName.MODEL_CALLS] == 0


def test_a_model_call_left_without_its_usage_fails_the_turn(router: Router) -> None:
    team = router.create_team(lead_runner=RUNNER).id
    router.send(team, to="Team Leader", content="Status, please.")
    agent = router.agent(team, "Team Leader")
    model = ScriptedModel(script=None, name="Team Leader")
    with (
        pytest.raises(hosted.UncountedModelCallError, match="without its usage"),
        hosted.claim(agent.id, agent.epoch, router=router, tools=default_registry()) as turn,
    ):
        assert turn is not None
        with turn.model_call(model="in-house") as call:
            model.complete(call.messages, call.tools)
    assert turn is not None and turn.outcome == "failed"
    # The call was charged when it was opened: the budget counts it.
    assert router.store.budget(team).used[BudgetName.MODEL_CALLS] == 1
    assert not [e for e in router.ledger(team) if e.action is LedgerAction.MODEL_CALL]
