"""Property-based test of the router's state machine: random interleavings of send, claim,
drain, append, asks, end, stale claims and take-overs, with guarantees 2-7 and the routing table
(only the agent an ask waits on releases it) checked after every step."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agent_router import (
    AgentState,
    AskRefusedError,
    RefusedError,
    RouteOutcome,
    Router,
    StaleTurnError,
    ToolCallsPendingError,
    Turn,
)
from agent_router.domain import RESTING_STATES, MessageStatus, OutboxKind
from agent_router.ops.checks import check_team

from .helpers import assistant, tool_call

NAMES = ["Team Leader", "Engineer_1", "Designer_1"]
SENDERS = ["user", "system", "job:build", *NAMES]
EXPECTED = {
    AgentState.IDLE: RouteOutcome.TRIGGERED_NEW_TURN,
    AgentState.COMPLETED: RouteOutcome.TRIGGERED_NEW_TURN,
    AgentState.SCHEDULED: RouteOutcome.COALESCED,
    AgentState.RUNNING: RouteOutcome.INJECTED_INLINE,
}


def make_machine(router: Router) -> type[RuleBasedStateMachine]:
    class RouterMachine(RuleBasedStateMachine):
        @initialize()
        def team(self) -> None:
            self.team_id = router.create_team().id
            router.create_agent(self.team_id, role="Engineer")
            router.create_agent(self.team_id, role="Designer")
            self.turns: dict[str, Turn] = {}
            self.stale: list[Turn] = []
            self.calls = itertools.count()
            self.accepted = 0
            self.waits: dict[str, str] = {}  # asker -> the agent its ask waits on

        def _state(self, name: str) -> AgentState:
            return router.agent(self.team_id, name).state

        def _running(self) -> list[str]:
            """Agents whose turn is running (not blocked in an ask)."""
            return sorted(n for n in self.turns if n not in self.waits)

        def _expected(self, to: str, sender: str, wake: bool, before: AgentState) -> RouteOutcome:
            if before is AgentState.WAITING:
                if wake and self.waits.get(to) == sender:
                    return RouteOutcome.RESOLVED
                return RouteOutcome.INJECTED_INLINE if wake else RouteOutcome.QUEUED
            if wake or before not in RESTING_STATES:
                return EXPECTED[before]
            return RouteOutcome.QUEUED

        @rule(
            to=st.sampled_from(NAMES),
            sender=st.sampled_from(SENDERS),
            wake=st.booleans(),
            content=st.text(
                st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                min_size=1,
                max_size=40,
            ).filter(str.strip),
        )
        def send(self, to: str, sender: str, wake: bool, content: str) -> None:
            before = self._state(to)
            try:
                d = router.send(self.team_id, to=to, content=content, sender=sender, wake=wake)
            except RefusedError:
                assert sender == to
                return
            self.accepted += 1
            expected = self._expected(to, sender, wake, before)
            assert d.outcome is expected, (before, sender, self.waits.get(to), wake, d.outcome)
            if expected is RouteOutcome.RESOLVED:
                del self.waits[to]
                assert self._state(to) is AgentState.RUNNING

        @precondition(lambda self: bool(self._running()))
        @rule(data=st.data(), whom=st.sampled_from(NAMES))
        def ask(self, data: st.DataObject, whom: str) -> None:
            name = data.draw(st.sampled_from(self._running()))
            turn = self.turns[name]
            if turn.open_tool_calls():
                return
            call = f"ask{next(self.calls)}"
            turn.append_assistant(assistant(None, tool_call(call, "ask_master")))
            try:
                turn.ask(whom, "which one?", tool_call_id=call)
            except AskRefusedError:
                # Itself, or a cycle: the target already waits (through others) on the asker.
                chain, waits_on = [whom], self.waits.get(whom)
                while waits_on is not None and waits_on not in chain:
                    chain.append(waits_on)
                    waits_on = self.waits.get(waits_on)
                assert whom == name or name in chain
                turn.append_tool_result(call, "refused")
                return
            self.waits[name] = whom
            assert self._state(name) is AgentState.WAITING

        @rule(name=st.sampled_from(NAMES))
        def claim(self, name: str) -> None:
            scheduled = self._state(name) is AgentState.SCHEDULED
            turn = router.claim_turn(self.team_id, name)
            assert (turn is not None) == scheduled
            if turn is not None:
                assert name not in self.turns
                self.turns[name] = turn

        @rule(name=st.sampled_from(NAMES), back=st.integers(min_value=1, max_value=3))
        def stale_claim(self, name: str, back: int) -> None:
            agent = router.agent(self.team_id, name)
            assert router.claim(agent.id, agent.epoch - back) is None

        @precondition(lambda self: bool(self._running()))
        @rule(data=st.data())
        def drain(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(self._running()))
            turn = self.turns[name]
            pending = [
                m
                for m in router.messages(self.team_id)
                if m.target_name == name and m.status is MessageStatus.PENDING
            ]
            try:
                got = turn.drain()
            except ToolCallsPendingError:
                assert turn.open_tool_calls()
                return
            assert [m.id for m in got] == [m.id for m in sorted(pending, key=lambda m: m.seq)]

        @precondition(lambda self: bool(self._running()))
        @rule(data=st.data(), with_calls=st.integers(min_value=0, max_value=2))
        def model_output(self, data: st.DataObject, with_calls: int) -> None:
            name = data.draw(st.sampled_from(self._running()))
            turn = self.turns[name]
            calls = [tool_call(f"c{next(self.calls)}") for _ in range(with_calls)]
            try:
                turn.append_assistant(assistant("thinking" if not calls else None, *calls))
            except ToolCallsPendingError:
                assert turn.open_tool_calls()

        @precondition(lambda self: bool(self._running()))
        @rule(data=st.data())
        def tool_result(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(self._running()))
            turn = self.turns[name]
            open_calls = turn.open_tool_calls()
            if open_calls:
                turn.append_tool_result(open_calls[0], "ok")

        @precondition(lambda self: bool(self._running()))
        @rule(data=st.data(), failed=st.booleans())
        def end(self, data: st.DataObject, failed: bool) -> None:
            name = data.draw(st.sampled_from(self._running()))
            turn = self.turns.pop(name)
            pending_wake = any(
                m.target_name == name and m.status is MessageStatus.PENDING and m.wake
                for m in router.messages(self.team_id)
            )
            result = turn.end(failed=failed)
            assert result.follow_up == pending_wake
            assert result.state is (AgentState.SCHEDULED if pending_wake else AgentState.COMPLETED)
            self.stale.append(turn)

        @precondition(lambda self: bool(self._running()))
        @rule(data=st.data())
        def take_over(self, data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(self._running()))
            turn = self.turns.pop(name)
            router.take_over(self.team_id, name, reason="lease expired")
            self.stale.append(turn)
            assert self._state(name) is AgentState.SCHEDULED

        @precondition(lambda self: bool(self.stale))
        @rule(data=st.data())
        def stale_write(self, data: st.DataObject) -> None:
            turn = data.draw(st.sampled_from(self.stale))
            op = data.draw(st.sampled_from(["drain", "append", "end"]))
            with pytest.raises(StaleTurnError):
                if op == "drain":
                    turn.drain()
                elif op == "append":
                    turn.append_assistant(assistant("from the past"))
                else:
                    turn.end()

        @invariant()
        def guarantees_hold(self) -> None:
            if not hasattr(self, "team_id"):
                return
            report = check_team(router, self.team_id)
            assert not report.violations, report.violations  # failed turns are its own doing
            assert report.messages == self.accepted + sum(
                1 for m in router.messages(self.team_id) if m.type.value == "ask"
            )
            outbox = [e for e in router.outbox(self.team_id) if e.kind is OutboxKind.ENQUEUE_TURN]
            keys = [(e.agent_id, e.epoch) for e in outbox]
            assert len(keys) == len(set(keys)), "two turns enqueued for one epoch"
            pending = router.messages(self.team_id)
            for agent in router.agents(self.team_id):
                wake_pending = any(
                    m.target_agent_id == agent.id and m.wake and m.status is MessageStatus.PENDING
                    for m in pending
                )
                if agent.state in RESTING_STATES:
                    # Guarantee 6/9: a resting agent never sits on a message that should wake it.
                    assert not wake_pending, f"{agent.display_name} rests with wake mail"
                if agent.state is AgentState.SCHEDULED:
                    assert (agent.id, agent.epoch) in keys
                owned = agent.state in (AgentState.RUNNING, AgentState.WAITING)
                assert owned == (agent.display_name in self.turns)
                waiting = agent.state is AgentState.WAITING
                assert waiting == (agent.display_name in self.waits)

    return RouterMachine


@pytest.mark.slow
def test_router_state_machine(router: Router) -> None:
    run_state_machine_as_test(
        make_machine(router),
        settings=settings(
            max_examples=int(os.environ.get("AGENT_ROUTER_HYPOTHESIS_EXAMPLES", "20")),
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
