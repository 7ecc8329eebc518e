"""The user interrupts the lead: the message is stored, the running turn stops at its next
boundary, and the stop starts one new turn whose first model request holds the message. On
SQLite and PostgreSQL with the built-in loop, and on a Celery worker."""

from __future__ import annotations

import json
import threading
from typing import Any

from agent_router import Router
from agent_router.agents.llm import Model, ScriptedModel
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.tools import default_registry
from agent_router.domain import (
    Agent,
    AgentState,
    LedgerAction,
    MessageType,
    OutboxKind,
    QuestionStatus,
    RouteOutcome,
    TurnStatus,
    TurnTrigger,
    UserMessageKind,
)
from agent_router.ops.checks import check_team
from agent_router.ops.demo import wait_quiescent, wait_until
from agent_router.outbox import RecordingPublisher
from agent_router.worker import runtime
from agent_router.worker.runtime import Runtime

LEAD = "Team Leader"
NEW_MESSAGE = "Forget the report: book the flight instead."
TIMEOUT = 60.0


class InterruptedWhileWriting:
    """The lead's model: the user interrupts while the first reply is being written; every
    request it gets is kept."""

    def __init__(self, router: Router, team_id: int) -> None:
        self.router = router
        self.team_id = team_id
        self.requests: list[list[dict[str, Any]]] = []

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests.append(messages)
        if len(self.requests) == 1:
            delivery = self.router.interrupt(self.team_id, NEW_MESSAGE)
            assert delivery.outcome is RouteOutcome.INJECTED_INLINE
            return {"role": "assistant", "content": "Here is the report you asked for."}
        return {"role": "assistant", "content": "The flight is booked."}


def _run(router: Router, team_id: int, model: Model) -> TurnOutcome:
    turn = router.claim(router.agent(team_id, LEAD).id, builtin=True)
    assert turn is not None

    def models(_agent: Agent) -> Model:
        return model

    return run_turn(router, turn, models=models, tools=default_registry())


def _user_text(request: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content")) for m in request if m.get("role") == "user")


def test_an_interrupt_stops_the_lead_s_turn_and_starts_one_with_the_message(
    router: Router, publisher: RecordingPublisher
) -> None:
    team = router.create_team()
    router.send(team.id, to=LEAD, content="Write the quarterly report.")
    model = InterruptedWhileWriting(router, team.id)
    enqueued_before = len([e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN])

    assert _run(router, team.id, model) is TurnOutcome.STOPPED
    lead = router.agent(team.id, LEAD)
    assert (lead.state, lead.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.FOLLOW_UP)
    enqueued = [e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN]
    assert len(enqueued) == enqueued_before + 1
    assert enqueued[-1].payload["trigger"] == TurnTrigger.FOLLOW_UP.value
    # The reply being written when the message landed is dropped: the user is not told it.
    assert router.user_messages(team.id) == []
    assert NEW_MESSAGE not in _user_text(model.requests[0])
    actions = [e.action for e in router.ledger(team.id) if e.agent_id == lead.id]
    assert actions.count(LedgerAction.STOP_REQUESTED) == 1
    assert actions.count(LedgerAction.STOPPED) == 1
    assert actions.count(LedgerAction.FOLLOW_UP) == 1
    (stopped,) = [e for e in router.ledger(team.id) if e.action is LedgerAction.STOPPED]
    assert stopped.detail["reason"] == "interrupted by the user"

    assert _run(router, team.id, model) is TurnOutcome.ENDED
    assert NEW_MESSAGE in _user_text(model.requests[1])
    assert [t.status for t in router.reads.turns(lead.id)] == [
        TurnStatus.STOPPED,
        TurnStatus.ENDED,
    ]
    (answer,) = router.user_messages(team.id)
    assert (answer.kind, answer.content) == (UserMessageKind.ANSWER, "The flight is booked.")
    assert router.agent(team.id, LEAD).state is AgentState.COMPLETED
    assert check_team(router, team.id, quiescent=True).ok


def test_an_interrupt_of_a_lead_at_rest_is_a_message_that_starts_its_turn(
    router: Router,
) -> None:
    team = router.create_team()
    delivery = router.interrupt(team.id, NEW_MESSAGE)
    assert delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN
    lead = router.agent(team.id, LEAD)
    assert (lead.state, lead.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.NEW)
    actions = [e.action for e in router.ledger(team.id)]
    assert LedgerAction.STOP_REQUESTED not in actions
    # A retried interrupt with its dedup key is the first delivery, and asks for nothing more.
    first = router.interrupt(team.id, "Stop that.", dedup_key="k1")
    again = router.interrupt(team.id, "Stop that.", dedup_key="k1")
    assert (again.duplicate, again.message_id) == (True, first.message_id)


class SlowLead:
    """A model factory: the lead's first model call waits for ``go`` (a long turn), then
    replies; its later calls answer at once. Every request of the lead's is kept; the
    sub-agents' model is the scripted one."""

    def __init__(self) -> None:
        self.in_call = threading.Event()
        self.go = threading.Event()
        self.requests: list[list[dict[str, Any]]] = []

    def __call__(self, agent: Agent) -> Model:
        if not agent.is_lead:
            return ScriptedModel.for_agent(agent)
        outer = self

        class Lead:
            def complete(
                self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
            ) -> dict[str, Any]:
                outer.requests.append(messages)
                if len(outer.requests) == 1:
                    outer.in_call.set()
                    assert outer.go.wait(TIMEOUT)
                    return {"role": "assistant", "content": "Here is the report you asked for."}
                return {"role": "assistant", "content": "The flight is booked."}

        return Lead()


def test_an_interrupt_restarts_the_lead_on_a_worker(inproc_worker: Runtime) -> None:
    models = SlowLead()
    runtime.configure(inproc_worker.router.settings, app=inproc_worker.app, models=models)
    router = runtime.current().router
    team = router.create_team()
    router.send(team.id, to=LEAD, content="Write the quarterly report.")
    assert models.in_call.wait(TIMEOUT)
    assert router.interrupt(team.id, NEW_MESSAGE).outcome is RouteOutcome.INJECTED_INLINE
    models.go.set()
    lead = router.agent(team.id, LEAD)
    wait_until(
        lambda: (
            len(router.store.reads.turns(lead.id)) == 2
            and router.agent(team.id, LEAD).state is AgentState.COMPLETED
        ),
        "the lead's new turn to end",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team.id, timeout=TIMEOUT)

    stopped, restarted = router.store.reads.turns(lead.id)
    assert (stopped.trigger, stopped.status) == (TurnTrigger.NEW, TurnStatus.STOPPED)
    assert (restarted.trigger, restarted.status) == (TurnTrigger.FOLLOW_UP, TurnStatus.ENDED)
    assert len(models.requests) == 2
    assert NEW_MESSAGE not in _user_text(models.requests[0])
    assert NEW_MESSAGE in _user_text(models.requests[1])
    (answer,) = router.user_messages(team.id)
    assert answer.content == "The flight is booked."
    assert check_team(router, team.id, quiescent=True).ok


def _wait_for_output(target: str) -> dict[str, Any]:
    arguments = json.dumps({"display_name": target})
    function = {"name": "wait_sub_agent_output", "arguments": arguments}
    call = {"id": "wait1", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


class WaitingLead:
    """The lead's model: its first reply waits for Engineer_1's output (the turn blocks in
    its worker until it comes), its later replies answer the user. Every request is kept."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, Any]]] = []

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests.append(messages)
        if len(self.requests) == 1:
            return _wait_for_output("Engineer_1")
        return {"role": "assistant", "content": "The flight is booked."}


def _blocked_in_a_worker(router: Router, team_id: int) -> bool:
    lead = router.agent(team_id, LEAD)
    return lead.state is AgentState.WAITING and not lead.suspended


def _wait_result(router: Router, team_id: int) -> str:
    (result,) = [e for e in router.transcript(team_id, LEAD) if e.get("tool_call_id") == "wait1"]
    return str(result["content"])


def test_an_interrupt_ends_the_lead_s_blocked_wait_and_starts_one_turn_with_the_message(
    router: Router, publisher: RecordingPublisher
) -> None:
    # Nobody runs the engineer's turn: without the interrupt the lead would wait the hour.
    router.settings = router.settings.model_copy(
        update={"ask_block_seconds": 3600.0, "ask_grace_seconds": 3600.0}
    )
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="Draft the report.", sender=LEAD,
                type=MessageType.TASK)  # fmt: skip
    router.send(team.id, to=LEAD, content="Write the quarterly report.")
    model = WaitingLead()
    outcome: list[TurnOutcome] = []
    lead_turn = threading.Thread(target=lambda: outcome.append(_run(router, team.id, model)))
    lead_turn.start()
    wait_until(lambda: _blocked_in_a_worker(router, team.id), "the lead to block", timeout=TIMEOUT)
    enqueued_before = len([e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN])

    delivery = router.interrupt(team.id, NEW_MESSAGE)
    lead_turn.join(timeout=TIMEOUT)
    assert not lead_turn.is_alive()
    assert outcome == [TurnOutcome.STOPPED]
    assert delivery.duplicate is False
    lead = router.agent(team.id, LEAD)
    assert (lead.state, lead.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.FOLLOW_UP)
    enqueued = [e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN]
    assert len(enqueued) == enqueued_before + 1
    assert enqueued[-1].payload["trigger"] == TurnTrigger.FOLLOW_UP.value
    # The wait's call has its result and its question is cancelled.
    assert _wait_result(router, team.id) == "cancelled: stopped (interrupted by the user)"
    assert router.store.reads.question_statuses(team.id) == [QuestionStatus.CANCELLED]
    actions = [e.action for e in router.ledger(team.id) if e.agent_id == lead.id]
    assert actions.count(LedgerAction.STOP_REQUESTED) == 1
    assert actions.count(LedgerAction.STOPPED) == 1
    assert actions.count(LedgerAction.FOLLOW_UP) == 1
    # Interrupting again while the follow-up is queued asks for no second one.
    router.interrupt(team.id, "And a hotel.")
    assert len([e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN]) == len(enqueued)

    assert _run(router, team.id, model) is TurnOutcome.ENDED
    assert NEW_MESSAGE not in _user_text(model.requests[0])
    assert NEW_MESSAGE in _user_text(model.requests[1])
    assert [t.status for t in router.reads.turns(lead.id)] == [
        TurnStatus.STOPPED,
        TurnStatus.ENDED,
    ]
    (answer,) = router.user_messages(team.id)
    assert answer.content == "The flight is booked."


class BusyEngineer:
    """A model factory: the lead waits for Engineer_1's output and then answers the user; the
    engineer's model call waits for ``go`` (it is at work while the user interrupts), then
    replies as the scripted model does."""

    def __init__(self) -> None:
        self.lead = WaitingLead()
        self.in_call = threading.Event()
        self.go = threading.Event()

    def __call__(self, agent: Agent) -> Model:
        if agent.is_lead:
            return self.lead
        scripted = ScriptedModel.for_agent(agent)
        outer = self

        class Engineer:
            def complete(
                self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
            ) -> dict[str, Any]:
                outer.in_call.set()
                assert outer.go.wait(TIMEOUT)
                return scripted.complete(messages, tools)

        return Engineer()


def test_an_interrupt_reaches_a_lead_blocked_on_a_sub_agent_in_a_worker(
    inproc_worker: Runtime,
) -> None:
    models = BusyEngineer()
    runtime.configure(inproc_worker.router.settings, app=inproc_worker.app, models=models)
    router = runtime.current().router
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="Draft the report.", sender=LEAD,
                type=MessageType.TASK)  # fmt: skip
    router.send(team.id, to=LEAD, content="Write the quarterly report.")
    assert models.in_call.wait(TIMEOUT)  # the engineer is at work
    wait_until(lambda: _blocked_in_a_worker(router, team.id), "the lead to block", timeout=TIMEOUT)
    try:
        router.interrupt(team.id, NEW_MESSAGE)
        lead = router.agent(team.id, LEAD)
        wait_until(
            lambda: (
                len(router.store.reads.turns(lead.id)) == 2
                and router.agent(team.id, LEAD).state is AgentState.COMPLETED
            ),
            "the lead's new turn to end",
            timeout=TIMEOUT,
        )
        stopped, restarted = router.store.reads.turns(lead.id)
        assert (stopped.trigger, stopped.status) == (TurnTrigger.NEW, TurnStatus.STOPPED)
        assert (restarted.trigger, restarted.status) == (TurnTrigger.FOLLOW_UP, TurnStatus.ENDED)
        requests = models.lead.requests
        assert len(requests) == 2
        assert NEW_MESSAGE in _user_text(requests[1])
        assert _wait_result(router, team.id) == "cancelled: stopped (interrupted by the user)"
        (answer,) = router.user_messages(team.id)
        assert answer.content == "The flight is booked."
    finally:
        models.go.set()
    wait_quiescent(router, team.id, timeout=TIMEOUT)
    assert check_team(router, team.id, quiescent=True).ok


def test_an_interrupt_of_a_lead_suspended_on_a_wait_starts_one_turn_with_the_message(
    router: Router, publisher: RecordingPublisher
) -> None:
    # Nobody runs the engineer's turn: the lead's wait suspends at once, holding no worker.
    router.settings = router.settings.model_copy(
        update={"ask_block_seconds": 0.05, "ask_grace_seconds": 0.05}
    )
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    router.send(team.id, to="Engineer_1", content="Draft the report.", sender=LEAD,
                type=MessageType.TASK)  # fmt: skip
    router.send(team.id, to=LEAD, content="Write the quarterly report.")
    model = WaitingLead()
    assert _run(router, team.id, model) is TurnOutcome.SUSPENDED
    lead = router.agent(team.id, LEAD)
    assert (lead.state, lead.suspended) == (AgentState.WAITING, True)
    enqueued_before = len([e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN])

    router.interrupt(team.id, NEW_MESSAGE)
    lead = router.agent(team.id, LEAD)
    assert (lead.state, lead.pending_trigger) == (AgentState.SCHEDULED, TurnTrigger.FOLLOW_UP)
    enqueued = [e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN]
    assert len(enqueued) == enqueued_before + 1
    assert enqueued[-1].payload["trigger"] == TurnTrigger.FOLLOW_UP.value
    assert _wait_result(router, team.id) == "cancelled: stopped (interrupted by the user)"
    assert router.store.reads.question_statuses(team.id) == [QuestionStatus.CANCELLED]
    actions = [e.action for e in router.ledger(team.id) if e.agent_id == lead.id]
    assert actions.count(LedgerAction.STOPPED) == 1
    assert actions.count(LedgerAction.FOLLOW_UP) == 1
    # A second interrupt finds the follow-up queued: no second turn.
    router.interrupt(team.id, "And a hotel.")
    assert len([e for e in publisher.entries if e.kind is OutboxKind.ENQUEUE_TURN]) == len(enqueued)

    assert _run(router, team.id, model) is TurnOutcome.ENDED
    assert NEW_MESSAGE in _user_text(model.requests[1])
    assert "And a hotel." in _user_text(model.requests[1])
    (answer,) = router.user_messages(team.id)
    assert answer.content == "The flight is booked."
