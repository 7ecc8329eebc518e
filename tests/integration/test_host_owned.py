"""Host-owned agents on a real worker (Redis, PostgreSQL): every path that starts a turn of an
agent whose runner is a host's task publishes that task by name, and the built-in loop never
runs such a turn.

The host's task is registered on the test's own Celery app (as a host would) and calls its lead's
model as the docs show, ``turn.complete`` with the OpenAI SDK, here against a scripted server
whose replies are marked ``(host)``: a lead reply without the mark would have come from the
built-in loop. Every model call of the host's loop is counted against the team's budgets."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from celery import Celery
from kombu import Queue

from agent_router import (
    AgentState,
    InvalidMessageError,
    LedgerAction,
    MessageSubtype,
    MessageType,
    Router,
    Settings,
    TurnTrigger,
)
from agent_router.agents import hosted
from agent_router.agents.llm import directive
from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.tools import ToolContext, default_registry
from agent_router.constants import RUN_AGENT_TURN
from agent_router.domain import BudgetName, OutboxKind
from agent_router.ops.checks import check_team
from agent_router.ops.demo import wait_quiescent, wait_until
from agent_router.worker import install, runtime
from agent_router.worker.runtime import Runtime
from agent_router.worker.threaded import thread_worker
from tests.support.chat_server import ChatServer, completion, scripted_lead, tool_call, usage

TIMEOUT = 60.0
#: What each of the host's model calls uses, as its server reports it.
TOKENS = (100, 10)


@pytest.fixture
def lead_server() -> Iterator[ChatServer]:
    """The host's model server: the scripted lead, replies marked ``(host)``."""
    with ChatServer(scripted_lead("(host)", tokens=TOKENS)) as server:
        yield server


@pytest.fixture
def host_worker(
    celery_settings: Settings,
    redis_url: str,
    lead_server: ChatServer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Runtime, str]]:
    """A host app with its own task for lead turns, wired with ``install``; one worker consumes
    the host's queue and the router's. Returns the runtime and the lead runner."""
    monkeypatch.setenv("AGENT_ROUTER_WORKER_SWEEPER", "false")  # sweeps are run by the tests
    host_queue = f"host.{uuid.uuid4().hex[:8]}"
    app = Celery(f"host_{uuid.uuid4().hex[:6]}", broker=redis_url)
    task_name = f"host.lead_turn_{uuid.uuid4().hex[:6]}"
    # A blocked wait suspends quickly, so that the lead's continuation turns are exercised.
    settings = celery_settings.model_copy(update={"ask_block_seconds": 0.2})

    client = openai.OpenAI(base_url=lead_server.base_url, api_key="test", max_retries=0)

    @app.task(name=task_name, acks_late=True, reject_on_worker_lost=True)
    def lead_turn(agent_id: int, epoch: int) -> str:
        with hosted.claim(agent_id, epoch) as turn:
            if turn is None:
                return "refused"
            while turn.step(turn.complete(client, model="host-lead")) is None:
                pass
        return str(turn.outcome)

    install(app, settings)
    rt = runtime.configure(settings, app=app)
    try:
        with (
            client,
            thread_worker(app, concurrency=8, queues=[host_queue, celery_settings.queue]),
        ):
            yield rt, f"{task_name}@{host_queue}"
    finally:
        runtime.reset()
        with app.connection_for_write() as conn:
            for queue in (host_queue, celery_settings.queue):
                Queue(queue, channel=conn.default_channel).delete()
        app.close()


def _lead_texts(router: Router, team: int) -> list[str]:
    return [
        str(e["content"])
        for e in router.transcript(team, "Team Leader")
        if e["role"] == "assistant" and e.get("content")
    ]


def _claims(router: Router, team: int, name: str) -> list[TurnTrigger]:
    return [t.trigger for t in router.store.reads.turns(router.agent(team, name).id)]


def test_sends_follow_ups_and_continuations_of_a_host_owned_lead_run_the_hosts_task(
    host_worker: tuple[Runtime, str],
) -> None:
    rt, runner = host_worker
    router = rt.router
    team = router.create_team(lead_runner=runner).id
    assert router.agent(team, "Team Leader").runner == runner
    # The lead staffs a sub-agent (built-in loop) that asks it a question first: the lead's
    # host turn answers it with the built-in tool, the sub-agent finishes and reports.
    ask = directive("ask_master", question="Which auth module?")
    create = directive("create_sub_agent", role="Full-Stack Engineer", task=f"Build it.\n{ask}")
    router.send(team, to="Team Leader", content=f"Build the login page.\n{create}")
    wait_until(
        lambda: any("from Full-Stack Engineer_1" in t for t in _lead_texts(router, team)),
        "the sub-agent's report to reach the host's lead",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team, timeout=TIMEOUT)
    texts = _lead_texts(router, team)
    assert texts and all(t.startswith("(host) ") for t in texts)
    # The sub-agent ran on the built-in loop, and its question was answered by the host's lead.
    sub_texts = [
        e for e in router.transcript(team, "Full-Stack Engineer_1") if e["role"] == "assistant"
    ]
    assert sub_texts and not any(str(e.get("content")).startswith("(host)") for e in sub_texts)
    asks = [e for e in router.ledger(team) if e.action is LedgerAction.QUESTION_RESOLVED]
    assert asks
    assert len(_claims(router, team, "Team Leader")) >= 2  # the send, then the report's turn
    assert check_team(router, team, quiescent=True).violations == []


def test_a_host_owned_lead_stops_at_its_model_call_budget_on_the_worker(
    host_worker: tuple[Runtime, str], lead_server: ChatServer
) -> None:
    rt, runner = host_worker
    router = rt.router
    ids = iter(range(1, 100))
    # A lead that never stops calling tools: only the budget ends its turn.
    lead_server.responder = lambda _request: completion(
        None, [tool_call(f"call_{next(ids)}", "list_sub_agents", {})], usage=usage(*TOKENS)
    )
    team = router.create_team(lead_runner=runner, budget={BudgetName.MODEL_CALLS: 3}).id
    router.send(team, to="Team Leader", content="Keep an eye on the team.")
    wait_until(
        lambda: any(e.action is LedgerAction.STOPPED for e in router.ledger(team)),
        "the lead's turn to stop at the budget",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team, timeout=TIMEOUT)
    assert len(lead_server.requests) == 3  # the fourth call was refused before it was sent
    lead = router.agent(team, "Team Leader")
    assert lead.state is AgentState.IDLE
    used = router.store.reads.usage_by_agent(team)[lead.id]
    assert (used.model_calls, used.prompt_tokens, used.completion_tokens) == (
        3,
        3 * TOKENS[0],
        3 * TOKENS[1],
    )
    budget = router.store.budget(team)
    assert (budget.exhausted, budget.used[BudgetName.MODEL_CALLS]) == (BudgetName.MODEL_CALLS, 3)
    assert _claims(router, team, "Team Leader") == [TurnTrigger.NEW]
    assert check_team(router, team, quiescent=True).violations == []


def test_a_suspended_host_turn_continues_in_the_hosts_task(
    host_worker: tuple[Runtime, str], celery_settings: Settings
) -> None:
    rt, runner = host_worker
    router = rt.router
    team = router.create_team(lead_runner=runner).id
    router.create_agent(team, role="UI Operator")
    # The sub-agent's turn is held here (its task is never published), so it writes its output
    # only once the lead's wait has suspended.
    offline = Router(celery_settings, publisher=None)
    offline.send(team, to="UI Operator_1", content="Build the form.", sender="Team Leader")
    sub = offline.claim_turn(team, "UI Operator_1")
    assert sub is not None
    sub.drain()
    wait = directive("wait_sub_agent_output", display_name="UI Operator_1")
    router.send(team, to="Team Leader", content=f"Wait for the form.\n{wait}")
    wait_until(
        lambda: router.agent(team, "Team Leader").suspended,
        "the host's lead to suspend in its wait",
        timeout=TIMEOUT,
    )
    sub.append_assistant({"role": "assistant", "content": "The form is built."})
    router.send(
        team,
        to="Team Leader",
        content="The form is built.",
        sender="UI Operator_1",
        type=MessageType.OUTPUT,
        subtype=MessageSubtype.COMPLETION_REPORT,
    )
    sub.end()
    offline.close()
    wait_until(
        lambda: TurnTrigger.CONTINUATION in _claims(router, team, "Team Leader"),
        "the lead's continuation turn",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team, timeout=TIMEOUT)
    assert _claims(router, team, "Team Leader")[:2] == [TurnTrigger.NEW, TurnTrigger.CONTINUATION]
    texts = _lead_texts(router, team)
    assert texts and all(t.startswith("(host) ") for t in texts)
    assert check_team(router, team, quiescent=True).violations == []


def test_a_built_in_turn_task_for_a_host_owned_agent_is_forwarded(
    host_worker: tuple[Runtime, str], celery_settings: Settings
) -> None:
    rt, runner = host_worker
    offline = Router(celery_settings, publisher=None)  # commits the turn enqueue only
    team = offline.create_team(lead_runner=runner).id
    offline.send(team, to="Team Leader", content="Status, please.")
    epoch = offline.agent(team, "Team Leader").epoch
    lead_id = offline.agent(team, "Team Leader").id
    offline.close()
    # A delivery of the built-in task (an outbox row of an older release, a hand-sent task):
    # the built-in loop does not run it; the host's task does, under the same fence.
    rt.app.send_task(RUN_AGENT_TURN, args=(lead_id, epoch))
    router = rt.router
    wait_until(lambda: _lead_texts(router, team) != [], "the host's lead reply", timeout=TIMEOUT)
    assert _lead_texts(router, team) == ["(host) Noted 1 update(s) from user."]
    # The turn's outbox row itself, published now (as the sweeper re-publishes), is a stale
    # duplicate. (The other row is the lead's answer to the user.)
    (entry,) = [e for e in router.outbox(team) if e.kind is OutboxKind.ENQUEUE_TURN]
    assert entry.payload["task"] == runner
    assert router.publisher is not None
    router.publisher.publish(entry)
    wait_quiescent(router, team, timeout=TIMEOUT)
    assert _claims(router, team, "Team Leader") == [TurnTrigger.NEW]


def test_a_taken_over_host_turn_is_recovered_by_the_hosts_task(
    host_worker: tuple[Runtime, str],
) -> None:
    rt, runner = host_worker
    router = rt.router
    team = router.create_team(lead_runner=runner).id
    offline = Router(router.settings, publisher=None)
    offline.send(team, to="Team Leader", content="Plan the release.")
    offline.close()
    dead = router.claim_turn(team, "Team Leader")  # ... and its worker dies
    assert dead is not None
    router.take_over(team, "Team Leader", reason="worker lost")
    wait_until(lambda: _lead_texts(router, team) != [], "the recovered reply", timeout=TIMEOUT)
    wait_quiescent(router, team, timeout=TIMEOUT)
    assert _lead_texts(router, team) == ["(host) Noted 1 update(s) from user."]
    assert _claims(router, team, "Team Leader") == [TurnTrigger.NEW, TurnTrigger.RECOVERY]
    assert router.agent(team, "Team Leader").state is AgentState.COMPLETED


def test_answer_by_question_id_and_names_on_questions(host_worker: tuple[Runtime, str]) -> None:
    rt, _runner = host_worker
    router = Router(rt.router.settings, publisher=None)  # nothing runs, the states stay put
    try:
        team = router.create_team().id
        router.create_agent(team, role="UI Operator")
        router.send(team, to="UI Operator_1", content="start", sender="user")
        turn = router.claim_turn(team, "UI Operator_1")
        assert turn is not None
        turn.drain()
        call = {"id": "ask-1", "type": "function", "function": {"name": "ask_master"}}
        turn.append_assistant({"role": "assistant", "content": None, "tool_calls": [call]})
        question = turn.ask("Team Leader", "Which auth module?", tool_call_id="ask-1")
        assert (question.asker, question.target) == ("UI Operator_1", "Team Leader")
        read = router.question(question.id)
        assert (read.asker, read.target) == ("UI Operator_1", "Team Leader")
        delivery = router.answer(question.id, "Use OAuth.")
        assert delivery.target == "UI Operator_1"
        answered = [m for m in router.messages(team) if m.type is MessageType.ANSWER]
        assert [(m.source_name, m.question_id) for m in answered] == [("Team Leader", question.id)]
        assert not router.question(question.id).waiting
        with pytest.raises(InvalidMessageError):
            router.create_team(lead_runner="host task with spaces")
    finally:
        router.close()


def test_a_runner_comes_from_the_call_the_roles_file_or_the_settings(sqlite_url: str) -> None:
    settings = Settings(
        database_url=sqlite_url,
        runners={"Team Leader": "chat.lead_turn@chat", "Reviewer": "chat.review_turn"},
    )
    router = Router(settings)
    router.create_schema()
    try:
        team = router.create_team().id
        assert router.agent(team, "Team Leader").runner == "chat.lead_turn@chat"
        assert router.create_agent(team, role="Reviewer").runner == "chat.review_turn"
        given = router.create_agent(team, role="Reviewer", runner="chat.other")
        assert given.runner == "chat.other"
        assert router.create_agent(team, role="UI Operator").runner is None
        # A role of the roles file with a runner: the lead's create_sub_agent records it.
        roles = RoleCatalogue.from_toml(
            '[[roles]]\nname = "Designer"\nsystem_prompt = "You design."\n'
            'runner = "chat.design_turn@design"\n'
        )
        role = roles.get("Designer")
        assert role is not None and role.runner == "chat.design_turn@design"
        router.send(team, to="Team Leader", content="go")
        lead_turn = router.claim_turn(team, "Team Leader")
        assert lead_turn is not None
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "create_sub_agent", "arguments": "{}"},
        }
        lead_turn.drain()
        lead_turn.append_assistant({"role": "assistant", "content": None, "tool_calls": [call]})
        ctx = ToolContext(
            router=router,
            turn=lead_turn,
            agent=router.agent(team, "Team Leader"),
            settings=settings,
            call_id="c1",
        )
        default_registry(roles).call("create_sub_agent", {"role": "Designer", "task": "x"}, ctx)
        designer = router.agent(team, "Designer_1")
        assert designer.runner == "chat.design_turn@design"
        # ... and its turn enqueue names the task, for any publisher in any process.
        (enqueue,) = [e for e in router.outbox(team) if e.agent_id == designer.id]
        assert enqueue.payload["task"] == "chat.design_turn@design"
        for bad in ("", "a b", "task@", "@queue"):
            with pytest.raises(InvalidMessageError):
                router.create_agent(team, role="Reviewer", runner=bad)
    finally:
        router.close()


def test_a_host_owned_sub_agent_reports_to_the_lead_as_the_built_in_loop_does(
    host_worker: tuple[Runtime, str],
) -> None:
    rt, runner = host_worker
    router = rt.router
    team = router.create_team().id  # the lead on the built-in loop
    router.create_agent(team, role="Reviewer", runner=runner)
    router.send(team, to="Reviewer_1", content="Review the login page.", sender="Team Leader")
    wait_until(
        lambda: any(e.action is LedgerAction.TURN_CLAIMED for e in _lead_claims(router, team)),
        "the lead's turn for the report",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team, timeout=TIMEOUT)
    reports = [
        m
        for m in router.messages(team)
        if m.subtype is MessageSubtype.COMPLETION_REPORT and m.source_name == "Reviewer_1"
    ]
    assert [m.content for m in reports] == ["(host) Noted 1 update(s) from Team Leader."]
    assert check_team(router, team, quiescent=True).violations == []


def _lead_claims(router: Router, team: int) -> list[Any]:
    lead = router.agent(team, "Team Leader").id
    return [e for e in router.ledger(team) if e.agent_id == lead]
