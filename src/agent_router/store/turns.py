"""A turn's transitions, under its agent's row lock and checked against the fence: claim, drain,
append, end, lease, suspend, stop."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from agent_router import errors, formats
from agent_router.domain import (
    AgentState,
    EndOfTurn,
    LedgerAction,
    Message,
    MessageStatus,
    MessageSubtype,
    Question,
    QuestionKind,
    QuestionStatus,
    TurnRecord,
    TurnStatus,
    TurnTrigger,
)
from agent_router.store import budgets, queries, refusals, routing, values
from agent_router.store.decisions import close_question, move
from agent_router.store.models import (
    AgentRow,
    MessageRow,
    QuestionRow,
    TranscriptEntryRow,
    TurnRow,
    utcnow,
)
from agent_router.store.rules import INTERRUPTED_RESULT, STOPPED_RESULT
from agent_router.store.tx import Refused, Tx
from agent_router.store.values import (
    AfterCall,
    BeforeCall,
    CallUsage,
    Claim,
    FirstCall,
    Result,
    Since,
)


def claim(
    tx: Tx,
    agent_id: int,
    epoch: int | None = None,
    *,
    builtin: bool = False,
    first: FirstCall | None = None,
) -> Claim | None:
    """Claim the scheduled turn of ``epoch`` (default: the current one) and count it against
    the team's budgets; ``None`` if there is nothing to claim: a duplicate or stale delivery,
    or no turn scheduled. The claim carries the agent's team and name, so that starting the
    turn needs no second read. ``builtin``: the claim is the built-in loop's, which runs no turn
    of an agent whose turns a host's task runs (refused with ``HostOwnedTurnError``, nothing
    written, whatever the agent's state: the host's task claims or refuses it). ``first``: the
    claim makes the transition before the turn's first model call too (:func:`before_call`),
    as :class:`FirstCall` says."""
    agent = queries.lock_agent(tx.session, agent_id)
    if agent is None:
        raise refusals.error("no_agent_id", agent_id=agent_id)
    if builtin and agent.runner:
        raise refusals.error("host_owned", runner=agent.runner)
    if agent.state is not AgentState.SCHEDULED or (epoch is not None and epoch != agent.epoch):
        tx.agent_ledger(
            LedgerAction.CLAIM_REFUSED,
            agent,
            epoch=epoch,
            current_epoch=agent.epoch,
            state=agent.state.value,
        )
        return None
    trigger = agent.pending_trigger or TurnTrigger.NEW
    move(agent, AgentState.RUNNING)
    agent.pending_trigger = None
    now = utcnow()
    turn = tx.added(
        TurnRow(
            team_id=agent.team_id,
            agent_id=agent.id,
            epoch=agent.epoch,
            trigger=trigger,
            status=TurnStatus.RUNNING,
            started_at=now,
            lease_expires_at=now + timedelta(seconds=tx.settings.lease_seconds),
        )
    )
    tx.agent_ledger(
        LedgerAction.TURN_CLAIMED,
        agent,
        turn_id=turn.id,
        epoch=agent.epoch,
        trigger=trigger.value,
    )
    # The agent's lock, then the budget's: no transaction takes them the other way round.
    check = budgets.charge_turn(tx, agent.team_id, agent.id, turn.id)
    lead = agent.display_name
    if not agent.is_lead:
        lead = tx.session.scalars(
            sa.select(AgentRow.display_name).where(
                AgentRow.team_id == agent.team_id, AgentRow.is_lead.is_(True)
            )
        ).one()
    claim = Claim(
        values.turn(turn),
        agent.team_id,
        agent.display_name,
        check,
        values.agent(agent),
        lead,
        agent.context_window,
        tuple(queries.open_tool_calls(tx.session, agent.id)),
    )
    if first is None or not check.ok or agent.stop_requested or claim.open_calls:
        return claim
    since = first.kept
    if since is None and agent.context_window is None:
        since = Since(None)
    return claim._replace(before=before_call(tx, claim.record, since=since), read=since)


# The agent locked and its turn read in one statement (the lock is the agent's alone; see
# queries.lock_agent for populate_existing).
_FENCE = (
    sa.select(AgentRow, TurnRow)
    .outerjoin(TurnRow, TurnRow.id == sa.bindparam("b_turn"))
    .where(AgentRow.id == sa.bindparam("b_agent"))
    .with_for_update(of=AgentRow, key_share=True)
    .execution_options(populate_existing=True)
)


def fenced(tx: Tx, turn: TurnRecord, operation: str) -> tuple[AgentRow, TurnRow]:
    """Lock the turn's agent and check the fence; a stale turn writes nothing."""
    found = tx.session.execute(_FENCE, {"b_turn": turn.id, "b_agent": turn.agent_id}).first()
    agent: AgentRow | None = found[0] if found is not None else None
    row: TurnRow | None = found[1] if found is not None else None
    if (
        agent is None
        or row is None
        or agent.epoch != turn.epoch
        or row.status is not TurnStatus.RUNNING
        or agent.state not in (AgentState.RUNNING, AgentState.WAITING)
    ):
        raise tx.refuse(
            refusals.error("stale_turn", turn_id=turn.id, epoch=turn.epoch, operation=operation),
            LedgerAction.STALE_WRITE_REFUSED,
            team_id=agent.team_id if agent else None,
            # A deleted team's rows are gone: the event then names them only in its detail.
            agent_id=turn.agent_id if agent else None,
            turn_id=turn.id if row else None,
            epoch=turn.epoch,
            operation=operation,
            current_epoch=agent.epoch if agent else None,
            **({} if agent and row else {"deleted_agent_id": turn.agent_id, "turn": turn.id}),
        )
    return agent, row


def _write_refused(
    tx: Tx,
    agent: AgentRow,
    turn: TurnRecord,
    operation: str,
    error: errors.AgentRouterError,
    **detail: Any,
) -> Refused:
    """A write (``operation``) of a current turn refused: ledgered as a stale write."""
    return tx.refuse(
        error,
        LedgerAction.STALE_WRITE_REFUSED,
        team_id=agent.team_id,
        agent_id=agent.id,
        turn_id=turn.id,
        operation=operation,
        **detail,
    )


def drain(tx: Tx, turn: TurnRecord, *, limit: int | None = None) -> list[Message]:
    """Move pending messages, in sequence order, into the transcript; consumed in this
    transaction. Refused while the last assistant tool calls still lack results."""
    return _drain(tx, _drainable(tx, turn), turn, limit or tx.settings.drain_batch_size)


def _drain(tx: Tx, agent: AgentRow, turn: TurnRecord, batch: int) -> list[Message]:
    """:func:`drain` once its turn may drain."""
    session = tx.session
    # Core rows and two set-based statements: a drain of a thousand messages is one
    # SELECT, one multi-row INSERT and one UPDATE, not a unit of work per message.
    rows = session.execute(
        sa.select(MessageRow.__table__)
        .where(
            MessageRow.target_agent_id == agent.id,
            MessageRow.status == MessageStatus.PENDING,
        )
        .order_by(MessageRow.seq)
        .limit(batch)
    ).all()
    if not rows:
        return []
    now = utcnow()
    rows, superseded = _latest_progress(rows)
    delivered = _into_transcript(tx, agent, turn, rows, now)
    session.execute(
        sa.update(MessageRow)
        .where(MessageRow.id.in_([m.id for m in delivered]))
        .values(status=MessageStatus.DELIVERED, consumed_turn_id=turn.id, consumed_at=now)
        .execution_options(synchronize_session=False)
    )
    for old_id, latest_id in superseded.items():
        session.execute(
            sa.update(MessageRow)
            .where(MessageRow.id == old_id)
            .values(
                status=MessageStatus.DROPPED,
                drop_reason=f"superseded by progress output {latest_id}: only the latest "
                "progress of a sender reaches the reader per drain",
            )
            .execution_options(synchronize_session=False)
        )
    tx.agent_ledger(
        LedgerAction.DRAIN,
        agent,
        turn_id=turn.id,
        epoch=turn.epoch,
        count=len(delivered),
        first_seq=delivered[0].seq,
        last_seq=delivered[-1].seq,
        superseded=sorted(superseded) or None,
    )
    return delivered


def _latest_progress(
    rows: Sequence[sa.Row[Any]],
) -> tuple[list[sa.Row[Any]], dict[int, int]]:
    """The rows to deliver, and the progress outputs left out (id -> the later one that
    supersedes it): of one sender's progress narration in a drain, only the latest is read.
    Rows always hold at least that latest one, so a drain never comes back empty-handed."""
    latest: dict[Any, int] = {}
    for row in rows:
        if row.subtype is MessageSubtype.PROGRESS_OUTPUT:
            latest[row.source_name] = row.id
    superseded = {
        row.id: latest[row.source_name]
        for row in rows
        if row.subtype is MessageSubtype.PROGRESS_OUTPUT and latest[row.source_name] != row.id
    }
    return [row for row in rows if row.id not in superseded], superseded


def _into_transcript(
    tx: Tx, agent: AgentRow, turn: TurnRecord, rows: Sequence[sa.Row[Any]], now: datetime
) -> list[Message]:
    """The drained messages as user entries of the transcript, in one multi-row INSERT."""
    position = agent.next_position
    agent.next_position = position + len(rows)
    delivered = [
        values.message(
            row._mapping,
            agent.display_name,
            status=MessageStatus.DELIVERED,
            consumed_turn_id=turn.id,
        )
        for row in rows
    ]
    tx.session.execute(
        sa.insert(TranscriptEntryRow),
        [
            {
                "agent_id": agent.id,
                "position": position + k,
                "role": "user",
                "payload": {
                    "role": "user",
                    "content": formats.render(formats.envelope_of(message)),
                },
                "meta": formats.metadata(message),
                "message_id": message.id,
                "turn_id": turn.id,
                "created_at": now,
            }
            for k, message in enumerate(delivered)
        ],
    )
    return delivered


def _drainable(tx: Tx, turn: TurnRecord) -> AgentRow:
    """The turn's agent, locked, if it may drain: running, and no tool call left open."""
    agent, _row = fenced(tx, turn, "drain")
    _running(tx, agent, turn)
    _refuse_open_tool_calls(
        tx,
        agent,
        turn,
        "drain",
        "calls_open_at_drain",
        ledger_calls=True,
    )
    return agent


def _running(tx: Tx, agent: AgentRow, turn: TurnRecord) -> None:
    """Refuse a drain of an agent that is not running (it waits on a question)."""
    if agent.state is not AgentState.RUNNING:
        raise _write_refused(
            tx,
            agent,
            turn,
            "drain",
            refusals.error("cannot_drain", name=agent.display_name, state=agent.state.value),
        )


def _refuse_open_tool_calls(
    tx: Tx,
    agent: AgentRow,
    turn: TurnRecord,
    operation: str,
    code: str,
    *,
    ledger_calls: bool = False,
) -> None:
    """Refuse ``operation`` while tool calls of the last assistant message have no result
    (the refusal ``code``, naming them); ``ledger_calls``: the stale write event names
    them."""
    dangling = queries.open_tool_calls(tx.session, agent.id)
    if dangling:
        error = refusals.error(code, calls=dangling)
        detail = {"dangling": dangling} if ledger_calls else {}
        raise _write_refused(tx, agent, turn, operation, error, **detail)


def append_assistant(tx: Tx, turn: TurnRecord, payload: dict[str, Any]) -> None:
    """Append an assistant message (checked by :func:`rules.validate_assistant`) to the
    transcript."""
    agent, _row = fenced(tx, turn, "append_assistant")
    _refuse_open_tool_calls(tx, agent, turn, "append_assistant", "calls_open_at_append")
    queries.append(tx.session, agent, payload, turn_id=turn.id)


def append_tool_result(
    tx: Tx,
    turn: TurnRecord,
    tool_call_id: str,
    content: str,
    *,
    meta: Mapping[str, Any] | None = None,
) -> None:
    agent, _row = fenced(tx, turn, "append_tool_result")
    _append_result(tx, agent, turn, tool_call_id, content, meta=meta)


def _append_result(
    tx: Tx,
    agent: AgentRow,
    turn: TurnRecord,
    tool_call_id: str,
    content: str,
    *,
    meta: Mapping[str, Any] | None = None,
) -> None:
    """The result of the open tool call ``tool_call_id``, the turn fenced; ``meta``: how the
    call ran (kept in the transcript entry's ``meta``)."""
    if tool_call_id not in queries.open_tool_calls(tx.session, agent.id):
        raise _write_refused(
            tx,
            agent,
            turn,
            "append_tool_result",
            refusals.error("not_open_tool_call", call=tool_call_id),
        )
    queries.append(
        tx.session,
        agent,
        {"role": "tool", "tool_call_id": tool_call_id, "content": content},
        turn_id=turn.id,
        meta=None if meta is None else dict(meta),
    )


def close_dangling(
    tx: Tx, agent: AgentRow, turn_id: int | None, result: str, keep: str | None
) -> int:
    closed = 0
    for call_id in queries.open_tool_calls(tx.session, agent.id):
        if call_id == keep:
            continue
        queries.append(
            tx.session,
            agent,
            {"role": "tool", "tool_call_id": call_id, "content": result},
            turn_id=turn_id,
            meta={"synthetic": result.split(":", 1)[0]},
        )
        tx.agent_ledger(
            LedgerAction.SYNTHETIC_TOOL_RESULT,
            agent,
            turn_id=turn_id,
            tool_call_id=call_id,
            result=result,
        )
        closed += 1
    return closed


def end(
    tx: Tx,
    turn: TurnRecord,
    *,
    failed: bool = False,
    error: str | None = None,
    results: Sequence[Result] = (),
) -> EndOfTurn:
    """The end-of-turn hook: one follow-up if wake messages are pending, else completed.
    ``results``: tool call results the turn carried, appended first."""
    agent, row = fenced(tx, turn, "end")
    for call_id, content, meta in results:
        _append_result(tx, agent, turn, call_id, content, meta=meta)
    if agent.stop_requested and not failed:
        restarted = stop_turn(tx, agent, row, reason=requested_stop_reason(tx, agent))
        return EndOfTurn(follow_up=restarted, state=agent.state, epoch=agent.epoch)
    question = queries.waiting_question(tx.session, agent.id)
    closed = close_dangling(
        tx,
        agent,
        turn.id,
        INTERRUPTED_RESULT,
        question.tool_call_id if question else None,
    )
    if question is not None:
        # The turn ends while blocked (it failed): the ask stays open, suspended.
        question_turn_ended = True
        move(agent, AgentState.WAITING)
        agent.suspended = True
    else:
        question_turn_ended = False
    row.status = TurnStatus.FAILED if failed else TurnStatus.ENDED
    row.ended_at = utcnow()
    row.error = error
    follow_up = False
    if not question_turn_ended:
        if queries.pending_wake(tx.session, agent.id):
            follow_up = True
            routing.schedule(tx, agent, TurnTrigger.FOLLOW_UP)
        else:
            move(agent, AgentState.COMPLETED)
    _ledger_turn_ended(
        tx,
        agent,
        turn,
        failed=failed,
        error=error,
        state=agent.state.value,
        synthetic_results=closed,
    )
    if follow_up:
        tx.agent_ledger(
            LedgerAction.FOLLOW_UP,
            agent,
            turn_id=turn.id,
            epoch=agent.epoch,
        )
    return EndOfTurn(
        follow_up=follow_up, state=agent.state, epoch=agent.epoch, synthetic_results=closed
    )


def before_call(
    tx: Tx, turn: TurnRecord, *, results: Sequence[Result] = (), since: Since | None = None
) -> BeforeCall:
    """Everything a turn does before a model call, in one transaction: the ``results`` it
    carried appended (each the result of an open tool call; together they close the batch),
    its lease renewed, then a stop requested honoured (:func:`stop_turn`), else the model call
    charged to the team's budgets and, if it may be made, a batch of pending messages drained
    into the transcript. Reads what the loop builds its request from: the team's agents and,
    with ``since``, the transcript entries it says."""
    agent, row = fenced(tx, turn, "before_call")
    _running(tx, agent, turn)
    for call_id, content, meta in results:
        _append_result(tx, agent, turn, call_id, content, meta=meta)
    _refuse_open_tool_calls(
        tx,
        agent,
        turn,
        "drain",
        "calls_open_at_drain",
        ledger_calls=True,
    )
    row.lease_expires_at = utcnow() + timedelta(seconds=tx.settings.lease_seconds)
    if agent.stop_requested:
        stop_turn(tx, agent, row, reason=requested_stop_reason(tx, agent))
        return BeforeCall(stopped=True, budget=None, messages=[], roster=[])
    check = budgets.charge_model_call(tx, agent.team_id, agent.id, turn.id)
    if not check.ok:
        return BeforeCall(budget=check, messages=[], roster=[])
    batch = tx.settings.drain_batch_size
    messages = _drain(tx, agent, turn, batch)
    session = tx.session
    roster = session.scalars(
        sa.select(AgentRow).where(AgentRow.team_id == agent.team_id).order_by(AgentRow.id)
    )
    return BeforeCall(
        budget=check,
        messages=messages,
        more=len(messages) == batch and queries.mailbox_depth(session, agent.id) > 0,
        roster=[values.agent(member) for member in roster],
        rows=None if since is None else queries.transcript_after(session, agent.id, since.position),
    )


def after_call(
    tx: Tx, turn: TurnRecord, payload: dict[str, Any], *, usage: CallUsage | None
) -> AfterCall:
    """Everything a turn does after a model call, in one transaction: the call's ``usage``
    recorded (:func:`budgets.record_usage`), then, if a stop was requested meanwhile, the stop
    honoured and the reply (``payload``, checked by :func:`rules.validate_assistant`) left out; else
    the reply appended and the turn's lease renewed. A reply that calls no tool reads the
    questions open to the agent (the loop's reminders look at them before the turn ends)."""
    agent, row = fenced(tx, turn, "append_assistant")
    stopping = agent.stop_requested
    if not stopping:
        _refuse_open_tool_calls(tx, agent, turn, "append_assistant", "calls_open_at_append")
    check = None
    if usage is not None:
        check = budgets.record_usage(
            tx, agent.team_id, agent.id, turn.id, usage, agent=agent.display_name
        )
    if stopping:
        stop_turn(tx, agent, row, reason=requested_stop_reason(tx, agent))
        return AfterCall(stopped=True, budget=check, questions=[])
    queries.append(tx.session, agent, payload, turn_id=turn.id)
    row.lease_expires_at = utcnow() + timedelta(seconds=tx.settings.lease_seconds)
    questions = [] if payload.get("tool_calls") else _open_asks(tx, agent)
    return AfterCall(budget=check, questions=questions)


def _open_asks(tx: Tx, agent: AgentRow) -> list[Question]:
    """The open questions asked of ``agent`` (asks, not waits for an output), oldest first,
    with the names of their askers and of the agent."""
    asker = sa.orm.aliased(AgentRow)
    found = tx.session.execute(
        sa.select(QuestionRow, asker.display_name)
        .join(asker, asker.id == QuestionRow.asker_agent_id)
        .where(
            QuestionRow.target_agent_id == agent.id,
            QuestionRow.status == QuestionStatus.OPEN,
            QuestionRow.kind == QuestionKind.ASK,
        )
        .order_by(QuestionRow.id)
    ).all()
    return [
        dataclasses.replace(values.question(q), asker=name, target=agent.display_name)
        for q, name in found
    ]


def renew_lease(tx: Tx, turn: TurnRecord) -> bool:
    """Extend a running turn's lease; ``False`` if the turn was fenced (stop working)."""
    renewed = queries.changed(
        tx.session,
        sa.update(TurnRow)
        .where(
            TurnRow.id == turn.id,
            TurnRow.status == TurnStatus.RUNNING,
            TurnRow.epoch
            == sa.select(AgentRow.epoch).where(AgentRow.id == turn.agent_id).scalar_subquery(),
        )
        .values(lease_expires_at=utcnow() + timedelta(seconds=tx.settings.lease_seconds)),
    )
    return bool(renewed)


def suspend(tx: Tx, turn: TurnRecord) -> bool:
    """A blocked asker gives up its worker. Decided under the agent lock: ``True`` if it is now
    suspended (the answer will schedule a continuation), ``False`` if the answer already came
    (the tool result is in the transcript and this turn continues)."""
    agent, row = fenced(tx, turn, "suspend")
    if agent.state is not AgentState.WAITING:
        return False
    agent.suspended = True
    row.status = TurnStatus.SUSPENDED
    row.ended_at = utcnow()
    _ledger_turn_ended(tx, agent, turn, state=agent.state.value, suspended=True)
    return True


def _ledger_turn_ended(tx: Tx, agent: AgentRow, turn: TurnRecord, **detail: Any) -> None:
    """The ``turn_ended`` event of ``turn``, ended or suspended, with ``detail``."""
    tx.agent_ledger(LedgerAction.TURN_ENDED, agent, turn_id=turn.id, epoch=turn.epoch, **detail)


def finish_stop(tx: Tx, turn: TurnRecord, *, reason: str | None = None) -> None:
    """The turn honours a stop at a boundary: the rest of its batch gets ``cancelled``
    results, its open questions are cancelled, the agent is ``idle`` (mailbox kept). The
    ``stopped`` event carries ``reason``, by default the one the stop was requested with."""
    agent, row = fenced(tx, turn, "stop")
    stop_turn(tx, agent, row, reason=reason or requested_stop_reason(tx, agent))


def requested_stop_reason(tx: Tx, agent: AgentRow) -> str:
    """Why the agent was asked to stop (the lead's reason, a spent budget's), as requested."""
    return queries.stop_reason(tx.session, agent) or "stop requested"


def stop_turn(tx: Tx, agent: AgentRow, row: TurnRow, *, reason: str) -> bool:
    """End ``row`` stopped, the agent ``idle``; a stop the user's interrupt requested then
    starts one follow-up turn for the wake messages pending (the interrupting one among them).
    ``True`` if it did."""
    now = utcnow()
    restart = agent.stop_requested and queries.stop_request(tx.session, agent).get("restart")
    closed = close_dangling(tx, agent, row.id, STOPPED_RESULT, None)
    cancel_own_questions(tx, agent, now)
    row.status = TurnStatus.STOPPED
    row.ended_at = now
    to_idle(agent)
    tx.agent_ledger(
        LedgerAction.STOPPED,
        agent,
        turn_id=row.id,
        epoch=agent.epoch,
        reason=reason,
        cancelled_tool_calls=closed,
    )
    if not (restart and queries.pending_wake(tx.session, agent.id)):
        return False
    routing.schedule(tx, agent, TurnTrigger.FOLLOW_UP)
    tx.agent_ledger(LedgerAction.FOLLOW_UP, agent, turn_id=row.id, epoch=agent.epoch)
    return True


def to_idle(agent: AgentRow) -> None:
    """A stop is done: the agent is ``idle``, with no wait suspended, no turn scheduled and no
    stop pending."""
    move(agent, AgentState.IDLE)
    agent.suspended = False
    agent.pending_trigger = None
    agent.stop_requested = False


def cancel_own_questions(tx: Tx, agent: AgentRow, now: Any) -> None:
    session = tx.session
    for own in session.scalars(
        sa.select(QuestionRow).where(
            QuestionRow.asker_agent_id == agent.id, QuestionRow.status == QuestionStatus.OPEN
        )
    ):
        close_question(own, QuestionStatus.CANCELLED, stop_waiting=True)
