"""On PostgreSQL a send that needs no question is routed by one statement. It must write
exactly what the general way writes: the same delivery, message row, agent state, ledger event
and outbox row, for every receiver state it takes, every sender kind, wake flag, type and
runner; and every send it does not take (a waiting or terminated receiver, a refused sender)
must come out of the general way unchanged. Each case is sent twice, to two teams built alike:
once as it is, once with the one statement switched off."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from agent_router import AgentState, MessageType, RefusedError, Router
from agent_router.domain import LedgerAction, MessageSubtype
from agent_router.store import one_statement

from .helpers import start_running, start_waiting, statements_in_autocommit


def _team(router: Router, state: AgentState, runner: str | None) -> int:
    """A lead and ``Engineer_1`` (in ``state``) and ``Tester_1`` (terminated)."""
    team = router.create_team().id
    router.create_agent(team, role="Engineer", runner=runner)
    router.create_agent(team, role="Tester")
    router.terminate(team, "Tester_1", reason="gone")
    if state is AgentState.SCHEDULED:
        router.send(team, to="Engineer_1", content="wake up", sender="user")
    elif state is AgentState.RUNNING:
        start_running(router, team, "Engineer_1")
    elif state is AgentState.COMPLETED:
        start_running(router, team, "Engineer_1").end()
    elif state is AgentState.WAITING:
        start_waiting(router, team, "Engineer_1", "Team Leader")
    elif state is AgentState.TERMINATED:
        router.terminate(team, "Engineer_1", reason="gone")
    assert router.agent(team, "Engineer_1").state is state
    return team


def _outcome_of(router: Router, team: int, send: dict[str, Any]) -> dict[str, Any]:
    """What one send returned or raised, and everything it wrote, without the ids and clocks
    that differ between two teams."""
    names = {a.id: a.display_name for a in router.agents(team)}
    ledger_before = len(router.ledger(team))
    outbox_before = len(router.outbox(team))
    messages_before = len(router.messages(team))
    try:
        delivery = router.send(team, **send)
        returned: Any = (
            delivery.outcome,
            delivery.target,
            delivery.seq,
            delivery.epoch,
            delivery.duplicate,
        )
    except RefusedError as exc:
        returned = (type(exc), str(exc).replace(f"team {team}", "team T"))
    agent = router.agent(team, "Engineer_1")
    new_messages = [
        (
            m.seq,
            m.source_name,
            names.get(m.source_agent_id or 0),
            m.target_name,
            m.type,
            m.subtype,
            m.content,
            m.question_id is not None,
            m.wake,
            m.dedup_key,
            m.outcome,
            m.status,
            m.consumed_turn_id is not None,
        )
        for m in router.messages(team)[messages_before:]
    ]
    new_events = [
        (
            e.action,
            e.agent_name,
            e.outcome,
            e.epoch,
            _no_team(e.detail, team),
            e.message_id is not None,
        )
        for e in router.ledger(team)[ledger_before:]
    ]
    new_outbox = [
        (o.kind, names[o.agent_id], o.epoch, _no_team({**o.payload, "team_id": "T"}, team))
        for o in router.outbox(team)[outbox_before:]
    ]
    return {
        "returned": returned,
        "agent": (agent.state, agent.epoch, agent.pending_trigger, agent.mailbox_depth),
        "messages": new_messages,
        "ledger": new_events,
        "outbox": new_outbox,
    }


def _no_team(detail: dict[str, Any], team: int) -> dict[str, Any]:
    """``detail`` without what differs between two teams built alike: their ids, and a wake
    row's token (its question's deadline)."""
    return {
        k: (v is not None)
        if k.endswith(("_id", "token"))
        else v.replace(f"team {team}", "team T")
        if isinstance(v, str)
        else v
        for k, v in detail.items()
    }


def _general_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(one_statement, "eligible", lambda tx, req: False)


SENDS: list[dict[str, Any]] = [
    {"content": "hello", "sender": "user"},
    {"content": "quiet note", "sender": "user", "wake": False},
    {"content": "from a job", "sender": "job:nightly"},
    {"content": "do it", "sender": "Team Leader", "type": MessageType.TASK},
    {"content": "fyi", "sender": "Team Leader", "wake": False},
    {
        "content": "half way",
        "sender": "Team Leader",
        "type": MessageType.OUTPUT,
        "subtype": MessageSubtype.PROGRESS_OUTPUT,
    },
    {"content": "from the dead", "sender": "Tester_1"},
    {"content": "from nobody", "sender": "Nobody_9"},
    {"content": "to myself", "sender": "Engineer_1"},
]

STATES = [
    AgentState.IDLE,
    AgentState.COMPLETED,
    AgentState.RUNNING,
    AgentState.SCHEDULED,
    AgentState.WAITING,
    AgentState.TERMINATED,
]


@pytest.mark.parametrize(
    ("state", "runner"),
    list(itertools.product(STATES, [None, "chat.engineer_turn"])),
    ids=lambda v: getattr(v, "value", str(v)),
)
def test_one_statement_writes_what_the_general_way_writes(
    pg_router: Router, monkeypatch: pytest.MonkeyPatch, state: AgentState, runner: str | None
) -> None:
    for send in SENDS:
        fast_team = _team(pg_router, state, runner)
        general_team = _team(pg_router, state, runner)
        fast = _outcome_of(pg_router, fast_team, {"to": "Engineer_1", **send})
        with monkeypatch.context() as patch:
            _general_way(patch)
            general = _outcome_of(pg_router, general_team, {"to": "Engineer_1", **send})
        assert fast == general, send
        # The cases are not vacuous: the routed ones wrote a message and its route event.
        if not isinstance(general["returned"][0], type):
            assert len(general["messages"]) == 1
            assert LedgerAction.ROUTE in [e[0] for e in general["ledger"]]


@pytest.mark.parametrize("state", one_statement.STATES, ids=lambda s: s.value)
def test_a_send_that_needs_no_question_is_one_statement(
    pg_router: Router, state: AgentState
) -> None:
    team = _team(pg_router, state, None)
    with statements_in_autocommit(pg_router) as seen:
        pg_router.send(team, to="Engineer_1", content="hello", sender="Team Leader")
    # One statement, its own transaction (autocommit: the driver sends no BEGIN and no COMMIT):
    # one round trip. A turn task published after it is then marked published, also in one.
    (route, alone), *after_commit = seen
    assert route.lstrip().startswith("WITH") and alone
    assert all(
        statement.lstrip().startswith("UPDATE ar_outbox SET published_at") and autocommit
        for statement, autocommit in after_commit
    )
    assert len(after_commit) == (1 if state in (AgentState.IDLE, AgentState.COMPLETED) else 0)


def test_a_send_the_statement_does_not_route_goes_the_general_way_without_repeating_it(
    pg_router: Router,
) -> None:
    """To a waiting agent the statement matches nothing and writes nothing; the general way
    then routes the message in a transaction, without running the statement again."""
    team = _team(pg_router, AgentState.WAITING, None)
    with statements_in_autocommit(pg_router) as seen:
        delivery = pg_router.send(team, to="Engineer_1", content="FYI", sender="user")
    assert delivery.message_id in {m.id for m in pg_router.messages(team)}
    (first, alone), *general = seen
    assert first.lstrip().startswith("WITH") and alone
    # The general way: statements inside one transaction, and not the one statement again.
    assert general and not any(alone for _, alone in general)
    assert first not in [s for s, _ in general]


def test_concurrent_sends_to_an_idle_agent_start_one_turn_and_keep_sequence(
    pg_router: Router,
) -> None:
    """Senders race on the one statement: every message gets its own sequence number, and the
    first wakes the agent once (the rest coalesce into the scheduled turn)."""
    for _ in range(10):
        team = _team(pg_router, AgentState.IDLE, None)
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def send(
            i: int,
            team: int = team,
            barrier: threading.Barrier = barrier,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait()
                pg_router.send(team, to="Engineer_1", content=f"m{i}", sender="user")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        messages = pg_router.messages(team)
        assert sorted(m.seq for m in messages) == list(range(1, 9))
        outcomes = [m.outcome.value for m in sorted(messages, key=lambda m: m.seq)]
        assert outcomes == ["triggered_new_turn"] + ["coalesced"] * 7
        agent = pg_router.agent(team, "Engineer_1")
        assert agent.state is AgentState.SCHEDULED and agent.epoch == 1
        turn_tasks = [o for o in pg_router.outbox(team) if o.agent_id == agent.id]
        assert len(turn_tasks) == 1
