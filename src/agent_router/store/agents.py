"""Teams and agents, under the team lock: create, stop, terminate (and bulk mailbox seeding)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import sqlalchemy as sa

from agent_router.domain import (
    Agent,
    AgentState,
    Delivery,
    LedgerAction,
    MessageStatus,
    MessageType,
    QuestionStatus,
    RouteOutcome,
    Team,
    TurnStatus,
    TurnTrigger,
)
from agent_router.store import queries, refusals, routing, turns, values
from agent_router.store.decisions import close_question, move
from agent_router.store.models import (
    AgentRow,
    MessageRow,
    QuestionRow,
    TeamRow,
    TurnRow,
    utcnow,
)
from agent_router.store.rules import INTERRUPT_REASON
from agent_router.store.tx import Tx
from agent_router.store.values import NewAgent, SendRequest


def create_team(
    tx: Tx, lead: NewAgent, model: str | None = None, user_task: str | None = None
) -> Team:
    """A team and its ``lead`` (named by its display name, else by its role), whose agents run
    on ``model`` when it is given, and whose messages to the user ``user_task`` receives."""
    team = tx.added(TeamRow(model=model, user_task=user_task))
    name = lead.display_name or lead.role
    row = insert_agent(
        tx, team.id, name, lead.role, lead.system_prompt, is_lead=True, runner=lead.runner
    )
    tx.agent_ledger(LedgerAction.TEAM_CREATED, row)
    return Team(
        id=team.id,
        lead=values.agent(row),
        created_at=team.created_at,
        model=team.model,
        user_task=team.user_task,
    )


def create_agent(
    tx: Tx, team_id: int, new: NewAgent, task: SendRequest | None = None
) -> tuple[Agent, Delivery | None]:
    """Add a sub-agent and, when ``task`` is given, route that message to it (its ``to`` is
    replaced by the new display name) in the same transaction: both exist, or neither.
    ``new.role`` is checked by :func:`rules.check_role` first."""
    queries.team(tx.session, team_id, lock=True)
    agent = add_agent(tx, team_id, new)
    delivery: Delivery | None = None
    if task is not None:
        task = replace(task, team_id=team_id, to=agent.display_name)
        delivery = routing.route(tx, task)
    return values.agent(agent), delivery


def add_agent(tx: Tx, team_id: int, new: NewAgent) -> AgentRow:
    """Insert the agent (the caller holds the team lock)."""
    session = tx.session
    role, display_name = new.role, new.display_name
    if display_name is None:
        # {Role}_{n}, n counted per role from 1; the team lock makes the count safe.
        taken = set(
            session.scalars(
                sa.select(AgentRow.display_name).where(
                    AgentRow.team_id == team_id, AgentRow.role == role
                )
            )
        )
        n = 1
        while f"{role}_{n}" in taken:
            n += 1
        display_name = f"{role}_{n}"
    if queries.agent_by_name(tx.session, team_id, display_name) is not None:
        raise tx.refuse(
            refusals.error("display_name_taken", name=display_name, team_id=team_id),
            LedgerAction.SEND_REJECTED,
            team_id=team_id,
            reason="duplicate_display_name",
            display_name=display_name,
        )
    agent = insert_agent(tx, team_id, display_name, role, new.system_prompt, runner=new.runner)
    tx.agent_ledger(
        LedgerAction.AGENT_CREATED,
        agent,
        display_name=display_name,
        role=role,
    )
    return agent


def insert_agent(
    tx: Tx,
    team_id: int,
    display_name: str,
    role: str,
    system_prompt: str | None,
    *,
    is_lead: bool = False,
    runner: str | None = None,
) -> AgentRow:
    """A new idle agent; its system prompt, snapshotted now, opens its transcript. ``runner``:
    the host's task for its turns (``None``: the built-in loop)."""
    agent = tx.added(
        AgentRow(
            team_id=team_id,
            display_name=display_name,
            role=role,
            is_lead=is_lead,
            state=AgentState.IDLE,
            next_position=0,
            system_prompt=system_prompt,
            runner=runner,
        )
    )
    if system_prompt:
        queries.append(
            tx.session, agent, {"role": "system", "content": system_prompt}, turn_id=None
        )
    return agent


def lock_sub_agent_and_askers(
    tx: Tx, agent_id: int, done: str
) -> tuple[AgentRow, Sequence[QuestionRow]]:
    """For stop and terminate: the team lock, then the agent and every agent with an open
    question to it, by id. Refuses the lead and a terminated agent. Returns the agent and
    the open questions asked of it."""
    session = tx.session
    probe = session.get(AgentRow, agent_id)
    if probe is None:
        raise refusals.error("no_agent_id", agent_id=agent_id)
    queries.team(tx.session, probe.team_id, lock=True)
    asked_of = session.scalars(
        sa.select(QuestionRow).where(
            QuestionRow.target_agent_id == agent_id,
            QuestionRow.status == QuestionStatus.OPEN,
        )
    ).all()
    for locked_id in sorted({agent_id, *(q.asker_agent_id for q in asked_of)}):
        queries.lock_agent(tx.session, locked_id)
    agent = session.get(AgentRow, agent_id)
    assert agent is not None
    if agent.is_lead:
        raise refusals.error("lead_kept", done=done)
    if agent.state is AgentState.TERMINATED:
        raise refusals.error("already_terminated", name=agent.display_name)
    return agent, asked_of


def terminate(tx: Tx, agent_id: int, *, reason: str) -> None:
    """Final: fence any running turn, drop pending messages with ``reason``, cancel the
    questions it asked, and release agents blocked on a question to it."""
    session = tx.session
    agent, waiters = lock_sub_agent_and_askers(tx, agent_id, "terminated")
    dropped = _fence_and_drop(tx, agent, reason)
    for own in session.scalars(
        sa.select(QuestionRow).where(
            QuestionRow.asker_agent_id == agent.id,
            QuestionRow.status == QuestionStatus.OPEN,
        )
    ):
        close_question(own, QuestionStatus.CANCELLED, stop_waiting=True)
    for question in waiters:
        asker = session.get(AgentRow, question.asker_agent_id)
        assert asker is not None
        close_question(question, QuestionStatus.CANCELLED)
        if question.waiting:
            routing.release(
                tx,
                asker,
                question,
                f"cancelled: {agent.display_name} was terminated ({reason})",
            )
    agent.epoch += 1
    move(agent, AgentState.TERMINATED)
    agent.suspended = False
    agent.pending_trigger = None
    tx.agent_ledger(
        LedgerAction.TERMINATED,
        agent,
        epoch=agent.epoch,
        reason=reason,
        dropped=dropped,
    )


def _fence_and_drop(tx: Tx, agent: AgentRow, reason: str) -> int:
    """Fence the agent's running turns, cancel its open tool calls and drop its pending
    messages; returns how many were dropped."""
    session = tx.session
    now = utcnow()
    running = session.scalars(
        sa.select(TurnRow).where(TurnRow.agent_id == agent.id, TurnRow.status == TurnStatus.RUNNING)
    ).all()
    for turn in running:
        turn.status = TurnStatus.FENCED
        turn.ended_at = now
        turn.error = f"terminated: {reason}"
    turns.close_dangling(tx, agent, None, f"cancelled: agent terminated ({reason})", None)
    return queries.changed(
        session,
        sa.update(MessageRow)
        .where(
            MessageRow.target_agent_id == agent.id,
            MessageRow.status == MessageStatus.PENDING,
        )
        .values(status=MessageStatus.DROPPED, drop_reason=f"target terminated: {reason}"),
    )


def request_stop(tx: Tx, agent_id: int, *, reason: str) -> AgentState:
    """Stop a sub-agent cooperatively. A resting, scheduled or suspended agent stops at once
    (a queued turn task is fenced); a running or blocked one is flagged and stops at its next
    boundary (:meth:`finish_stop`). Questions it asked and questions asked of it are
    cancelled (blocked askers get a ``cancelled`` result); its mailbox is kept. Returns the
    state after the request (``idle``, or ``running`` while the stop is pending)."""
    session = tx.session
    agent, asked_of = lock_sub_agent_and_askers(tx, agent_id, "stopped")
    for question in asked_of:
        close_question(question, QuestionStatus.CANCELLED)
        if question.waiting:
            asker = session.get(AgentRow, question.asker_agent_id)
            assert asker is not None
            routing.release(
                tx,
                asker,
                question,
                f"cancelled: {agent.display_name} was stopped ({reason})",
            )
    state_before = agent.state
    own = queries.waiting_question(tx.session, agent.id)
    if agent.state is AgentState.RUNNING or (
        agent.state is AgentState.WAITING and not agent.suspended
    ):
        agent.stop_requested = True
        if own is not None:  # blocked in a worker: end the wait, the turn then stops
            close_question(own, QuestionStatus.CANCELLED)
            routing.release(tx, agent, own, f"cancelled: stopped ({reason})")
        action = LedgerAction.STOP_REQUESTED
    else:
        _stop_now(tx, agent, own, reason)
        action = LedgerAction.STOPPED
    tx.agent_ledger(
        action,
        agent,
        epoch=agent.epoch,
        reason=reason,
        state_before=state_before.value,
        cancelled_questions=len(asked_of),
    )
    return agent.state


def interrupt(tx: Tx, req: SendRequest) -> Delivery:
    """The user's message to the lead, routed as :func:`~agent_router.store.routing.route`
    routes it; a lead running a turn is then asked to stop at its next boundary, and that stop
    starts one follow-up turn for the message (:func:`~agent_router.store.turns.stop_turn`).
    A lead waiting on a wait of its own (a wait for a sub-agent's output) has the wait ended
    too, its call given a ``cancelled`` result: blocked in its worker, its turn reaches that
    boundary now rather than when the output comes; suspended (no worker holds it), it is
    stopped here and the follow-up turn scheduled at once."""
    delivery = routing.route(tx, req)
    lead = queries.agent_by_name(tx.session, req.team_id, req.to)
    assert lead is not None
    if delivery.duplicate or lead.stop_requested:
        return delivery
    state_before = lead.state
    own = queries.waiting_question(tx.session, lead.id)
    if lead.state is not AgentState.RUNNING and (
        lead.state is not AgentState.WAITING or own is None
    ):
        return delivery
    stopped = f"cancelled: stopped ({INTERRUPT_REASON})"
    if lead.suspended:
        _stop_now(tx, lead, own, INTERRUPT_REASON)
        tx.agent_ledger(
            LedgerAction.STOPPED,
            lead,
            epoch=lead.epoch,
            reason=INTERRUPT_REASON,
            state_before=state_before.value,
            cancelled_questions=0,
        )
        routing.schedule(tx, lead, TurnTrigger.FOLLOW_UP)
        tx.agent_ledger(LedgerAction.FOLLOW_UP, lead, epoch=lead.epoch)
        return delivery
    lead.stop_requested = True
    if own is not None:  # blocked in a worker: end the wait, the turn then stops
        close_question(own, QuestionStatus.CANCELLED)
        routing.release(tx, lead, own, stopped)
    tx.agent_ledger(
        LedgerAction.STOP_REQUESTED,
        lead,
        epoch=lead.epoch,
        reason=INTERRUPT_REASON,
        state_before=state_before.value,
        cancelled_questions=0,
        restart=True,
    )
    return delivery


def _stop_now(tx: Tx, agent: AgentRow, own: QuestionRow | None, reason: str) -> None:
    """A stop of an agent no worker holds: it is ``idle`` at once, a queued turn task fenced."""
    if own is not None:  # suspended on a wait: its call gets the cancelled result
        close_question(own, QuestionStatus.CANCELLED)
        own.waiting = False
    turns.close_dangling(tx, agent, None, f"cancelled: stopped ({reason})", None)
    turns.cancel_own_questions(tx, agent, utcnow())
    if agent.state in (AgentState.SCHEDULED, AgentState.WAITING):
        agent.epoch += 1  # a queued turn task (or continuation) claims nothing
    turns.to_idle(agent)


def seed_mailbox(
    tx: Tx, agent_id: int, count: int, *, content: str, sender: str = "system"
) -> None:
    """Queue ``count`` context-only notices for an agent in bulk (benchmarks and load tests:
    it bypasses routing decisions, so it never wakes anyone)."""
    session = tx.session
    agent = queries.lock_agent(tx.session, agent_id)
    if agent is None:
        raise refusals.error("no_agent_id", agent_id=agent_id)
    first = agent.next_seq
    agent.next_seq += count
    now = utcnow()
    for start in range(0, count, 10_000):
        session.execute(
            sa.insert(MessageRow),
            [
                {
                    "team_id": agent.team_id,
                    "seq": first + i,
                    "source_name": sender,
                    "target_agent_id": agent.id,
                    "type": MessageType.NOTICE,
                    "content": content,
                    "wake": False,
                    "outcome": RouteOutcome.QUEUED,
                    "status": MessageStatus.PENDING,
                    "created_at": now,
                }
                for i in range(start, min(count, start + 10_000))
            ],
        )
