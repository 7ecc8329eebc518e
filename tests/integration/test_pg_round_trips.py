"""On PostgreSQL every transition of the store is one round trip, whichever branch it takes: one
statement, the call of the transition's function named in ``store/postgresql/queries.sql``,
its own transaction (the connection in autocommit: no BEGIN before it, no COMMIT after it).

Each case below puts a team in a state, runs one transition through the Router or Turn API so
that it takes one branch (refusals included), checks that this branch was taken (the outcome,
the value returned or the error raised), and lists what the store sent meanwhile. Beside the
transition's statement the list may hold only:

- reads the Router makes before it calls the store (a display name looked up to find an id,
  the lead's name for an ask's subtype): plain SELECTs, each in a read session of its own,
  which write nothing and are not part of the transition;
- after the commit, one statement marking the turn tasks the transition enqueued as published
  (the outbox's after-commit path: a transaction of its own, after the transition's).

Where one call of the Router makes more than one transition (a budget check that warns or stops
the team, an expiry pass over several questions), the case says so and names each, in order;
each is one statement in autocommit."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from agent_router import AgentRouterError, AgentState, MessageType, RouteOutcome, Router, Settings
from agent_router import errors as e
from agent_router.budgeting import set_limits
from agent_router.domain import (
    BudgetName,
    MessageSubtype,
    OutboxKind,
    QuestionStatus,
    SweepStep,
    UserMessageKind,
    WaitOutcome,
)
from agent_router.outbox import RecordingPublisher
from agent_router.store import functions
from agent_router.store.models import OutboxRow
from agent_router.store.reads import _WAIT_STATE
from agent_router.store.values import SendRequest, Since
from agent_router.turn import Turn
from agent_router.waker import InProcessWaker

from .helpers import assistant, start_running, statements_in_autocommit, tool_call

ENGINEER = "Engineer_1"
DESIGNER = "Designer_1"
LEAD = "Team Leader"

#: The statement that marks published turn tasks after a commit (Store.mark_published).
_MARK = "mark_published"
#: A call of one of our functions, wherever it appears in a statement.
_CALL = re.compile(r"\bar_[a-z_]+\(")

#: Background jobs' tasks go to the in-memory broker: starting a job touches no other service.
JOBS = Celery("round_trips", broker="memory://", set_as_current=False)


@dataclass(frozen=True)
class Case:
    """A transition set up to take one branch: ``act`` takes it; ``taken`` says, from what
    ``act`` returned or raised, that it was that branch."""

    act: Callable[[], Any]
    taken: Callable[[Any], bool]


@dataclass(frozen=True)
class Branch:
    """``build`` makes the case on a router; ``calls``: the named statements the store sends
    for it, in order; ``published``: how many of their commits enqueued turn tasks, each then
    marked published in one statement; ``own_database``: a pass over every team (an expiry
    pass) runs in a database of its own, where no other test's question is overdue."""

    build: Callable[[Router], Case]
    calls: tuple[str, ...]
    published: int = 0
    own_database: bool = False


BRANCHES: dict[str, Branch] = {}


def branch(
    name: str, *calls: str, published: int = 0, own_database: bool = False
) -> Callable[[Callable[[Router], Case]], Callable[[Router], Case]]:
    def register(build: Callable[[Router], Case]) -> Callable[[Router], Case]:
        assert name not in BRANCHES, name
        BRANCHES[name] = Branch(build, calls, published, own_database)
        return build

    return register


def outcome(expected: RouteOutcome) -> Callable[[Any], bool]:
    return lambda delivery: getattr(delivery, "outcome", None) is expected


def raised(expected: type[AgentRouterError]) -> Callable[[Any], bool]:
    return lambda error: type(error) is expected


def _team(router: Router, *roles: str, **budget: float) -> int:
    """A team with its lead and a sub-agent per role (``Engineer`` -> ``Engineer_1``), its
    budgets as given (``turns=5``)."""
    limits = {BudgetName(name): value for name, value in budget.items()}
    team = router.create_team(budget=limits or None).id
    for role in roles:
        router.create_agent(team, role=role)
    return team


def _answer(question: int, **fields: Any) -> dict[str, Any]:
    return {
        "to": ENGINEER,
        "content": "use the OAuth module",
        "sender": LEAD,
        "type": MessageType.ANSWER,
        "question_id": question,
        **fields,
    }


def _asking(r: Router, team: int, name: str = ENGINEER, call: str = "ask-1") -> Turn:
    """``name``'s running turn, its last reply the tool call ``call``."""
    turn = start_running(r, team, name)
    turn.append_assistant(assistant(None, tool_call(call, "ask_other_agent")))
    return turn


def _blocked(r: Router, team: int) -> tuple[Turn, int]:
    """``Engineer_1`` blocked in an ask to the lead; its turn and the question."""
    turn = _asking(r, team)
    return turn, turn.ask(LEAD, "which auth module?", tool_call_id="ask-1").id


def _suspended(r: Router, team: int) -> tuple[Turn, int]:
    """``Engineer_1`` suspended in an ask to the lead (its turn gave up the worker)."""
    turn, question = _blocked(r, team)
    assert turn.suspend()
    return turn, question


def _waiting_lead(r: Router, team: int) -> Turn:
    """The lead's running turn, its last reply the tool call ``wait-1``."""
    lead = start_running(r, team, LEAD)
    lead.append_assistant(assistant(None, tool_call("wait-1", "wait_sub_agent_output")))
    return lead


def _report(r: Router, team: int) -> Any:
    return r.send(
        team,
        to=LEAD,
        content="done",
        sender=ENGINEER,
        type=MessageType.OUTPUT,
        subtype=MessageSubtype.COMPLETION_REPORT,
    )


def _overdue(r: Router, question: int) -> None:
    """The question's deadline has passed."""
    with r.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE ar_questions SET deadline = now() - interval '1 hour' WHERE id = :q"),
            {"q": question},
        )


def _spent(r: Router, team: int) -> Turn:
    """``Engineer_1`` running in a team whose one model call is spent (the team stopped)."""
    turn = start_running(r, team, ENGINEER)
    turn.charge_model_call()
    with pytest.raises(e.BudgetExhaustedError):
        turn.charge_model_call()
    return turn


# ---------------------------------------------------------------------- sends


@branch("send: to an idle agent, which wakes", "send", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="go"), outcome(RouteOutcome.TRIGGERED_NEW_TURN)
    )


@branch("send: to a completed agent, which wakes", "send", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER).end()
    return Case(
        lambda: r.send(team, to=ENGINEER, content="more"), outcome(RouteOutcome.TRIGGERED_NEW_TURN)
    )


@branch("send: to an idle agent, without waking it", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="fyi", wake=False), outcome(RouteOutcome.QUEUED)
    )


@branch("send: to a scheduled agent", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.send(team, to=ENGINEER, content="go")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="and this"), outcome(RouteOutcome.COALESCED)
    )


@branch("send: to a running agent", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER)
    return Case(
        lambda: r.send(team, to=ENGINEER, content="steer", sender=LEAD),
        outcome(RouteOutcome.INJECTED_INLINE),
    )


@branch("send: to a blocked asker, from another sender", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    _blocked(r, team)
    return Case(
        lambda: r.send(team, to=ENGINEER, content="fyi", sender=DESIGNER),
        outcome(RouteOutcome.INJECTED_INLINE),
    )


@branch("send: to a blocked asker, from another sender, without waking it", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _blocked(r, team)
    return Case(
        lambda: r.send(team, to=ENGINEER, content="fyi", wake=False), outcome(RouteOutcome.QUEUED)
    )


@branch("send: the answer an agent blocks on (its wake row written published)", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _, question = _blocked(r, team)
    return Case(lambda: r.send(team, **_answer(question)), outcome(RouteOutcome.RESOLVED))


@branch("send: the answer a suspended asker waits on (a continuation)", "send", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _, question = _suspended(r, team)
    return Case(lambda: r.send(team, **_answer(question)), outcome(RouteOutcome.RESOLVED))


@branch("send: any message of the asked agent ends an ask", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _blocked(r, team)
    return Case(
        lambda: r.send(team, to=ENGINEER, content="here", sender=LEAD),
        outcome(RouteOutcome.RESOLVED),
    )


@branch("send: a sub-agent's report ends the lead's wait for its output", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER)
    _waiting_lead(r, team).wait_output(ENGINEER, tool_call_id="wait-1")
    return Case(lambda: _report(r, team), outcome(RouteOutcome.RESOLVED))


@branch("send: from a background job", "send", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="built", sender="job:build"),
        outcome(RouteOutcome.TRIGGERED_NEW_TURN),
    )


@branch("send: a retry with the same dedup key finds the first delivery", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    first = r.send(team, to=ENGINEER, content="go", dedup_key="k-1")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="go", dedup_key="k-1"),
        lambda d: d.duplicate and d.message_id == first.message_id,
    )


@branch("send: refused, a dedup key used for other content", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.send(team, to=ENGINEER, content="go", dedup_key="k-1")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="stop", dedup_key="k-1"),
        raised(e.DedupConflictError),
    )


@branch("send: refused, no such team", "send")
def _(r: Router) -> Case:
    return Case(lambda: r.send(2**62, to=ENGINEER, content="go"), raised(e.UnknownTeamError))


@branch("send: refused, no such receiver", "send")
def _(r: Router) -> Case:
    team = _team(r)
    return Case(lambda: r.send(team, to="Nobody_9", content="go"), raised(e.UnknownAgentError))


@branch("send: refused, no such sender", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="go", sender="Nobody_9"),
        raised(e.UnknownAgentError),
    )


@branch("send: refused, a terminated sender", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    r.terminate(team, DESIGNER, reason="gone")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="go", sender=DESIGNER),
        raised(e.AgentTerminatedError),
    )


@branch("send: refused, a terminated receiver", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.terminate(team, ENGINEER, reason="gone")
    return Case(lambda: r.send(team, to=ENGINEER, content="go"), raised(e.AgentTerminatedError))


@branch("send: refused, an agent to itself", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="go", sender=ENGINEER),
        raised(e.InvalidMessageError),
    )


@branch("send: refused, an answer without a question", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.send(team, to=ENGINEER, content="yes", type=MessageType.ANSWER),
        raised(e.InvalidMessageError),
    )


@branch("send: refused, an answer to no such question", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(lambda: r.send(team, **_answer(2**62)), raised(e.UnknownQuestionError))


@branch("send: refused, an answer to a question its receiver did not ask", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    _, question = _suspended(r, team)
    return Case(
        lambda: r.send(team, **_answer(question, to=DESIGNER)), raised(e.WrongQuestionError)
    )


@branch("send: refused, an answer to a wait for output", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER)
    wait = _waiting_lead(r, team).wait_output(ENGINEER, tool_call_id="wait-1")
    return Case(
        lambda: r.send(team, **_answer(wait.id, to=LEAD, sender=ENGINEER)),
        raised(e.WrongQuestionError),
    )


@branch("send: refused, an answer to a closed question", "send")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _, question = _suspended(r, team)
    r.send(team, **_answer(question))
    return Case(
        lambda: r.send(team, **_answer(question, content="again")), raised(e.QuestionClosedError)
    )


@branch("send: refused again within a minute (its first refusal's row counts it)", "send")
def _(r: Router) -> Case:
    team = _team(r)
    with pytest.raises(e.UnknownAgentError):
        r.send(team, to="Nobody_9", content="go")
    rows = len(r.ledger(team))

    def taken(error: Any) -> bool:
        ledger = r.ledger(team)
        return (
            type(error) is e.UnknownAgentError
            and len(ledger) == rows
            and ledger[-1].detail.get("repeats") == 2
        )

    return Case(lambda: r.send(team, to="Nobody_9", content="go"), taken)


@branch("send: refused before the store (blank content), the refusal ledgered", "record_refusal")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(lambda: r.send(team, to=ENGINEER, content="   "), raised(e.InvalidArgumentError))


@branch("interrupt: a running lead is asked to stop", "interrupt")
def _(r: Router) -> Case:
    team = _team(r)
    start_running(r, team, LEAD)

    def taken(delivery: Any) -> bool:
        return delivery.outcome is RouteOutcome.INJECTED_INLINE and r.reads.stop_requested(
            r.agent(team, LEAD).id
        )

    return Case(lambda: r.interrupt(team, "do this instead"), taken)


@branch("interrupt: a lead at rest just gets the message", "interrupt", published=1)
def _(r: Router) -> Case:
    team = _team(r)
    return Case(lambda: r.interrupt(team, "do this"), outcome(RouteOutcome.TRIGGERED_NEW_TURN))


@branch("send_many: to several agents, all routed", "send_many", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    start_running(r, team, DESIGNER)
    batch = [{"to": ENGINEER, "content": "build"}, {"to": DESIGNER, "content": "draw"}]
    both = [RouteOutcome.TRIGGERED_NEW_TURN, RouteOutcome.INJECTED_INLINE]
    return Case(
        lambda: r.send_many(team, batch, sender=LEAD),
        lambda deliveries: [d.outcome for d in deliveries] == both,
    )


@branch("send_many: an answer among them resolves its asker", "send_many")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    _, question = _blocked(r, team)
    start_running(r, team, DESIGNER)
    batch = [_answer(question), {"to": DESIGNER, "content": "and you, draw"}]
    for message in batch:
        message.pop("sender", None)
    both = [RouteOutcome.RESOLVED, RouteOutcome.INJECTED_INLINE]
    return Case(
        lambda: r.send_many(team, batch, sender=LEAD),
        lambda deliveries: [d.outcome for d in deliveries] == both,
    )


@branch("send_many: refused whole, one receiver unknown", "send_many")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    batch = [{"to": ENGINEER, "content": "build"}, {"to": "Nobody_9", "content": "draw"}]

    def taken(error: Any) -> bool:
        return type(error) is e.UnknownAgentError and r.messages(team) == []

    return Case(lambda: r.send_many(team, batch, sender=LEAD), taken)


# ---------------------------------------------------------------------- teams and agents


@branch("create_team", "create_team")
def _(r: Router) -> Case:
    return Case(r.create_team, lambda team: team.lead.display_name == LEAD)


@branch("create_agent", "create_agent")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.create_agent(team, role="Engineer"),
        lambda agent: agent.display_name == "Engineer_2",
    )


@branch("create_agent: refused, the display name is taken", "create_agent")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(
        lambda: r.create_agent(team, role="Engineer", display_name=ENGINEER),
        raised(e.DuplicateDisplayNameError),
    )


@branch("create_agent: refused, no such team", "create_agent")
def _(r: Router) -> Case:
    return Case(lambda: r.create_agent(2**62, role="Engineer"), raised(e.UnknownTeamError))


@branch("create_agent_with_task: the agent and its task", "create_agent", published=1)
def _(r: Router) -> Case:
    team = _team(r)
    return Case(
        lambda: r.create_agent_with_task(team, role="Engineer", task="build"),
        lambda made: made[1].outcome is RouteOutcome.TRIGGERED_NEW_TURN,
    )


@branch("create_agent_with_task: refused whole, the task's sender unknown", "create_agent")
def _(r: Router) -> Case:
    team = _team(r)

    def taken(error: Any) -> bool:
        return type(error) is e.UnknownAgentError and len(r.agents(team)) == 1

    return Case(
        lambda: r.create_agent_with_task(team, role="Engineer", task="build", sender="Nobody_9"),
        taken,
    )


@branch("terminate: a running agent, its blocked asker released", "terminate")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    start_running(r, team, DESIGNER)
    _asking(r, team).ask(DESIGNER, "which colour?", tool_call_id="ask-1")
    return Case(
        lambda: r.terminate(team, DESIGNER, reason="done"),
        lambda _: r.agent(team, ENGINEER).state is AgentState.RUNNING,
    )


@branch("terminate: refused, the lead", "terminate")
def _(r: Router) -> Case:
    team = _team(r)
    return Case(lambda: r.terminate(team, LEAD, reason="done"), raised(e.InvalidMessageError))


@branch("terminate: refused, already terminated", "terminate")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.terminate(team, ENGINEER, reason="done")
    return Case(lambda: r.terminate(team, ENGINEER, reason="again"), raised(e.AgentTerminatedError))


@branch("stop: a scheduled agent, at once (its queued task fenced)", "request_stop")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.send(team, to=ENGINEER, content="go")
    return Case(
        lambda: r.stop(team, ENGINEER, reason="enough"), lambda state: state is AgentState.IDLE
    )


@branch("stop: a suspended asker, at once", "request_stop")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _suspended(r, team)
    return Case(
        lambda: r.stop(team, ENGINEER, reason="enough"), lambda state: state is AgentState.IDLE
    )


@branch("stop: a running agent, at its next boundary", "request_stop")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER)
    return Case(
        lambda: r.stop(team, ENGINEER, reason="enough"), lambda state: state is AgentState.RUNNING
    )


@branch("stop: a blocked asker, its wait ended", "request_stop")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _blocked(r, team)
    return Case(
        lambda: r.stop(team, ENGINEER, reason="enough"), lambda state: state is AgentState.RUNNING
    )


@branch("stop: refused, the lead", "request_stop")
def _(r: Router) -> Case:
    team = _team(r)
    return Case(lambda: r.stop(team, LEAD, reason="enough"), raised(e.InvalidMessageError))


# ---------------------------------------------------------------------- turns


@branch("claim: the scheduled turn", "claim")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    delivery = r.send(team, to=ENGINEER, content="go")
    agent = r.agent(team, ENGINEER).id
    return Case(lambda: r.claim(agent, delivery.epoch), lambda turn: isinstance(turn, Turn))


@branch("claim: nothing, a task of an older epoch", "claim")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    delivery = r.send(team, to=ENGINEER, content="go")
    agent = r.agent(team, ENGINEER).id
    return Case(lambda: r.claim(agent, delivery.epoch - 1), lambda turn: turn is None)


@branch("claim: nothing, the agent is not scheduled", "claim")
def _(r: Router) -> Case:
    agent = r.agent(_team(r, "Engineer"), ENGINEER).id
    return Case(lambda: r.claim(agent), lambda turn: turn is None)


@branch("claim: refused, no such agent", "claim")
def _(r: Router) -> Case:
    return Case(lambda: r.claim(2**62), raised(e.UnknownAgentError))


@branch("claim: refused to the built-in loop, a host runs the agent", "claim")
def _(r: Router) -> Case:
    team = r.create_team().id
    agent = r.create_agent(team, role="Engineer", runner="chat.engineer_turn").id
    r.send(team, to=ENGINEER, content="go")
    ledger = len(r.ledger(team))

    def taken(error: Any) -> bool:
        return (
            type(error) is e.HostOwnedTurnError
            and error.runner == "chat.engineer_turn"
            and len(r.ledger(team)) == ledger
            and r.agent(team, ENGINEER).state is AgentState.SCHEDULED
        )

    return Case(lambda: r.claim(agent, builtin=True), taken)


@branch("claim: the team has no budget row (made from the defaults)", "claim")
def _(r: Router) -> Case:
    """A team created before budgets existed: the claim makes its row, then counts the turn."""
    team = _team(r, "Engineer")
    with r.store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM ar_budgets WHERE team_id = :team"), {"team": team})
    delivery = r.send(team, to=ENGINEER, content="go")
    agent = r.agent(team, ENGINEER).id

    def taken(turn: Any) -> bool:
        return isinstance(turn, Turn) and r.store.budget(team).used[BudgetName.TURNS] == 1

    return Case(lambda: r.claim(agent, delivery.epoch), taken)


@branch("claim: past the warning threshold, warned already", "claim")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", turns=5.0)
    for _ in range(4):
        start_running(r, team, LEAD).end()
    delivery = r.send(team, to=ENGINEER, content="go")
    agent = r.agent(team, ENGINEER).id
    return Case(lambda: r.claim(agent, delivery.epoch), lambda turn: isinstance(turn, Turn))


@branch(
    "claim: the turn passes the warning threshold (the team warned)",
    *("claim", "budget", "send", "send"),
)
def _(r: Router) -> Case:
    """The claim counts the turn, 4 of 5: the Router reads the budget for the warning's
    figures and sends every agent (the lead and Engineer_1) its notice, a send each."""
    team = _team(r, "Engineer", turns=5.0)
    for _ in range(3):
        start_running(r, team, LEAD).end()
    delivery = r.send(team, to=ENGINEER, content="go")
    agent = r.agent(team, ENGINEER).id
    return Case(lambda: r.claim(agent, delivery.epoch), lambda turn: isinstance(turn, Turn))


@branch(
    "claim: the turns budget is spent (the team stops)",
    *("claim", "request_stop", "finish_stop"),
)
def _(r: Router) -> Case:
    """The claim finds the budget spent and marks it so: the Router stops the team's active
    sub-agents (Engineer_1, whose claim this is), then stops the claimed turn at once."""
    team = _team(r, "Engineer", turns=1.0)
    start_running(r, team, LEAD).end()
    delivery = r.send(team, to=ENGINEER, content="go")
    agent = r.agent(team, ENGINEER).id
    return Case(
        lambda: r.claim(agent, delivery.epoch),
        lambda turn: turn is None and r.agent(team, ENGINEER).state is AgentState.IDLE,
    )


@branch("drain: the pending messages", "drain")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.send(team, to=ENGINEER, content="one", sender=LEAD)
    r.send(team, to=ENGINEER, content="two", sender=LEAD)
    return Case(turn.drain, lambda drained: [m.content for m in drained] == ["one", "two"])


@branch("drain: of one sender's progress only the latest", "drain")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, LEAD)
    for text in ("a quarter", "half"):
        r.send(
            team,
            to=LEAD,
            content=text,
            sender=ENGINEER,
            type=MessageType.OUTPUT,
            subtype=MessageSubtype.PROGRESS_OUTPUT,
            wake=False,
        )
    return Case(turn.drain, lambda drained: [m.content for m in drained] == ["half"])


@branch("drain: nothing pending", "drain")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    return Case(turn.drain, lambda drained: drained == [])


@branch("drain: refused, a tool call has no result yet", "drain")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(turn.drain, raised(e.ToolCallsPendingError))


@branch("drain: refused, the agent is blocked in an ask", "drain")
def _(r: Router) -> Case:
    turn, _ = _blocked(r, _team(r, "Engineer"))
    return Case(turn.drain, raised(e.TurnError))


@branch("drain: refused, a stale turn", "drain")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.take_over(team, ENGINEER, reason="presumed dead")
    return Case(turn.drain, raised(e.StaleTurnError))


@branch("append: the model's reply", "append")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    reply = assistant("done")
    return Case(lambda: turn.append_assistant(reply), lambda returned: returned == reply)


@branch("append: refused, a reply while a tool call has no result", "append")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(lambda: turn.append_assistant(assistant("done")), raised(e.ToolCallsPendingError))


@branch("append: an open tool call's result", "append")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(lambda: turn.append_tool_result("ask-1", "ok"), lambda returned: returned is None)


@branch("append: refused, the result of no open tool call", "append")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(
        lambda: turn.append_tool_result("call-9", "?"), raised(e.InvalidTranscriptEntryError)
    )


@branch("append: refused, a result whose id is not a string", "append")
def _(r: Router) -> Case:
    """The store quotes the id (repr) and asks the database, where no open call has it."""
    turn = _asking(r, _team(r, "Engineer"))
    bad: Any = 1
    return Case(lambda: turn.append_tool_result(bad, "?"), raised(e.InvalidTranscriptEntryError))


@branch("append: refused, a stale turn", "append")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.end()
    return Case(lambda: turn.append_assistant(assistant("late")), raised(e.StaleTurnError))


@branch("before_call: mail drained, the call charged, the roster and entries read", "before_call")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.send(team, to=ENGINEER, content="one", sender=LEAD)

    def taken(before: Any) -> bool:
        return (
            [m.content for m in before.messages] == ["one"]
            and before.budget.ok
            and [a.display_name for a in before.roster] == [LEAD, ENGINEER]
            and before.rows[-1][1]["content"].endswith("one\n</agent-message>")
        )

    return Case(lambda: turn.before_call(since=Since(None)), taken)


@branch("before_call: the carried results written first", "before_call")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    turn.carry_tool_result("ask-1", "ok")
    return Case(
        lambda: turn.before_call(since=Since(None)),
        lambda before: before.rows[-1][1]["content"] == "ok",
    )


@branch("before_call: a stop requested is honoured", "before_call")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.stop(team, ENGINEER, reason="enough")
    return Case(turn.before_call, lambda before: before.stopped and turn.state() is AgentState.IDLE)


@branch(
    "before_call: refused, the budget spent now (the team stops)",
    *("before_call", "request_stop"),
)
def _(r: Router) -> Case:
    """As charge_model_call's: the Router then stops the team's active sub-agents."""
    team = _team(r, "Engineer", model_calls=1.0)
    turn = start_running(r, team, ENGINEER)
    turn.charge_model_call()
    return Case(turn.before_call, raised(e.BudgetExhaustedError))


@branch("before_call: refused, a tool call has no carried result", "before_call")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(turn.before_call, raised(e.ToolCallsPendingError))


@branch("before_call: refused, a result of no open tool call", "before_call")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    turn.carry_tool_result("ask-2", "ok")
    return Case(turn.before_call, raised(e.InvalidTranscriptEntryError))


@branch("before_call: refused, a stale turn", "before_call")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.take_over(team, ENGINEER, reason="presumed dead")
    return Case(turn.before_call, raised(e.StaleTurnError))


_USAGE = {"model": "gpt-4o", "prompt_tokens": 10, "completion_tokens": 2}


@branch("after_call: the reply and its usage, the open questions read", "after_call")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    lead = _waiting_lead(r, team)
    question = lead.ask(ENGINEER, "which module?", tool_call_id="wait-1")
    return Case(
        lambda: turn.after_call(assistant("done"), usage=_USAGE),
        lambda done: [q.id for q in done[1].questions] == [question.id] and done[1].budget.ok,
    )


@branch("after_call: a reply that calls tools, no usage reported", "after_call")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    return Case(
        lambda: turn.after_call(assistant(None, tool_call("call-1"))),
        lambda done: done[1].budget is None and turn.open_tool_calls() == ["call-1"],
    )


@branch("after_call: a stop requested is honoured, the reply left out", "after_call")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.stop(team, ENGINEER, reason="enough")
    return Case(
        lambda: turn.after_call(assistant("done"), usage=_USAGE),
        lambda done: done[1].stopped and turn.transcript()[-1]["role"] != "assistant",
    )


@branch("after_call: refused, a reply while a tool call has no result", "after_call")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(lambda: turn.after_call(assistant("done")), raised(e.ToolCallsPendingError))


@branch("after_call: refused, a stale turn", "after_call")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.take_over(team, ENGINEER, reason="presumed dead")
    return Case(lambda: turn.after_call(assistant("done")), raised(e.StaleTurnError))


@branch("end: completed, with the results it carried", "end")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.append_assistant(assistant(None, tool_call("call-1")))
    turn.carry_tool_result("call-1", "done")
    return Case(turn.end, lambda end: end.synthetic_results == 0)


@branch("end: refused, a carried result of no open tool call", "end")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.carry_tool_result("call-9", "done")
    return Case(turn.end, raised(e.InvalidTranscriptEntryError))


@branch("end: completed", "end")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.append_assistant(assistant("done"))
    return Case(turn.end, lambda end: end.state is AgentState.COMPLETED and not end.follow_up)


@branch("end: wake mail pending, one follow-up turn", "end", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    turn.append_assistant(assistant("done"))
    r.send(team, to=ENGINEER, content="and this", sender=LEAD)
    return Case(turn.end, lambda end: end.follow_up)


@branch("end: quiet mail pending, completed", "end")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    turn.append_assistant(assistant("done"))
    r.send(team, to=ENGINEER, content="fyi", sender=LEAD, wake=False)
    return Case(turn.end, lambda end: end.state is AgentState.COMPLETED and not end.follow_up)


@branch("end: wake mail pending, the host's task follows up", "end", published=1)
def _(r: Router) -> Case:
    team = r.create_team().id
    r.create_agent(team, role="Engineer", runner="chat.engineer_turn")
    turn = start_running(r, team, ENGINEER)
    turn.append_assistant(assistant("done"))
    r.send(team, to=ENGINEER, content="and this", sender=LEAD)

    def taken(end: Any) -> bool:
        task = r.outbox(team)[-1].payload.get("task")
        return bool(end.follow_up) and task == "chat.engineer_turn"

    return Case(turn.end, taken)


@branch("end: failed, its open tool calls interrupted", "end")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.append_assistant(assistant(None, tool_call("call-1"), tool_call("call-2")))
    return Case(
        lambda: turn.end(failed=True, error="the model failed"),
        lambda end: end.synthetic_results == 2,
    )


@branch("end: failed while blocked in an ask, suspended on it", "end")
def _(r: Router) -> Case:
    turn, _ = _blocked(r, _team(r, "Engineer"))
    return Case(
        lambda: turn.end(failed=True, error="the worker failed"),
        lambda end: end.state is AgentState.WAITING,
    )


@branch("end: a stop requested is honoured", "end")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.stop(team, ENGINEER, reason="enough")
    return Case(turn.end, lambda end: end.state is AgentState.IDLE)


@branch("end: an interrupt's stop starts one follow-up turn", "end", published=1)
def _(r: Router) -> Case:
    team = _team(r)
    turn = start_running(r, team, LEAD)
    r.interrupt(team, "do this instead")
    return Case(turn.end, lambda end: end.follow_up and end.state is AgentState.SCHEDULED)


@branch("end: refused, a stale turn", "end")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.end()
    return Case(turn.end, raised(e.StaleTurnError))


@branch("end: with the lead's answer to the user", "end")
def _(r: Router) -> Case:
    team = _team(r)
    turn = start_running(r, team, LEAD)
    turn.append_assistant(assistant("the answer"))

    def answered(end: Any) -> bool:
        said = [(m.kind, m.content) for m in r.user_messages(team)]
        return end.state is AgentState.COMPLETED and said == [
            (UserMessageKind.ANSWER, "the answer")
        ]

    return Case(lambda: turn.end(output="the answer"), answered)


@branch("end: with a sub-agent's report, its lead woken", "end", published=1)
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.append_assistant(assistant("the report"))
    return Case(
        lambda: turn.end(output="the report"),
        lambda end: [d.outcome for d in end.deliveries] == [RouteOutcome.TRIGGERED_NEW_TURN],
    )


@branch("end: with a report the turn sent already, found by its dedup key", "end")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    turn.append_assistant(assistant("the report"))
    r.send(team, to=LEAD, content="the report", sender=ENGINEER, type=MessageType.OUTPUT,
           subtype=MessageSubtype.COMPLETION_REPORT, dedup_key=f"report:{turn.id}")  # fmt: skip
    return Case(
        lambda: turn.end(output="the report"),
        lambda end: [d.duplicate for d in end.deliveries] == [True],
    )


@branch("end: refused, its report's dedup key used for other content", "end")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    turn.append_assistant(assistant("the report"))
    r.send(team, to=LEAD, content="another", sender=ENGINEER, dedup_key=f"report:{turn.id}")
    return Case(lambda: turn.end(output="the report"), raised(e.DedupConflictError))


@branch("end: refused with its output, a stale turn", "end")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.take_over(team, ENGINEER, reason="presumed dead")
    return Case(lambda: turn.end(output="late"), raised(e.StaleTurnError))


@branch("suspend: a blocked asker gives up its worker", "suspend")
def _(r: Router) -> Case:
    turn, _ = _blocked(r, _team(r, "Engineer"))
    return Case(turn.suspend, lambda suspended: suspended is True)


@branch("suspend: nothing, the answer came first", "suspend")
def _(r: Router) -> Case:
    turn, question = _blocked(r, _team(r, "Engineer"))
    r.answer(question, "this one")
    return Case(turn.suspend, lambda suspended: suspended is False)


@branch("suspend: refused, a stale turn", "suspend")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn, _ = _blocked(r, team)
    r.take_over(team, ENGINEER, reason="presumed dead")
    return Case(turn.suspend, raised(e.StaleTurnError))


@branch("finish_stop: the turn stops at a boundary", "finish_stop")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = _asking(r, team)
    r.stop(team, ENGINEER, reason="enough")

    def taken(_: Any) -> bool:
        return r.agent(team, ENGINEER).state is AgentState.IDLE and turn.open_tool_calls() == []

    return Case(turn.finish_stop, taken)


@branch("finish_stop: an interrupt's stop starts one follow-up turn", "finish_stop", published=1)
def _(r: Router) -> Case:
    team = _team(r)
    turn = start_running(r, team, LEAD)
    r.interrupt(team, "do this instead")
    return Case(turn.finish_stop, lambda _: r.agent(team, LEAD).state is AgentState.SCHEDULED)


@branch("finish_stop: refused, a stale turn", "finish_stop")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    turn.end()
    return Case(turn.finish_stop, raised(e.StaleTurnError))


@branch("renew_lease: the turn's lease", "renew_lease")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    return Case(turn.heartbeat, lambda renewed: renewed is True)


@branch("renew_lease: nothing, the turn was fenced", "renew_lease")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = start_running(r, team, ENGINEER)
    r.take_over(team, ENGINEER, reason="presumed dead")
    return Case(turn.heartbeat, lambda renewed: renewed is False)


# ---------------------------------------------------------------------- waits


@branch("ask: a running agent, the question injected", "ask")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    start_running(r, team, DESIGNER)
    turn = _asking(r, team)
    return Case(
        lambda: turn.ask(DESIGNER, "which colour?", tool_call_id="ask-1"),
        lambda q: q.status is QuestionStatus.OPEN,
    )


@branch("ask: an idle agent, which wakes", "ask", published=1)
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer", "Designer"))
    return Case(
        lambda: turn.ask(DESIGNER, "which colour?", tool_call_id="ask-1"),
        lambda q: q.status is QuestionStatus.OPEN,
    )


@branch("ask: refused, no such agent", "ask")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(
        lambda: turn.ask("Nobody_9", "anyone?", tool_call_id="ask-1"), raised(e.AskRefusedError)
    )


@branch("ask: refused, itself", "ask")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(lambda: turn.ask(ENGINEER, "me?", tool_call_id="ask-1"), raised(e.AskRefusedError))


@branch("ask: refused, a terminated agent", "ask")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    turn = _asking(r, team)
    r.terminate(team, DESIGNER, reason="gone")
    return Case(
        lambda: turn.ask(DESIGNER, "which colour?", tool_call_id="ask-1"),
        raised(e.AskRefusedError),
    )


@branch("ask: refused, it would close a cycle", "ask")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    turn = _asking(r, team)
    _asking(r, team, DESIGNER, "ask-2").ask(ENGINEER, "which size?", tool_call_id="ask-2")
    cycle = [ENGINEER, DESIGNER, ENGINEER]
    return Case(
        lambda: turn.ask(DESIGNER, "which colour?", tool_call_id="ask-1"),
        lambda error: type(error) is e.AskRefusedError and error.cycle == cycle,
    )


@branch("ask: refused, not an open tool call", "ask")
def _(r: Router) -> Case:
    turn = _asking(r, _team(r, "Engineer"))
    return Case(
        lambda: turn.ask(LEAD, "which one?", tool_call_id="ask-9"),
        raised(e.InvalidTranscriptEntryError),
    )


@branch("ask: refused, a stale turn", "ask")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    turn = _asking(r, team)
    r.take_over(team, ENGINEER, reason="presumed dead")
    return Case(
        lambda: turn.ask(LEAD, "which one?", tool_call_id="ask-1"), raised(e.StaleTurnError)
    )


@branch("wait_output: the lead waits for a working sub-agent", "wait_output")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER)
    lead = _waiting_lead(r, team)
    return Case(
        lambda: lead.wait_output(ENGINEER, tool_call_id="wait-1"),
        lambda q: q.waiting and q.status is QuestionStatus.OPEN,
    )


@branch("wait_output: the report is already in the mailbox", "wait_output")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    lead = _waiting_lead(r, team)
    _report(r, team)
    return Case(
        lambda: lead.wait_output(ENGINEER, tool_call_id="wait-1"),
        lambda q: q.status is QuestionStatus.ANSWERED,
    )


@branch("wait_output: refused, the sub-agent has nothing to work on", "wait_output")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    lead = _waiting_lead(r, team)
    return Case(
        lambda: lead.wait_output(ENGINEER, tool_call_id="wait-1"), raised(e.AskRefusedError)
    )


@branch("expire: nothing overdue", "overdue_questions", own_database=True)
def _(r: Router) -> Case:
    """The pass lists the overdue questions first: here one question is open, not overdue."""
    _, question = _blocked(r, _team(r, "Engineer"))
    return Case(
        r.expire_questions,
        lambda count: count == 0 and r.question(question).status is QuestionStatus.OPEN,
    )


@branch(
    "expire: a blocking and a suspended asker, each in a call of its own",
    *("overdue_questions", "expire_question", "expire_question"),
    published=1,
    own_database=True,
)
def _(r: Router) -> Case:
    """The pass lists the overdue questions (one statement), then expires each in a call of
    its own, so that one that fails leaves the others expired: 1 + 2 statements. The
    suspended asker gets a continuation turn, the blocking one is woken."""
    team = _team(r, "Engineer", "Designer")
    _, suspended = _suspended(r, team)
    designer = _asking(r, team, DESIGNER, "ask-2")
    blocking = designer.ask(LEAD, "which colour?", tool_call_id="ask-2").id
    for question in (suspended, blocking):
        _overdue(r, question)

    def taken(count: Any) -> bool:
        statuses = {r.question(q).status for q in (suspended, blocking)}
        return count == 2 and statuses == {QuestionStatus.EXPIRED}

    return Case(r.expire_questions, taken)


@branch(
    "expire: the blocked call finds its own question overdue",
    *("overdue_questions", "expire_question"),
)
def _(r: Router) -> Case:
    """A blocked call past its question's deadline expires that question (listed by its id,
    then expired): 1 + 1 statements; its own re-reads of the question are reads."""
    turn = _asking(r, _team(r, "Engineer"))
    question = turn.ask(LEAD, "which one?", tool_call_id="ask-1")
    _overdue(r, question.id)
    return Case(
        lambda: turn.wait_for(question, block_seconds=5),
        lambda waited: waited is WaitOutcome.RESOLVED,
    )


@branch("take_over: a running agent, a recovery turn", "take_over", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER)
    return Case(
        lambda: r.take_over(team, ENGINEER, reason="presumed dead"), lambda epoch: epoch == 2
    )


@branch("take_over: a blocked asker, left suspended", "take_over")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    _blocked(r, team)
    return Case(
        lambda: r.take_over(team, ENGINEER, reason="presumed dead"),
        lambda _: r.agent(team, ENGINEER).suspended,
    )


@branch("take_over: refused, nothing runs", "take_over")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(lambda: r.take_over(team, ENGINEER, reason="presumed dead"), raised(e.TurnError))


# ---------------------------------------------------------------------- the sweeper


def _expired(r: Router, team: int, name: str = ENGINEER) -> int:
    """``name`` running with its turn's lease run out (as if its worker died); its id."""
    turn = start_running(r, team, name)
    with r.store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE ar_turns SET lease_expires_at = lease_expires_at - interval '1 day' "
                "WHERE id = :t"
            ),
            {"t": turn.record.id},
        )
    return turn.record.agent_id


@branch("take_over_expired: a lease run out, a recovery turn", "take_over_expired", published=1)
def _(r: Router) -> Case:
    agent = _expired(r, _team(r, "Engineer"))
    return Case(lambda: r.store.take_over_expired(agent), lambda epoch: epoch == 2)


@branch("take_over_expired: the lease renewed, nothing done", "take_over_expired")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    start_running(r, team, ENGINEER)
    agent = r.agent(team, ENGINEER).id
    return Case(
        lambda: r.store.take_over_expired(agent),
        lambda epoch: epoch is None and r.agent(team, ENGINEER).epoch == 1,
    )


@branch("take_over_expired: nothing runs any more", "take_over_expired")
def _(r: Router) -> Case:
    agent = r.agent(_team(r, "Engineer"), ENGINEER).id
    return Case(lambda: r.store.take_over_expired(agent), lambda epoch: epoch is None)


def _scheduled(r: Router, team: int) -> Any:
    """``Engineer_1`` scheduled (its task published), as the sweeper lists it."""
    r.send(team, to=ENGINEER, content="build it", sender="user")
    agent = r.agent(team, ENGINEER).id
    (found,) = [s for s in r.store.reads.scheduled(older_than_seconds=0) if s.agent_id == agent]
    return found


@branch("reenqueue: a lost turn task enqueued again", "reenqueue", published=1)
def _(r: Router) -> Case:
    found = _scheduled(r, _team(r, "Engineer"))
    return Case(lambda: r.store.reenqueue(found, windows=1), lambda done: done is True)


@branch("reenqueue: the task was published since it was read, nothing done", "reenqueue")
def _(r: Router) -> Case:
    from dataclasses import replace

    found = replace(_scheduled(r, _team(r, "Engineer")), last_published=None)
    return Case(lambda: r.store.reenqueue(found, windows=1), lambda done: done is False)


@branch("record_sweep_failure: one more failure, the agent left alone", "record_sweep_failure")
def _(r: Router) -> Case:
    agent = r.agent(_team(r, "Engineer"), ENGINEER).id
    return Case(
        lambda: r.store.record_sweep_failure(agent, SweepStep.TAKE_OVER, "boom", period_seconds=10),
        lambda found: found is not None and found.failures == 1,
    )


@branch("record_sweep_failure: the agent is gone", "record_sweep_failure")
def _(r: Router) -> Case:
    return Case(
        lambda: r.store.record_sweep_failure(2**40, SweepStep.TAKE_OVER, "boom", period_seconds=10),
        lambda found: found is None,
    )


@branch("lift_quarantine: a quarantine lifted", "lift_quarantine")
def _(r: Router) -> Case:
    agent = r.agent(_team(r, "Engineer"), ENGINEER).id
    for _ in range(3):
        r.store.record_sweep_failure(agent, SweepStep.TAKE_OVER, "boom", period_seconds=10)
    return Case(lambda: r.store.lift_quarantine(agent, reason="repaired"), lambda lifted: lifted)


@branch("lift_quarantine: nothing to lift", "lift_quarantine")
def _(r: Router) -> Case:
    agent = r.agent(_team(r, "Engineer"), ENGINEER).id
    return Case(
        lambda: r.store.lift_quarantine(agent, reason="repaired"), lambda lifted: not lifted
    )


@branch(
    "lift_settled_quarantines: resting agents past their backoff",
    "lift_settled_quarantines",
    own_database=True,
)
def _(r: Router) -> Case:
    team = _team(r, "Engineer", "Designer")
    agents = [r.agent(team, name).id for name in (ENGINEER, DESIGNER)]
    for agent in agents:
        r.store.record_sweep_failure(agent, SweepStep.TAKE_OVER, "boom", period_seconds=0)
    return Case(
        lambda: r.store.lift_settled_quarantines(keep={agents[1]}),
        lambda lifted: lifted == agents[:1],
    )


@branch("claim_unpublished: a lost outbox row taken", "claim_unpublished", own_database=True)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.send(team, to=ENGINEER, content="build it", sender="user")
    with r.store.engine.begin() as conn:
        conn.execute(sa.update(OutboxRow).values(published_at=None))
    return Case(
        lambda: r.store.claim_unpublished(older_than_seconds=0),
        lambda entries: [entry.kind for entry in entries] == [OutboxKind.ENQUEUE_TURN],
    )


@branch("seed_mailbox: notices queued in bulk", "seed_mailbox")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    agent = r.agent(team, ENGINEER).id
    return Case(
        lambda: r.store.seed_mailbox(agent, 3, content="note"),
        lambda _: len(r.messages(team)) == 3,
    )


@branch("seed_mailbox: refused, no such agent", "seed_mailbox")
def _(r: Router) -> Case:
    return Case(lambda: r.store.seed_mailbox(2**40, 3, content="note"), raised(e.UnknownAgentError))


# ---------------------------------------------------------------------- the lifecycle


@branch("delete_team: a team and every row it owns", "delete_team")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(lambda: r.store.delete_team(team), lambda deleted: deleted.teams == (team,))


@branch("delete_team: refused, the team still owes mail", "delete_team")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.send(team, to=ENGINEER, content="build it", sender="user")
    return Case(lambda: r.store.delete_team(team), raised(e.OwedRowsError))


@branch("delete_team: what the team owes dropped and ledgered", "delete_team")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.send(team, to=ENGINEER, content="build it", sender="user")
    return Case(
        lambda: r.store.delete_team(team, include_undelivered=True),
        lambda deleted: deleted.owed["undelivered_messages"] == 1,
    )


@branch("delete_team: refused, an unknown team", "delete_team")
def _(r: Router) -> Case:
    return Case(lambda: r.store.delete_team(2**40), raised(e.UnknownTeamError))


@branch("prune: the outbox, then one batch of teams", "prune_outbox", "prune_teams",
        own_database=True)  # fmt: skip
def _(r: Router) -> Case:
    """A finished team, idle for two days: the published outbox rows in one call, the teams
    in one call per batch (here one)."""
    team = _team(r, "Engineer")
    with r.store.engine.begin() as conn:
        for table in ("ar_teams", "ar_agents", "ar_ledger"):
            conn.execute(sa.text(f"UPDATE {table} SET created_at = created_at - interval '2 days'"))
    return Case(
        lambda: r.store.prune(older_than_seconds=86400), lambda pruned: pruned.teams == (team,)
    )


@branch("prune_ledger: one batch, routine events deleted", "prune_ledger", own_database=True)
def _(r: Router) -> Case:
    r.send(_team(r, "Engineer"), to=ENGINEER, content="build it", sender="user")  # routed
    with r.store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE ar_ledger SET created_at = created_at - interval '2 days'"))
    return Case(lambda: r.store.prune_ledger(older_than_seconds=86400), lambda deleted: deleted > 0)


@branch("prune_ledger: a dry run counts", "prune_ledger")
def _(r: Router) -> Case:
    return Case(
        lambda: r.store.prune_ledger(older_than_seconds=86400 * 365 * 100, dry_run=True),
        lambda counted: counted == 0,
    )


# ---------------------------------------------------------------------- the user


def _asking_user(r: Router, team: int) -> Turn:
    """The lead's running turn, its last reply the tool call ``ask-user-1``."""
    lead = start_running(r, team, LEAD)
    lead.append_assistant(assistant(None, tool_call("ask-user-1", "ask_user")))
    return lead


def _waiting_on_user(r: Router, team: int) -> int:
    """The lead waiting on the user, suspended; the question."""
    question, _said = _asking_user(r, team).ask_user("which colour?", tool_call_id="ask-user-1")
    return question.id


@branch("remind_user: nothing at half its time", "remind_user", own_database=True)
def _(r: Router) -> Case:
    team = _team(r)
    _waiting_on_user(r, team)
    return Case(r.remind_user, lambda count: count == 0 and len(r.user_messages(team)) == 1)


@branch(
    "remind_user: a question at half its time, sent once more", "remind_user", own_database=True
)
def _(r: Router) -> Case:
    team = _team(r)
    question = _waiting_on_user(r, team)
    with r.store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE ar_questions SET created_at = now() - interval '2 hours' WHERE id = :q"
            ),
            {"q": question},
        )

    def taken(count: Any) -> bool:
        said = r.user_messages(team)
        return count == 1 and [m.question_id for m in said] == [question, question]

    return Case(r.remind_user, taken)


@branch("tell_user: the lead's progress, the team reading its own", "tell_user")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r), LEAD)
    return Case(lambda: turn.tell_user("on it"), lambda said: said.content == "on it")


@branch("tell_user: to the team's user task, published", "tell_user", published=1)
def _(r: Router) -> Case:
    team = r.create_team(user_task="chat.user_message").id
    turn = start_running(r, team, LEAD)
    return Case(
        lambda: turn.tell_user("done", kind=UserMessageKind.ANSWER),
        lambda said: said.kind.value == "answer",
    )


@branch("tell_user: a sub-agent's, under its lead's lock", "tell_user")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    return Case(lambda: turn.tell_user("found it"), lambda said: said.sender == ENGINEER)


@branch("tell_user: a retried write finds its first", "tell_user")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r), LEAD)
    first = turn.tell_user("on it", dedup_key="k-1")
    return Case(lambda: turn.tell_user("on it", dedup_key="k-1"), lambda said: said == first)


@branch("tell_user: refused, a stale turn", "tell_user")
def _(r: Router) -> Case:
    team = _team(r)
    turn = start_running(r, team, LEAD)
    r.take_over(team, LEAD, reason="test")
    return Case(lambda: turn.tell_user("late"), raised(e.StaleTurnError))


@branch("ask_user: the lead asks and suspends", "ask_user")
def _(r: Router) -> Case:
    turn = _asking_user(r, _team(r))
    return Case(
        lambda: turn.ask_user("which colour?", tool_call_id="ask-user-1"),
        lambda asked: asked[0].status is QuestionStatus.OPEN,
    )


@branch("ask_user: refused, not an open tool call", "ask_user")
def _(r: Router) -> Case:
    turn = _asking_user(r, _team(r))
    return Case(
        lambda: turn.ask_user("which colour?", tool_call_id="nope"),
        raised(e.InvalidTranscriptEntryError),
    )


@branch("send: the user's reply to a lead waiting on the user, which resumes", "send",
        published=1)  # fmt: skip
def _(r: Router) -> Case:
    team = _team(r)
    question = _waiting_on_user(r, team)
    return Case(
        lambda: r.send(
            team, to=LEAD, content="blue", type=MessageType.ANSWER, question_id=question
        ),
        outcome(RouteOutcome.RESOLVED),
    )


@branch("send: refused, an answer to the user's question from another", "send")
def _(r: Router) -> Case:
    team = _team(r)
    question = _waiting_on_user(r, team)
    return Case(
        lambda: r.send(
            team,
            to=LEAD,
            content="blue",
            sender="system",
            type=MessageType.ANSWER,
            question_id=question,
        ),
        raised(e.WrongQuestionError),
    )


# ---------------------------------------------------------------------- background jobs


def _job(r: Router, team: int, agent: str = ENGINEER) -> Any:
    return r.track_background(team, agent, JOBS.signature("jobs.build"))


@branch("start_job: recorded before its task is sent", "start_job")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    return Case(lambda: _job(r, team), lambda job: job.name == "jobs.build")


@branch("start_job: refused, no such agent", "start_job")
def _(r: Router) -> Case:
    team = _team(r)
    return Case(lambda: _job(r, team, "Nobody_9"), raised(e.UnknownAgentError))


@branch("start_job: refused, a terminated agent", "start_job")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    r.terminate(team, ENGINEER, reason="gone")
    return Case(lambda: _job(r, team), raised(e.AgentTerminatedError))


@branch("start_job: refused, its task recorded already", "start_job")
def _(r: Router) -> Case:
    """The Router gives every job a new task id: the store is asked directly."""
    team = _team(r, "Engineer")
    task = _job(r, team).task_id
    return Case(
        lambda: r.store.start_job(team, ENGINEER, name="jobs.build", task_id=task),
        raised(e.InvalidArgumentError),
    )


@branch("finish_job: its notice wakes the agent, a batch window late", "finish_job", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    job = _job(r, team)
    return Case(
        lambda: r.finish_background(job.id, ok=True, result="built"),
        lambda done: done.notice_message_id is not None,
    )


@branch("finish_job: another in the window pushes the turn back", "finish_job", published=1)
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    first, second = _job(r, team), _job(r, team)
    r.finish_background(first.id, ok=True, result="built")

    def taken(done: Any) -> bool:
        return done.notice_message_id is not None and r.agent(team, ENGINEER).epoch == 2

    return Case(lambda: r.finish_background(second.id, ok=False, result="broke"), taken)


@branch("finish_job: reported once, a second report does nothing", "finish_job")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    job = _job(r, team)
    notice = r.finish_background(job.id, ok=True, result="built").notice_message_id
    return Case(
        lambda: r.finish_background(job.id, ok=True, result="built"),
        lambda done: done.notice_message_id == notice,
    )


@branch("finish_job: its agent terminated, nothing reported", "finish_job")
def _(r: Router) -> Case:
    team = _team(r, "Engineer")
    job = _job(r, team)
    r.terminate(team, ENGINEER, reason="gone")
    return Case(
        lambda: r.finish_background(job.id, ok=True, result="built"),
        lambda done: done.notice_message_id is None,
    )


@branch("finish_job: refused, no such job", "finish_job")
def _(r: Router) -> Case:
    return Case(lambda: r.finish_background(2**62, ok=True, result="built"), raised(e.RefusedError))


# ---------------------------------------------------------------------- budgets


@branch("charge_model_call: counted", "charge_model_call")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    return Case(turn.charge_model_call, lambda returned: returned is None)


@branch(
    "charge_model_call: refused, the budget spent now (the team stops)",
    *("charge_model_call", "request_stop"),
)
def _(r: Router) -> Case:
    """The first check to find the budget spent marks it so; the Router then stops the team's
    active sub-agents (Engineer_1 itself, at its next boundary)."""
    turn = start_running(r, _team(r, "Engineer", model_calls=1.0), ENGINEER)
    turn.charge_model_call()
    return Case(turn.charge_model_call, raised(e.BudgetExhaustedError))


@branch("charge_model_call: refused, the team stopped already", "charge_model_call")
def _(r: Router) -> Case:
    turn = _spent(r, _team(r, "Engineer", model_calls=1.0))
    return Case(turn.charge_model_call, raised(e.BudgetExhaustedError))


@branch("record_usage: a model call's tokens", "record_usage")
def _(r: Router) -> Case:
    turn = start_running(r, _team(r, "Engineer"), ENGINEER)
    return Case(
        lambda: turn.record_usage(model="m", prompt_tokens=10, completion_tokens=5),
        lambda usage: usage.prompt_tokens == 10,
    )


@branch("charge_sub_agent: room for one more", "charge_sub_agent")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", sub_agents_created=2.0)
    return Case(lambda: r.store.charge_sub_agent(team, "Designer"), lambda ok: ok is None)


@branch("charge_sub_agent: refused, as many created as allowed", "charge_sub_agent")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", sub_agents_created=1.0)
    return Case(lambda: r.store.charge_sub_agent(team, "Designer"), raised(e.BudgetExhaustedError))


@branch("budget: a team's limits and use", "budget")
def _(r: Router) -> Case:
    team = _team(r, "Engineer", turns=5.0)
    return Case(lambda: r.store.budget(team), lambda budget: budget.limits[BudgetName.TURNS] == 5)


@branch("set_limits: an operator's new limits", "budget", "set_limits")
def _(r: Router) -> Case:
    """The Router reads the budget first (was the team stopped?), then sets the limits."""
    team = _team(r, "Engineer")
    return Case(
        lambda: set_limits(r, team, {BudgetName.TURNS: 50.0}, by="test"),
        lambda budget: budget.limits[BudgetName.TURNS] == 50,
    )


@branch(
    "set_limits: a stopped team may go on (its lead told)",
    *("budget", "set_limits", "send"),
    published=1,
)
def _(r: Router) -> Case:
    """As above, then the lead gets a notice that wakes it: its turn task is published."""
    team = _team(r, "Engineer", model_calls=1.0)
    _spent(r, team)
    return Case(
        lambda: set_limits(r, team, {BudgetName.MODEL_CALLS: 10.0}, by="test"),
        lambda budget: budget.exhausted is None,
    )


# ---------------------------------------------------------------------- the tests


def _named(engine: sa.Engine) -> dict[str, str]:
    """The named statements as the driver receives them, by name."""
    return {
        " ".join(str(query.compile(dialect=engine.dialect)).split()): name
        for name, query in functions.queries().items()
    }


@pytest.fixture
def pg_router(request: pytest.FixtureRequest) -> Iterator[Router]:
    callspec = getattr(request.node, "callspec", None)
    own = callspec is not None and BRANCHES[callspec.params["name"]].own_database
    url = request.getfixturevalue("own_pg_schema_url" if own else "pg_schema_url")
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    yield router
    router.close()


@pytest.mark.parametrize("name", list(BRANCHES))
def test_each_branch_of_a_transition_is_one_round_trip(pg_router: Router, name: str) -> None:
    expected = BRANCHES[name]
    case = expected.build(pg_router)
    named = _named(pg_router.store.engine)
    reread = " ".join(str(_WAIT_STATE.compile(dialect=pg_router.store.engine.dialect)).split())
    with statements_in_autocommit(pg_router) as seen:
        try:
            result = case.act()
        except AgentRouterError as error:
            result = error
    assert case.taken(result), result
    calls: list[str] = []
    marks = 0
    for statement, alone in seen:
        text = " ".join(statement.split())
        if named.get(text) == _MARK:
            marks += 1
            assert alone
        elif text in named:
            calls.append(named[text])
            assert alone, f"{named[text]} ran inside a transaction"
        else:
            # A read of the Router's: it writes nothing and calls none of our functions; in a
            # read session of its own, but for a blocked call's re-read of its question.
            assert text.startswith("SELECT ") and not _CALL.search(text), text
            assert not alone or text == reread, text
    assert tuple(calls) == expected.calls
    assert marks == expected.published


def test_every_named_statement_has_its_branches() -> None:
    """No statement that queries.sql names is left out above: a new transition gets its
    cases here."""
    reached = {call for expected in BRANCHES.values() for call in expected.calls}
    marked = any(expected.published for expected in BRANCHES.values())
    assert reached | ({_MARK} if marked else set()) == set(functions.queries())


class _CountingWaker(InProcessWaker):
    def __init__(self) -> None:
        super().__init__()
        self.signals: list[int] = []

    def notify(self, question_id: int, token: str) -> None:
        self.signals.append(question_id)
        super().notify(question_id, token)


def test_a_wake_row_is_written_published_and_signalled_once(own_pg_schema_url: str) -> None:
    """The answer's function writes the wake row marked published (one attempt), and its
    signal is sent once after the commit; the sweeper's pass sends nothing more. A wake row
    left unpublished (written before wake rows were written published) is still signalled and
    marked by it. (A database of its own: the pass publishes whatever is unpublished in it.)"""
    waker = _CountingWaker()
    router = Router(
        Settings(database_url=own_pg_schema_url), publisher=RecordingPublisher(), waker=waker
    )
    try:
        team = _team(router, "Engineer")
        _, question = _blocked(router, team)
        router.send(team, **_answer(question))
        with router.store.engine.connect() as conn:
            wakes = conn.execute(
                sa.select(OutboxRow.id, OutboxRow.published_at, OutboxRow.attempts).where(
                    OutboxRow.team_id == team, OutboxRow.kind == OutboxKind.WAKE_WAITER
                )
            ).all()
        assert [(w.published_at is not None, w.attempts) for w in wakes] == [(True, 1)]
        assert waker.signals == [question]
        assert router.publish_outbox() == 0 and waker.signals == [question]
        with router.store.engine.begin() as conn:
            conn.execute(
                sa.update(OutboxRow)
                .where(OutboxRow.id == wakes[0].id)
                .values(published_at=None, attempts=0)
            )
        assert router.publish_outbox() == 1
        assert waker.signals == [question, question]
        assert wakes[0].id not in {entry.id for entry in router.store.reads.unpublished()}
    finally:
        router.close()


def test_a_woken_call_rereads_its_question_in_one_round_trip(pg_router: Router) -> None:
    """What a blocked call re-reads after a wake signal is one statement on a connection in
    autocommit (no BEGIN before it, no ROLLBACK after it); the answer between the two reads is
    one statement too."""
    team = _team(pg_router, "Engineer")
    _, question = _blocked(pg_router, team)
    with statements_in_autocommit(pg_router) as seen:
        assert pg_router.store.reads.wait_state(question)[0] is True
        pg_router.send(team, **_answer(question))
        assert pg_router.store.reads.wait_state(question)[0] is False
    engine = pg_router.store.engine
    reread = " ".join(str(_WAIT_STATE.compile(dialect=engine.dialect)).split())
    answer = " ".join(str(functions.queries()["send"].compile(dialect=engine.dialect)).split())
    assert [(" ".join(s.split()), alone) for s, alone in seen] == [
        (reread, True),
        (answer, True),
        (reread, True),
    ]


# ---------------------------------------------------------------------- the connection of a call


@pytest.fixture
def one_connection(pg_schema_url: str) -> Iterator[Router]:
    """A router with a pool of one connection: every call runs on it, so its state after each
    call is what is checked."""
    router = Router(Settings(database_url=pg_schema_url, pool_size=1))
    yield router
    router.close()


def _pooled(engine: sa.Engine) -> int:
    """The connections idle in the engine's pool."""
    pool: Any = engine.pool
    return int(pool.checkedin())


def _autocommit(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.connection.driver_connection.autocommit)  # type: ignore[union-attr]


def test_the_connection_goes_back_to_the_pool_as_it_was_taken(one_connection: Router) -> None:
    """A call runs in autocommit; the connection goes back to the pool out of it, so that the
    next transaction (a read, the sweeper's scans) is one transaction."""
    router, engine = one_connection, one_connection.store.engine
    team = _team(router, "Engineer")
    turn, question = _blocked(router, team)
    router.send(team, to=ENGINEER, content="FYI", sender="user")
    router.answer(question, "the OAuth one")
    turn.append_assistant(assistant("done"))
    assert turn.end().follow_up
    assert _pooled(engine) == 1 and not _autocommit(engine)
    with engine.connect() as conn:
        ids = [conn.execute(sa.text("SELECT txid_current()")).scalar_one() for _ in range(2)]
        conn.rollback()
    assert ids[0] == ids[1]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        # Refused before it is sent, as SQLite's driver refuses it (PostgreSQL would be sent a
        # numeric, a type no function takes, and answer that the function does not exist).
        ({"team_id": 2**70}, "database error: a number is out of range (beyond 64 bits)"),
        # Refused by the column inside the function: what the database said, in one line.
        (
            {"dedup_key": "k" * 300},
            "database error: value too long for type character varying(200) (SQLSTATE 22001)",
        ),
    ],
    ids=["an integer beyond bigint", "a key longer than its column"],
)
def test_a_database_error_in_a_call_is_the_stores_and_changes_nothing(
    one_connection: Router, fields: dict[str, Any], error: str
) -> None:
    """A request the Router would have refused, given to the store directly, fails: a plain
    store error saying what the database said (never the driver's exception class, nor
    PL/pgSQL's CONTEXT with the function's arguments), not retried and not "commit unknown",
    and the connection goes back to the pool as it was taken."""
    router, engine = one_connection, one_connection.store.engine
    team = _team(router, "Engineer")
    before = router.messages(team)
    request = {"team_id": team, "to": ENGINEER, "content": "hi", "sender": "user", **fields}
    with pytest.raises(e.StoreError) as raised_:
        router.store.send(SendRequest(type=MessageType.TASK, **request))
    assert not isinstance(raised_.value, e.CommitUnknownError) and not raised_.value.retryable
    assert str(raised_.value) == error
    assert _pooled(engine) == 1 and not _autocommit(engine)
    assert router.messages(team) == before
    assert router.send(team, to=ENGINEER, content="hi").outcome is RouteOutcome.TRIGGERED_NEW_TURN


class _InterruptedError(Exception):
    pass


def test_a_send_interrupted_inside_its_call_leaves_no_connection_mid_query(
    one_connection: Router,
) -> None:
    """A signal's exception (a worker's time limit, Ctrl-C) raised while the call waits in the
    database for the agent's lock: the exception reaches the caller, and the connection is
    closed rather than given back to the pool in the middle of its query; the next send takes
    a new connection. Whether the interrupted call committed is unknown, as with a commit whose
    connection was lost: the server may still run it once the lock is released, and then only
    once."""
    router, engine = one_connection, one_connection.store.engine
    team = _team(router, "Engineer")
    agent = router.agent(team, ENGINEER).id
    with engine.connect() as conn:
        before = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

    def interrupt(*_: Any) -> None:
        raise _InterruptedError

    holder = sa.create_engine(router.settings.database_url)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with holder.connect() as lock:
            lock.execute(
                sa.text("SELECT 1 FROM ar_agents WHERE id = :id FOR UPDATE"), {"id": agent}
            )
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(_InterruptedError):
                router.send(team, to=ENGINEER, content="deploy")
            lock.rollback()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        holder.dispose()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != before
        assert not conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
    delivery = router.send(team, to=ENGINEER, content="deploy")
    sent = [m.id for m in router.messages(team)]
    assert delivery.message_id in sent and len(sent) <= 2
