"""The multi-agent tools through the built-in loop, success and failure paths, on both database
backends. Turns run synchronously here (claim, run_turn) with a tiny ``ask_block_seconds``, so a
blocked ask suspends and its answer resumes it with a continuation turn."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent_router import (
    AgentState,
    LedgerAction,
    MessageStatus,
    MessageType,
    QuestionStatus,
    Router,
    Settings,
    TurnStatus,
    TurnTrigger,
    errors,
)
from agent_router.agents.llm import Model, ScriptedModel
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.tools import Tool, ToolContext, ToolRegistry, default_registry
from agent_router.domain import Agent
from agent_router.formats import parse
from agent_router.ops.checks import check_team, tool_pairing_problems
from agent_router.outbox import RecordingPublisher

LEAD = "Team Leader"
UI = "UI Operator_1"
ENG = "Full-Stack Engineer_1"

Args = dict[str, Any] | str | Callable[[list[dict[str, Any]]], dict[str, Any]]


class Calls:
    """A model that makes the given batches of tool calls, one batch per model call, then
    replies ``done``. Arguments may be computed from the transcript (for ids only known then)."""

    def __init__(self, *batches: list[tuple[str, Args]]) -> None:
        self.batches = list(batches)
        self.calls = 0
        self.tools: list[str] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        self.tools = [t["function"]["name"] for t in tools]
        i, self.calls = self.calls, self.calls + 1
        if i >= len(self.batches):
            return {"role": "assistant", "content": "done"}
        calls = []
        for j, (name, args) in enumerate(self.batches[i]):
            value = args(messages) if callable(args) else args
            raw = value if isinstance(value, str) else json.dumps(value)
            function = {"name": name, "arguments": raw}
            calls.append({"id": f"{name}-{i}-{j}", "type": "function", "function": function})
        return {"role": "assistant", "content": None, "tool_calls": calls}


class Team:
    def __init__(self, router: Router, tools: ToolRegistry | None = None) -> None:
        self.router = router
        self.team = router.create_team()
        self.id = self.team.id
        self.models: dict[str, Model] = {}
        self.tools = tools or default_registry()

    def model(self, agent: Agent) -> Model:
        return self.models.get(agent.display_name) or ScriptedModel.for_agent(agent)

    def tell_lead(self, content: str = "go") -> None:
        self.router.send(self.id, to=LEAD, content=content, sender="user", type=MessageType.TASK)

    def run(self, limit: int | None = None) -> list[tuple[str, TurnOutcome]]:
        """Run scheduled turns (lowest agent id first) until nobody is scheduled, or ``limit``
        turns ran."""
        outcomes: list[tuple[str, TurnOutcome]] = []
        max_turns = limit or 40
        for _ in range(max_turns):
            scheduled = [a for a in self.router.agents(self.id) if a.state is AgentState.SCHEDULED]
            if not scheduled:
                return outcomes
            turn = self.router.claim(scheduled[0].id)
            assert turn is not None
            outcome = run_turn(self.router, turn, models=self.model, tools=self.tools)
            outcomes.append((turn.display_name, outcome))
        if limit is None:
            raise AssertionError(f"still busy after {max_turns} turns: {outcomes}")
        return outcomes

    def result(self, name: str, call_id: str) -> str:
        (entry,) = [
            e
            for e in self.router.transcript(self.id, name)
            if e["role"] == "tool" and e["tool_call_id"] == call_id
        ]
        return str(entry["content"])

    def json(self, name: str, call_id: str) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.result(name, call_id))
        return value

    def agent(self, name: str) -> Agent:
        return self.router.agent(self.id, name)

    def check(self) -> None:
        report = check_team(self.router, self.id, quiescent=True)
        assert report.ok, report.violations


@pytest.fixture
def router(database_url: str) -> Iterator[Router]:
    settings = Settings(
        database_url=database_url,
        work_seconds=0,
        scripted_write_seconds=0,
        ask_block_seconds=0.05,
        wake_recheck_seconds=0.05,
    )
    r = Router(settings, publisher=RecordingPublisher())
    yield r
    r.close()


def question_id_of_ask(sender: str) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """Arguments answering the last question ``sender`` asked, read from the transcript."""

    def args(messages: list[dict[str, Any]]) -> dict[str, Any]:
        for entry in reversed(messages):
            if entry["role"] == "user":
                env = parse(entry["content"])
                if env.type is MessageType.ASK and env.sender == sender:
                    return {"question_id": env.question_id, "answer": f"answer for {sender}"}
        raise AssertionError(f"no question from {sender}")

    return args


def test_lead_tools_succeed(router: Router) -> None:
    t = Team(router)
    lead = Calls(
        [
            ("create_sub_agent", {"role": "UI Operator", "task": "Build the login page."}),
            ("create_sub_agent", {"role": "Full-Stack Engineer", "task": "Add /health."}),
        ],
        [
            ("send_message_to_sub_agent", {"display_name": UI, "message": "Reuse the auth."}),
            ("list_sub_agents", {}),
            ("get_sub_agent_status", {"display_names": [ENG, "Nobody_1"]}),
            ("stop_sub_agent", {"display_name": ENG}),
        ],
    )
    t.models[LEAD] = lead
    t.tell_lead()
    t.run(limit=1)
    assert "ask_master" not in lead.tools and "create_sub_agent" in lead.tools
    ui = t.json(LEAD, "create_sub_agent-0-0")
    assert ui["ok"] and ui["display_name"] == UI and ui["outcome"] == "triggered_new_turn"
    assert t.json(LEAD, "create_sub_agent-0-1")["display_name"] == ENG
    # The role's system prompt was snapshotted into the new agent's transcript.
    first = t.router.transcript(t.id, UI)[0]
    assert first["role"] == "system" and "UI Operator" in first["content"]
    sent = t.json(LEAD, "send_message_to_sub_agent-1-0")
    assert sent["ok"] and sent["to"] == UI and sent["outcome"] == "coalesced"
    listed = t.json(LEAD, "list_sub_agents-1-1")["agents"]
    assert [a["display_name"] for a in listed] == [UI, ENG]
    status = t.json(LEAD, "get_sub_agent_status-1-2")
    assert [a["display_name"] for a in status["agents"]] == [ENG]
    assert status["unknown"] == ["Nobody_1"]
    stopped = t.json(LEAD, "stop_sub_agent-1-3")
    assert stopped == {"ok": True, "display_name": ENG, "state": "idle", "stopping": False}
    assert t.agent(ENG).state is AgentState.IDLE
    # The stopped (scheduled) engineer's turn task claims nothing; its task stays in its mailbox.
    assert t.router.claim(t.agent(ENG).id, epoch=1) is None
    assert t.agent(ENG).mailbox_depth == 1
    t.router.terminate(t.id, ENG, reason="not needed")
    t.run()
    t.check()


def test_lead_tool_failures_are_results(router: Router) -> None:
    t = Team(router)
    t.router.create_agent(t.id, role="UI Operator")
    lead = Calls(
        [
            ("create_sub_agent", {"role": "Astronaut", "task": "Fly."}),
            ("create_sub_agent", {"role": "UI Operator"}),
            ("send_message_to_sub_agent", {"display_name": "Nobody_1", "message": "hi"}),
            ("send_message_to_sub_agent", {"display_name": LEAD, "message": "hi"}),
            ("answer_sub_agent_question", {"question_id": 999, "answer": "x"}),
            ("stop_sub_agent", {"display_name": "Nobody_1"}),
            ("terminate_sub_agent", {"display_name": LEAD}),
            ("get_sub_agent_status", {"display_names": "UI Operator_1"}),
            ("wait_sub_agent_output", {"display_name": UI, "timeout_seconds": 5}),
            ("wait_sub_agent_output", {"display_name": UI, "timeout_seconds": -1}),
            ("ask_master", {"question": "sub-agent tool"}),
            ("no_such_tool", {}),
            ("list_sub_agents", "{not json"),
        ]
    )
    t.models[LEAD] = lead
    t.tell_lead()
    t.run()
    reasons = [
        (r["ok"], r["reason"])
        for r in (t.json(LEAD, f"{name}-0-{j}") for j, (name, _) in enumerate(lead.batches[0]))
    ]
    assert reasons == [
        (False, "unknown_role"),  # the catalogue's roles are listed in the result
        (False, "bad_arguments"),
        (False, "unknown_agent"),
        (False, "not_a_sub_agent"),
        (False, "unknown_question"),
        (False, "unknown_agent"),
        (False, "not_a_sub_agent"),
        (False, "bad_arguments"),
        (False, "ask_refused"),  # UI Operator_1 is idle with nothing to do: no output will come
        (False, "bad_arguments"),
        (False, "unknown_tool"),  # a sub-agent tool is not the lead's
        (False, "unknown_tool"),
        (False, "bad_arguments"),
    ]
    assert "nothing to work on" in t.json(LEAD, "wait_sub_agent_output-0-8")["error"]
    unknown_role = t.json(LEAD, "create_sub_agent-0-0")
    assert unknown_role["roles"] == ["UI Operator", "Full-Stack Engineer"]
    assert unknown_role["error"].startswith(
        "unknown role 'Astronaut'; roles: UI Operator, Full-Stack Engineer"
    )
    assert t.json(LEAD, "create_sub_agent-0-1")["problems"] == ["`task`: required, missing"]
    assert [a.display_name for a in t.router.agents(t.id)] == [LEAD, UI]
    t.check()


def test_a_chat_lead_staffs_from_the_default_roles_and_reads_which_there_are(
    router: Router, caplog: pytest.LogCaptureFixture
) -> None:
    roles = RoleCatalogue.default()
    t = Team(router, default_registry(roles))
    t.models[LEAD] = Calls(
        [
            ("create_sub_agent", {"role": "Researcher", "task": "Compare the top 3 CRMs."}),
            ("create_sub_agent", {"role": "UI Operator", "task": "Build the login page."}),
            ("create_sub_agent", {"role": LEAD, "task": "Lead."}),
        ]
    )
    t.tell_lead()
    with caplog.at_level("WARNING", logger="agent_router.agents.tools"):
        t.run()
    assert t.json(LEAD, "create_sub_agent-0-0")["display_name"] == "Researcher_1"
    researcher = roles.get("Researcher")
    assert researcher is not None
    assert t.router.transcript(t.id, "Researcher_1")[0]["content"] == researcher.system_prompt
    for call_id, role in (("create_sub_agent-0-1", "UI Operator"), ("create_sub_agent-0-2", LEAD)):
        refused = t.json(LEAD, call_id)
        assert (refused["ok"], refused["reason"]) == (False, "unknown_role")
        assert refused["roles"] == ["Researcher", "Writer", "Assistant"]
        assert f"unknown role {role!r}; roles: Researcher, Writer, Assistant" in refused["error"]
        assert "AGENT_ROUTER_ROLES_FILE" in refused["error"]
    # The host reads the refusals too, not only the model.
    logged = [r for r in caplog.records if getattr(r, "action", None) == "unknown_role"]
    assert [getattr(r, "role", None) for r in logged] == ["UI Operator", LEAD]
    assert [a.display_name for a in t.router.agents(t.id)] == [LEAD, "Researcher_1"]
    t.check()


def test_names_are_matched_loosely_but_never_ambiguously(router: Router) -> None:
    t = Team(router)
    t.router.create_agent(t.id, role="UI Operator")
    t.router.create_agent(t.id, role="UI Operator")
    lead = Calls(
        [
            ("send_message_to_sub_agent", {"display_name": "ui operator 2", "message": "a"}),
            ("send_message_to_sub_agent", {"display_name": "UI-Operator_1", "message": "b"}),
            ("send_message_to_sub_agent", {"display_name": "ui operator", "message": "c"}),
        ]
    )
    t.models[LEAD] = lead
    t.tell_lead()
    t.run()
    second, first, ambiguous = (t.json(LEAD, f"send_message_to_sub_agent-0-{j}") for j in range(3))
    assert (second["ok"], second["to"]) == (True, "UI Operator_2")
    assert (first["ok"], first["to"]) == (True, "UI Operator_1")
    assert ambiguous["reason"] == "unknown_agent"  # two agents spell it: neither is guessed
    assert "UI Operator_1 (UI Operator" in ambiguous["error"]
    assert "UI Operator_2 (UI Operator" in ambiguous["error"]
    t.check()


def test_ask_master_suspends_and_the_answer_continues_the_batch(router: Router) -> None:
    t = Team(router)
    t.router.create_agent(t.id, role="Full-Stack Engineer")
    t.models[ENG] = Calls(
        [
            ("ask_master", {"question": "Postgres or SQLite?"}),
            ("send_message_to_agent", {"target": LEAD, "message": "asked, carrying on"}),
        ],
        [("list_agents", {})],
    )
    t.models[LEAD] = Calls(
        [("answer_sub_agent_question", question_id_of_ask(ENG))],
        [("answer_sub_agent_question", question_id_of_ask(ENG))],  # the same question again
    )
    t.router.send(t.id, to=ENG, content="Pick a database.", sender=LEAD, type=MessageType.TASK)
    outcomes = t.run()
    assert outcomes[0] == (ENG, TurnOutcome.SUSPENDED)
    eng = t.agent(ENG)
    turns = t.router.store.reads.turns(eng.id)
    assert [(x.trigger, x.status) for x in turns] == [
        (TurnTrigger.NEW, TurnStatus.SUSPENDED),
        (TurnTrigger.CONTINUATION, TurnStatus.ENDED),
    ]
    # The answer is the ask's result; the rest of the batch ran in the continuation.
    answer = parse(t.result(ENG, "ask_master-0-0"))
    assert (answer.type, answer.sender, answer.content) == (
        MessageType.ANSWER,
        LEAD,
        f"answer for {ENG}",
    )
    assert t.json(ENG, "send_message_to_agent-0-1")["ok"]
    agents = t.json(ENG, "list_agents-1-0")["agents"]
    assert [(a["display_name"], a["is_you"]) for a in agents] == [(LEAD, False), (ENG, True)]
    first = t.json(LEAD, "answer_sub_agent_question-0-0")
    assert first["ok"] and first["outcome"] == "resolved"
    again = t.json(LEAD, "answer_sub_agent_question-1-0")
    assert (again["ok"], again["reason"]) == (False, "question_closed")
    t.check()


def test_ask_refusals_and_answer_other_agent(router: Router) -> None:
    t = Team(router)
    for role in ("UI Operator", "Full-Stack Engineer"):
        t.router.create_agent(t.id, role=role)
    # UI asks the engineer and suspends; the engineer's ask back would close a cycle.
    t.models[UI] = Calls(
        [("ask_other_agent", {"target": UI, "question": "me?"})],
        [("ask_other_agent", {"target": "Nobody_1", "question": "you?"})],
        [("ask_other_agent", {"target": ENG, "question": "which endpoint?"})],
    )
    t.models[ENG] = Calls(
        [("ask_other_agent", {"target": UI, "question": "and you?"})],
        [("answer_other_agent", {"question_id": 999, "answer": "x"})],
        [("answer_other_agent", question_id_of_ask(UI))],
    )
    t.router.send(t.id, to=UI, content="Go.", sender=LEAD, type=MessageType.TASK)
    t.run(limit=1)
    assert t.agent(UI).state is AgentState.WAITING and t.agent(UI).suspended
    t.run()
    assert t.json(UI, "ask_other_agent-0-0")["reason"] == "ask_refused"
    # An unknown agent is refused with the roster, so that the model can pick a real name.
    unknown = t.json(UI, "ask_other_agent-1-0")
    assert unknown["reason"] == "unknown_agent"
    assert f"{LEAD} (Team Leader" in unknown["error"] and f"{ENG} (Full-Stack" in unknown["error"]
    # A refused cycle says who waits on whom and what to do instead.
    cycle = t.json(ENG, "ask_other_agent-0-0")
    assert cycle["reason"] == "cycle" and cycle["cycle"] == [ENG, UI, ENG]
    assert f"you would wait on {UI}; {UI} is waiting on you" in cycle["error"]
    assert "answer the open question" in cycle["error"]
    # An unknown question id says where ids are and which questions are open.
    wrong = t.json(ENG, "answer_other_agent-1-0")
    assert wrong["reason"] == "unknown_question"
    assert "your open questions: " in wrong["error"] and f"(from {UI})" in wrong["error"]
    assert t.json(ENG, "answer_other_agent-2-0")["ok"]
    assert parse(t.result(UI, "ask_other_agent-2-0")).content == f"answer for {UI}"
    t.check()


def test_answering_a_question_asked_of_someone_else_is_refused(router: Router) -> None:
    t = Team(router)
    for role in ("UI Operator", "Full-Stack Engineer"):
        t.router.create_agent(t.id, role=role)
    t.models[UI] = Calls([("ask_master", {"question": "may I?"})])
    t.models[ENG] = Calls([("answer_other_agent", {"question_id": 1, "answer": "sure"})])
    t.router.send(t.id, to=UI, content="Go.", sender=LEAD, type=MessageType.TASK)
    t.run(limit=1)  # UI suspends on its question to the lead
    (question,) = [m for m in t.router.messages(t.id) if m.type is MessageType.ASK]
    t.models[ENG] = Calls(
        [("answer_other_agent", {"question_id": question.question_id, "answer": "sure"})]
    )
    t.router.send(t.id, to=ENG, content="Go.", sender=LEAD, type=MessageType.TASK)
    t.models[LEAD] = Calls([("answer_sub_agent_question", question_id_of_ask(UI))])
    t.run()
    assert t.json(ENG, "answer_other_agent-0-0")["reason"] == "wrong_question"
    assert t.router.question(question.question_id or 0).status is QuestionStatus.ANSWERED
    t.check()


def stop_myself(arguments: dict[str, Any], ctx: ToolContext) -> str:
    """A host tool during which the lead stops this agent (and a message arrives)."""
    ctx.router.send(ctx.turn.team_id, to=ctx.turn.display_name, content="fyi", sender=LEAD)
    ctx.router.stop(ctx.turn.team_id, ctx.turn.display_name, reason="the lead changed plans")
    return "first step done"


def test_stop_during_a_batch_cancels_the_rest(router: Router) -> None:
    tools = default_registry()
    tools.register(Tool(name="step", description="A step.", function=stop_myself,
                        parameters={"type": "object", "properties": {}}))  # fmt: skip
    t = Team(router, tools)
    t.router.create_agent(t.id, role="Full-Stack Engineer")
    t.models[ENG] = Calls([("step", {}), ("do_work", {"step": "b"}), ("do_work", {"step": "c"})])
    t.router.send(t.id, to=ENG, content="Go.", sender=LEAD, type=MessageType.TASK)
    assert t.run() == [(ENG, TurnOutcome.STOPPED)]
    transcript = t.router.transcript(t.id, ENG)
    assert tool_pairing_problems(transcript, open_allowed=False) == []
    assert t.result(ENG, "step-0-0") == "first step done"  # the step in flight finished
    for call in ("do_work-0-1", "do_work-0-2"):
        assert t.result(ENG, call).startswith("cancelled")
    eng = t.agent(ENG)
    assert (eng.state, eng.stop_requested, eng.mailbox_depth) == (AgentState.IDLE, False, 1)
    (turn,) = t.router.store.reads.turns(eng.id)
    assert turn.status is TurnStatus.STOPPED
    stops = (LedgerAction.STOP_REQUESTED, LedgerAction.STOPPED)
    actions = [e.action for e in t.router.ledger(t.id) if e.agent_id == eng.id]
    assert [a for a in actions if a in stops] == list(stops)
    assert not [m for m in t.router.messages(t.id) if m.type is MessageType.OUTPUT]
    # The mailbox was kept: the next message wakes it and it reads both.
    t.router.send(t.id, to=ENG, content="resume", sender=LEAD)
    t.models[ENG] = Calls()
    assert t.run() == [(ENG, TurnOutcome.ENDED), (LEAD, TurnOutcome.ENDED)]
    t.check()


def test_stop_a_suspended_asker(router: Router) -> None:
    t = Team(router)
    t.router.create_agent(t.id, role="Full-Stack Engineer")
    t.models[ENG] = Calls([("ask_master", {"question": "?"}), ("do_work", {"step": "x"})])
    t.router.send(t.id, to=ENG, content="Go.", sender=LEAD, type=MessageType.TASK)
    t.run(limit=1)
    assert t.agent(ENG).suspended
    assert t.router.stop(t.id, ENG, reason="enough") is AgentState.IDLE
    assert t.result(ENG, "ask_master-0-0").startswith("cancelled")
    assert t.result(ENG, "do_work-0-1").startswith("cancelled")
    (ask,) = [m for m in t.router.messages(t.id) if m.type is MessageType.ASK]
    assert t.router.question(ask.question_id or 0).status is QuestionStatus.CANCELLED
    t.models[LEAD] = Calls([("answer_sub_agent_question", question_id_of_ask(ENG))])
    t.run()  # the lead reads the question and answers: too late
    assert t.json(LEAD, "answer_sub_agent_question-0-0")["reason"] == "question_closed"
    t.check()


def test_terminate_drops_queued_messages_and_refuses_later_sends(router: Router) -> None:
    t = Team(router)
    t.router.create_agent(t.id, role="UI Operator")
    queued = [
        t.router.send(t.id, to=UI, content=f"note {i}", sender=LEAD, wake=False) for i in range(3)
    ]
    t.models[LEAD] = Calls(
        [("terminate_sub_agent", {"display_name": UI})],
        [
            ("send_message_to_sub_agent", {"display_name": UI, "message": "still there?"}),
            ("terminate_sub_agent", {"display_name": UI}),
            ("stop_sub_agent", {"display_name": UI}),
        ],
    )
    t.tell_lead()
    t.run()
    assert t.json(LEAD, "terminate_sub_agent-0-0") == {
        "ok": True,
        "display_name": UI,
        "state": "terminated",
    }
    assert [t.json(LEAD, f"{n}-1-{j}")["reason"] for j, n in enumerate(
        ("send_message_to_sub_agent", "terminate_sub_agent", "stop_sub_agent"))] == [
        "terminated", "terminated", "terminated"]  # fmt: skip
    ids = {d.message_id for d in queued}
    dropped = [m for m in t.router.messages(t.id) if m.id in ids]
    assert all(m.status is MessageStatus.DROPPED and "terminated" in (m.drop_reason or "")
               for m in dropped)  # fmt: skip
    (event,) = [e for e in t.router.ledger(t.id) if e.action is LedgerAction.TERMINATED]
    assert event.detail["dropped"] == 3 and "terminated by Team Leader" in event.detail["reason"]
    rejected = [e for e in t.router.ledger(t.id) if e.action is LedgerAction.SEND_REJECTED]
    assert rejected and rejected[-1].detail["reason"] == "terminated"
    t.check()


def test_wait_sub_agent_output_consumes_only_that_agents_output(router: Router) -> None:
    t = Team(router)
    t.models[LEAD] = Calls(
        [
            ("create_sub_agent", {"role": "UI Operator", "task": "Build the login page."}),
            ("create_sub_agent", {"role": "Full-Stack Engineer", "task": "Add /health."}),
        ],
        [("wait_sub_agent_output", {"display_name": ENG, "timeout_seconds": 60})],
    )
    t.models[ENG] = Calls(
        [("ask_master", {"question": "may I block you?"})],  # would close a cycle: refused
        [("do_work", {"step": "x"})],
    )
    t.models[UI] = Calls([("send_message_to_agent", {"target": LEAD, "message": "UI here"})])
    t.tell_lead()
    outcomes = t.run()
    assert outcomes[:2] == [(LEAD, TurnOutcome.SUSPENDED), (UI, TurnOutcome.ENDED)]
    refused = t.json(ENG, "ask_master-0-0")
    assert refused["reason"] == "cycle" and refused["cycle"] == [ENG, LEAD, ENG]
    # The wait's result is the engineer's completion report (UI's messages did not end it).
    result = parse(t.result(LEAD, "wait_sub_agent_output-1-0"))
    assert (result.type, result.sender, result.content) == (MessageType.OUTPUT, ENG, "done")
    entries = [
        e for lst in [t.router.store.reads.transcript_entries(t.agent(LEAD).id)] for e in lst
    ]
    assert [e["message_id"] for e in entries].count(result.message_id) == 1
    from_ui = [e for e in entries if e["meta"] and e["meta"].get("from") == UI]
    assert from_ui and all(e["payload"]["role"] == "user" for e in from_ui)
    lead_turns = t.router.store.reads.turns(t.agent(LEAD).id)
    assert lead_turns[1].trigger is TurnTrigger.CONTINUATION
    t.check()


def test_wait_for_an_output_already_in_the_mailbox_returns_at_once(router: Router) -> None:
    t = Team(router)
    t.router.create_agent(t.id, role="Full-Stack Engineer")
    t.router.send(t.id, to=ENG, content="Work.", sender=LEAD, type=MessageType.TASK)
    t.router.send(t.id, to=LEAD, content="Report, please.", sender="user")
    turn = t.router.claim_turn(t.id, LEAD)
    assert turn is not None
    t.models[ENG] = Calls()
    t.run()  # the engineer's report reaches the lead's mailbox while the lead's turn runs
    (report,) = [m for m in t.router.messages(t.id) if m.type is MessageType.OUTPUT]
    assert report.status is MessageStatus.PENDING
    call = {"id": "w1", "type": "function", "function": {"name": "wait_sub_agent_output",
                                                         "arguments": "{}"}}  # fmt: skip
    turn.append_assistant({"role": "assistant", "content": None, "tool_calls": [call]})
    question = turn.wait_output(ENG, tool_call_id="w1")
    assert not question.waiting and question.answer_message_id == report.id
    assert turn.wait_for(question, block_seconds=5).value == "resolved"
    result = parse(t.result(LEAD, "w1"))
    assert (result.sender, result.message_id) == (ENG, report.id)
    turn.drain()  # the user's message; the report is not delivered a second time
    turn.append_assistant({"role": "assistant", "content": "ok"})
    turn.end()
    t.check()


def test_a_turn_fenced_mid_batch_stops_without_running_the_rest(
    database_url: str,
) -> None:
    settings = Settings(database_url=database_url, work_seconds=0, heartbeat_seconds=0.02)
    router = Router(settings, publisher=RecordingPublisher())
    ran: list[str] = []

    def taken_over(arguments: dict[str, Any], ctx: ToolContext) -> str:
        # The worker looked dead: the sweeper fences this turn while the tool runs; the tool
        # outlives a few beats of the heartbeat thread, which are refused.
        ctx.router.take_over(ctx.turn.team_id, ctx.turn.display_name, reason="lease expired")
        ran.append("first")
        assert not ctx.turn.heartbeat()
        time.sleep(0.1)
        return "late"

    def second(arguments: dict[str, Any], ctx: ToolContext) -> str:
        ran.append("second")
        return "must not run"

    tools = default_registry()
    for name, fn in (("first", taken_over), ("second", second)):
        tools.register(Tool(name=name, description=name, function=fn,
                            parameters={"type": "object", "properties": {}}))  # fmt: skip
    try:
        t = Team(router, tools)
        t.router.create_agent(t.id, role="Full-Stack Engineer")
        t.models[ENG] = Calls([("first", {}), ("second", {})])
        t.router.send(t.id, to=ENG, content="Go.", sender=LEAD, type=MessageType.TASK)
        assert t.run(limit=1) == [(ENG, TurnOutcome.FENCED)]
        assert ran == ["first"]
        # The fenced turn wrote no result; the recovery turn closed the batch as interrupted.
        entries = t.router.transcript(t.id, ENG)
        assert [e["content"][:11] for e in entries if e["role"] == "tool"] == ["interrupted"] * 2
    finally:
        router.close()


@pytest.mark.parametrize(
    "fault",
    [
        errors.CommitUnknownError("the connection was lost while committing"),
        errors.StoreError("database error: connection refused", retryable=True),
    ],
    ids=["commit-unknown", "connection-lost"],
)
def test_a_turn_that_loses_the_database_is_left_to_recovery_not_failed(
    router: Router, fault: errors.StoreError
) -> None:
    def database_gone(arguments: dict[str, Any], ctx: ToolContext) -> str:
        raise fault  # what a store call raises once its retries met no database

    tools = default_registry()
    tools.register(Tool(name="write", description="write", function=database_gone,
                        parameters={"type": "object", "properties": {}}))  # fmt: skip
    t = Team(router, tools)
    t.router.create_agent(t.id, role="Full-Stack Engineer")
    t.models[ENG] = Calls([("write", {})])
    t.router.send(t.id, to=ENG, content="Go.", sender=LEAD, type=MessageType.TASK)
    assert t.run(limit=1) == [(ENG, TurnOutcome.INTERRUPTED)]
    # Not ended, not failed, nobody told: the turn still holds its lease, as a dead worker's.
    assert t.agent(ENG).state is AgentState.RUNNING
    assert check_team(t.router, t.id).failed_turns == 0
    assert [m for m in t.router.messages(t.id) if m.target_name == LEAD] == []
    # Its lease lapses and the sweeper takes it over: the recovery turn carries on and ends.
    t.router.take_over(t.id, ENG, reason="lease expired")
    t.models[ENG] = Calls()
    assert t.run() == [(ENG, TurnOutcome.ENDED), (LEAD, TurnOutcome.ENDED)]
    report = check_team(t.router, t.id, quiescent=True)
    assert report.ok and report.failed_turns == 0, report.failures


def test_a_call_is_as_strict_as_the_tools_schema(router: Router) -> None:
    """An argument the schema does not name is refused, not ignored (here one claiming to be
    the sender), and every problem of a call is reported at once; a refused call sends
    nothing."""
    t = Team(router)
    lead = Calls(
        [
            ("send_message_to_sub_agent",
             {"display_name": UI, "message": "Deploy now.", "sender": "Team Leader"}),
            ("send_message_to_sub_agent", {"display_name": 7, "mesage": "hi"}),
            ("list_sub_agents", {"verbose": True}),
        ]
    )  # fmt: skip
    t.models[LEAD] = lead
    t.router.create_agent(t.id, role="UI Operator")
    t.tell_lead()
    t.run(limit=1)
    forged = t.json(LEAD, "send_message_to_sub_agent-0-0")
    assert forged["reason"] == "bad_arguments"
    assert forged["problems"] == [
        "`sender`: unknown argument (this tool takes: display_name, message)"
    ]
    assert "so it did not run" in forged["error"]
    assert t.json(LEAD, "send_message_to_sub_agent-0-1")["problems"] == [
        "`display_name`: 7 is not of type 'string'",
        "`mesage`: unknown argument (this tool takes: display_name, message)",
        "`message`: required, missing",
    ]
    assert t.json(LEAD, "list_sub_agents-0-2")["problems"] == [
        "`verbose`: unknown argument (this tool takes: none)"
    ]
    # None of them reached the UI Operator.
    assert [m.content for m in t.router.messages(t.id) if m.target_name == UI] == []
