"""``send_many``: a lead briefs several sub-agents in one transaction, on both backends. Each
message is routed as ``send`` routes it; all commit together or none does."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agent_router import AgentState, RouteOutcome, Router
from agent_router.domain import LedgerAction, OutboxKind
from agent_router.errors import InvalidMessageError, UnknownAgentError
from agent_router.ops.checks import check_team
from agent_router.outbox import RecordingPublisher

from .helpers import start_running


def _team(router: Router, subs: int) -> tuple[int, list[str]]:
    team = router.create_team().id
    router.create_agent(team, role="Team Leader")
    return team, [router.create_agent(team, role="Worker").display_name for _ in range(subs)]


def test_a_lead_briefs_its_sub_agents_in_one_call(
    router: Router, publisher: RecordingPublisher
) -> None:
    team, subs = _team(router, 3)
    running = start_running(router, team, subs[1])
    published = len(publisher.entries)
    # Given out of id order: the deliveries still come back in the order given.
    briefs = [{"to": name, "content": f"brief for {name}"} for name in reversed(subs)]
    deliveries = router.send_many(team, briefs, sender="Team Leader")
    assert [d.target for d in deliveries] == list(reversed(subs))
    assert [d.outcome for d in deliveries] == [
        RouteOutcome.TRIGGERED_NEW_TURN,
        RouteOutcome.INJECTED_INLINE,
        RouteOutcome.TRIGGERED_NEW_TURN,
    ]
    states = {name: router.agent(team, name).state for name in subs}
    assert states == {
        subs[0]: AgentState.SCHEDULED,
        subs[1]: AgentState.RUNNING,
        subs[2]: AgentState.SCHEDULED,
    }
    # One turn task per resting sub-agent, published after the one commit.
    enqueued = publisher.entries[published:]
    assert [e.kind for e in enqueued] == [OutboxKind.ENQUEUE_TURN] * 2
    ids = {router.agent(team, n).id for n in (subs[0], subs[2])}
    assert {e.agent_id for e in enqueued} == ids
    routed = [e for e in router.ledger(team) if e.action is LedgerAction.ROUTE]
    assert {e.message_id for e in routed} >= {d.message_id for d in deliveries}
    drained = running.drain()
    assert [m.content for m in drained] == [f"brief for {subs[1]}"]
    running.end()
    for name in (subs[0], subs[2]):
        turn = router.claim_turn(team, name)
        assert turn is not None
        assert [m.content for m in turn.drain()] == [f"brief for {name}"]
        turn.end()
    assert check_team(router, team, quiescent=True).ok


def test_one_refused_message_refuses_the_whole_batch(
    router: Router, publisher: RecordingPublisher
) -> None:
    team, subs = _team(router, 2)
    before_messages = len(router.messages(team))
    published = len(publisher.entries)
    with pytest.raises(UnknownAgentError):
        router.send_many(
            team,
            [
                {"to": subs[0], "content": "brief"},
                {"to": "Nobody_9", "content": "brief"},
                {"to": subs[1], "content": "brief"},
            ],
            sender="Team Leader",
        )
    assert len(router.messages(team)) == before_messages
    assert len(publisher.entries) == published
    assert {router.agent(team, n).state for n in subs} == {AgentState.IDLE}
    rejected = [e for e in router.ledger(team) if e.action is LedgerAction.SEND_REJECTED]
    assert [e.detail["reason"] for e in rejected] == ["unknown_target"]
    # The numbers the batch took are given back: the next message is seq 1.
    assert router.send(team, to=subs[0], content="x", sender="Team Leader").seq == 1


@pytest.mark.parametrize(
    "messages",
    [
        [{"to": "Worker_1", "content": "   "}],
        [{"to": "Worker_1"}],
        [{"to": "Worker_1", "content": "x", "sender": "user"}],
        [{"to": "Worker_1", "content": "x", "type": "shout"}],
        ["Worker_1"],
        {"to": "Worker_1", "content": "x"},
        "Worker_1",
    ],
)
def test_bad_input_is_one_typed_error_and_changes_nothing(router: Router, messages: Any) -> None:
    team, subs = _team(router, 1)
    assert subs == ["Worker_1"]
    with pytest.raises(InvalidMessageError):
        router.send_many(team, messages, sender="Team Leader")
    assert router.messages(team) == []
    assert router.agent(team, "Worker_1").state is AgentState.IDLE


def test_an_empty_batch_writes_nothing(router: Router) -> None:
    team, _subs = _team(router, 1)
    assert router.send_many(team, [], sender="Team Leader") == []
    assert router.messages(team) == []


def test_batches_to_the_same_agents_in_opposite_orders_never_deadlock(router: Router) -> None:
    """Targets are locked in one canonical order whatever order the batch names them in."""
    team, subs = _team(router, 4)
    barrier = threading.Barrier(2)

    def brief(i: int) -> int:
        names = subs if i % 2 == 0 else list(reversed(subs))
        sent = 0
        barrier.wait()
        for k in range(15):
            batch = [{"to": n, "content": f"b{i}-{k}", "wake": False} for n in names]
            sent += len(router.send_many(team, batch, sender="Team Leader"))
        return sent

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert sum(pool.map(brief, range(2))) == 2 * 15 * 4
    for name in subs:
        seqs = sorted(m.seq for m in router.messages(team) if m.target_name == name)
        assert seqs == list(range(1, 31))
