"""A team's history in windows of time: what the swimlane page and ``agent-router web`` draw.

:func:`window` reads, in the caller's one session, a page of the team's agents (its lanes and
the rows of its table, from the same snapshot) and what happened to them between two times:
their turns, the model calls and tool calls inside those turns, the messages they sent or
received (routed or refused), and their questions (an ask and its answer, or a wait for a
sub-agent's report, with both times), and who in the whole team is blocked now, on whom, since
when. It also counts the whole
team's messages and turns by time bucket (the overview strip, and the idle gaps the page
compresses). Every part is bounded by the query (a page of agents, a window, a cap on messages),
never by the size of the team, so that a team of tens of thousands of agents reads as fast as a
small one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

from agent_router import errors
from agent_router.domain import (
    AgentState,
    AgentStatus,
    LedgerAction,
    MessageStatus,
    MessageSubtype,
    QuestionKind,
    QuestionStatus,
    RouteOutcome,
    TurnRecord,
)
from agent_router.store import refusals, values
from agent_router.store.models import (
    AgentRow,
    LedgerRow,
    MessageRow,
    QuestionRow,
    TeamRow,
    TranscriptEntryRow,
    TurnRow,
    utcnow,
)
from agent_router.validation import EXTERNAL_PREFIX, EXTERNAL_SENDERS

#: Characters of a message's content that come with its arrow (the rest is read on demand).
PREVIEW_CHARS = 60
#: How far a ledger event's time may stray from its row's (a turn's start and end, a message's
#: creation): each is written in the same transaction, a clock read or two apart.
SLACK = timedelta(seconds=5)
#: Ledger actions drawn as arrows: a routed message, and a send the router refused.
ARROW_ACTIONS = (LedgerAction.ROUTE, LedgerAction.SEND_REJECTED)


@dataclass(frozen=True, kw_only=True)
class TimelineQuery:
    """Which part of a team's history to read. Times are seconds since the team was created."""

    start: float = 0.0
    end: float | None = None  # None: up to now
    offset: int = 0  # agents (lanes) skipped, in the order of their ids
    limit: int | None = None  # most agents returned; None: all
    name: str | None = None  # only agents whose display name contains this
    focus: str | None = None  # only this agent and those it ever exchanged messages with
    max_arrows: int | None = None  # most messages returned; the window is then cut short
    max_scan: int | None = None  # most ledger events read; the window is then cut short


@dataclass(frozen=True, kw_only=True)
class Arrow:
    """A message as the timeline draws it: routed (with its outcome), or refused."""

    ledger_id: int
    at: datetime
    sender: str
    sender_is_agent: bool  # False: the user, the system or a background job
    target: str
    type: str  # a MessageType value; for a refused send, the type it asked for
    subtype: MessageSubtype | None
    outcome: RouteOutcome
    message_id: int | None  # None: refused, nothing stored
    question_id: int | None
    wake: bool | None
    status: MessageStatus | None
    preview: str  # the content's first characters; for a refused send, why it was refused


@dataclass(frozen=True, kw_only=True)
class Wait:
    """A question: an ask and its answer, or the lead's wait for a sub-agent's report."""

    question_id: int
    kind: QuestionKind
    asker: str
    target: str
    status: QuestionStatus
    asked_at: datetime
    closed_at: datetime | None  # None: still open
    answer_message_id: int | None


@dataclass(frozen=True, kw_only=True)
class Call:
    """A model call or a tool call inside a turn: it ended at ``ended_at`` (its ``model_call``
    event, or its result entering the transcript) after ``seconds`` (``None``: not recorded,
    written by a release that did not keep it)."""

    kind: str  # "model" or "tool"
    agent: str
    turn_id: int | None
    ended_at: datetime
    seconds: float | None
    name: str  # the model, or the tool
    detail: dict[str, Any]  # tokens, cost, unpriced, saturated; server, outcome


@dataclass(frozen=True, kw_only=True)
class Blocked:
    """An agent of the team blocked now: in an ask, or the lead waiting for a sub-agent's
    report."""

    question_id: int
    kind: QuestionKind
    asker: str
    target: str
    since: datetime
    deadline: datetime | None
    suspended: bool  # no worker held: the answer resumes it with a continuation turn


#: The most agents the "now" part names (the count says how many there are in all).
MAX_BLOCKED = 50
#: The most calls a window returns; the rest of the window still has its turns.
MAX_CALLS = 20_000


@dataclass(frozen=True, kw_only=True)
class TimelineWindow:
    team_id: int
    started_at: datetime  # the team's creation: time 0 of the query's seconds
    last_event_id: int  # the latest ledger event's id (0: none)
    last_event_at: datetime | None
    states: dict[AgentState, int]  # the whole team's agents by state
    agents_total: int  # the team's agents
    lanes_total: int  # those the name filter or the focus keeps
    lanes: list[AgentStatus]  # the page's agents, by id
    turns: list[TurnRecord]  # of the page's agents, overlapping the window
    arrows: list[Arrow]  # to or from the page's agents, in the window, in time order
    waits: list[Wait]  # asked by or of the page's agents, overlapping the window
    calls: list[Call]  # model calls and tool calls of the page's agents ending in the window
    blocked: list[Blocked]  # the team's agents blocked now, the longest first
    blocked_total: int
    now: datetime  # the time of this read: how long the blocked have waited, so far
    complete_until: datetime | None  # the messages are cut at max_arrows: complete up to here


@dataclass(frozen=True, kw_only=True)
class Activity:
    """A team's whole history, counted by time bucket: the overview of its timeline."""

    team_id: int
    started_at: datetime
    bucket_seconds: float
    #: (bucket, message type, messages) and (bucket, None, turn starts and ends).
    counts: list[tuple[int, str | None, int]]
    #: (first bucket, last bucket) of model calls and tool calls: busy, though they hold no
    #: message (a long model call is work, not an idle gap).
    calls: list[tuple[int, int]]
    outside: list[str]  # senders that are not agents (user, system, job:...), by name


@dataclass(frozen=True, kw_only=True)
class TeamSummary:
    team_id: int
    created_at: datetime
    states: dict[AgentState, int]  # its agents by state
    last_event_at: datetime | None


def teams(session: Session, *, offset: int, limit: int) -> tuple[int, list[TeamSummary]]:
    """How many teams there are, and a page of them by id with their agents by state and
    their latest event's time."""
    total = session.scalar(sa.select(sa.func.count()).select_from(TeamRow)) or 0
    latest = (
        sa.select(LedgerRow.created_at)
        .where(LedgerRow.team_id == TeamRow.id)
        .order_by(LedgerRow.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    rows = session.execute(
        sa.select(TeamRow.id, TeamRow.created_at, latest)
        .order_by(TeamRow.id)
        .offset(offset)
        .limit(limit)
    ).all()
    states: dict[int, dict[AgentState, int]] = {}
    if rows:
        for team_id, state, n in session.execute(
            sa.select(AgentRow.team_id, AgentRow.state, sa.func.count())
            .where(AgentRow.team_id.in_([r[0] for r in rows]))
            .group_by(AgentRow.team_id, AgentRow.state)
        ):
            states.setdefault(team_id, {})[AgentState(state)] = n
    return total, [
        TeamSummary(team_id=i, created_at=at, states=states.get(i, {}), last_event_at=last)
        for i, at, last in rows
    ]


class _SecondsSince(FunctionElement[float]):
    """Seconds from a time parameter to a time column (a float)."""

    type = sa.Float()
    inherit_cache = True


@compiles(_SecondsSince, "postgresql")
def _seconds_since_pg(element: _SecondsSince, compiler: Any, **kw: Any) -> str:
    column, origin = list(element.clauses)
    return (
        f"EXTRACT(EPOCH FROM ({compiler.process(column, **kw)} - "
        f"CAST({compiler.process(origin, **kw)} AS timestamp)))"
    )


@compiles(_SecondsSince, "sqlite")
def _seconds_since_sqlite(element: _SecondsSince, compiler: Any, **kw: Any) -> str:
    column, origin = list(element.clauses)
    return (
        f"((julianday({compiler.process(column, **kw)}) - "
        f"julianday({compiler.process(origin, **kw)})) * 86400.0)"
    )


#: Agents named to a statement: their ids, or the query of a page of them.
AgentIds = list[int] | sa.Select[int]
#: The most ids a statement lists; a larger page is named by its query.
MAX_LISTED_IDS = 10_000

#: The status rows of a page of agents (``Reads``' own: mailbox, questions, running turn).
Statuses = Callable[[Session, Sequence[AgentRow], Any], list[AgentStatus]]


def window(
    session: Session, team_id: int, query: TimelineQuery, *, statuses: Statuses
) -> TimelineWindow:
    """The part of the team's history ``query`` names, read in ``session``: on PostgreSQL as
    one REPEATABLE READ snapshot (SQLite's transaction holds the write lock), so that an agent's
    row in the table, its lane and its turns all show the same moment."""
    if session.get_bind().dialect.name == "postgresql":
        # psycopg names the level in this transaction's BEGIN: no session state is left behind
        # (a transaction-pooling PgBouncer hands the connection on).
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    team = session.get(TeamRow, team_id)
    if team is None:
        raise errors.UnknownTeamError(f"unknown team {team_id}")
    t0 = team.created_at
    start = t0 + timedelta(seconds=max(0.0, query.start))
    end = None if query.end is None else t0 + timedelta(seconds=max(query.start, query.end))
    last = session.execute(_latest(team_id, LedgerRow.id, LedgerRow.created_at)).first()
    states = {
        AgentState(state): n
        for state, n in session.execute(
            sa.select(AgentRow.state, sa.func.count())
            .where(AgentRow.team_id == team_id)
            .group_by(AgentRow.state)
        )
    }
    focus = _focus_id(session, team_id, query)
    filters = _lane_filter(team_id, query, focus)
    kept = [AgentRow.team_id == team_id, *filters]
    total = (session.scalar(sa.select(sa.func.count()).where(*kept)) or 0) if filters else None
    rows = session.scalars(
        sa.select(AgentRow)
        .where(*kept)
        .order_by(AgentRow.id)
        .offset(query.offset)
        .limit(query.limit)
    ).all()
    # The hubs, the lead (unless the name filter leaves it out) and the focused agent, are on
    # every page, first: most of a team's messages are to or from them.
    # The lead is the team's first agent: read in the order of ids, it is found at once.
    lead = (
        None
        if query.name
        else session.scalars(
            sa.select(AgentRow)
            .where(AgentRow.team_id == team_id, AgentRow.is_lead)
            .order_by(AgentRow.id)
            .limit(1)
        ).first()
    )
    focused = session.get(AgentRow, focus) if focus is not None else None
    hubs = sorted({a.id: a for a in (lead, focused) if a is not None}.values(), key=lambda a: a.id)
    hub_ids = [h.id for h in hubs]
    on_page = {row.id for row in rows}
    own: AgentIds = [r.id for r in rows if r.id not in hub_ids]
    rows = [*(h for h in hubs if h.id not in on_page), *rows]
    # A page of many agents (the whole of a large team) is named to the statements below by
    # the query that reads it, not by its ids: a statement holds at most 65,535 parameters.
    ids: AgentIds = [r.id for r in rows]
    if len(rows) > MAX_LISTED_IDS:
        page = (
            sa.select(AgentRow.id)
            .where(*kept)
            .order_by(AgentRow.id)
            .offset(query.offset)
            .limit(query.limit)
            .scalar_subquery()
        )
        ids = sa.select(AgentRow.id).where(sa.or_(AgentRow.id.in_(page), AgentRow.id.in_(hub_ids)))
        own = sa.select(AgentRow.id).where(AgentRow.id.in_(page), AgentRow.id.not_in(hub_ids))
    blocked, blocked_total = _blocked(session, team_id)
    whole = query.limit is None and query.offset == 0 and not query.name and focus is None
    arrows, complete_until = _arrows(
        session,
        team_id,
        query,
        lanes=None if whole else (ids, own, hub_ids),
        focus=focus,
        start=start,
        end=end,
    )
    return TimelineWindow(
        team_id=team_id,
        started_at=t0,
        last_event_id=last.id if last else 0,
        last_event_at=last.created_at if last else None,
        states=states,
        agents_total=sum(states.values()),
        lanes_total=sum(states.values()) if total is None else total,
        lanes=statuses(session, rows, sa.select(AgentRow.id).where(AgentRow.id.in_(ids)))
        if rows
        else [],
        turns=_turns(session, ids, start, end),
        arrows=arrows,
        waits=_waits(session, team_id, ids if focus is None else [focus], start, end),
        # The calls end where the messages do: a piece of the window holds both, so that the
        # next piece reads the calls after it (and the read stays within max_scan events).
        calls=_calls(
            session,
            team_id,
            {r.id: r.display_name for r in rows},
            ids=ids,
            start=start,
            end=end if complete_until is None else complete_until,
        ),
        blocked=blocked,
        blocked_total=blocked_total,
        now=utcnow(),
        complete_until=complete_until,
    )


def latest_event(session: Session, team_id: int) -> int:
    """The id of the team's latest event (0: none yet)."""
    return int(session.scalar(_latest(team_id, LedgerRow.id)) or 0)


def _latest(team_id: int, *columns: Any) -> sa.Select[Any]:
    """``columns`` of the team's latest ledger event (the end of its time index)."""
    return (
        sa.select(*columns)
        .where(LedgerRow.team_id == team_id)
        .order_by(LedgerRow.created_at.desc(), LedgerRow.id.desc())
        .limit(1)
    )


def _lane_filter(
    team_id: int, query: TimelineQuery, focus: int | None
) -> list[ColumnElement[bool]]:
    """What keeps an agent of the team in the lanes: its name, or being the focused agent or
    one it ever exchanged messages with (the same lanes in every window, and in every piece of
    one)."""
    kept: list[ColumnElement[bool]] = []
    if query.name:
        kept.append(AgentRow.display_name.icontains(query.name, autoescape=True))
    if focus is not None:
        partners: Any = sa.union(
            sa.select(MessageRow.target_agent_id).where(
                MessageRow.team_id == team_id, MessageRow.source_agent_id == focus
            ),
            sa.select(MessageRow.source_agent_id).where(
                MessageRow.team_id == team_id,
                MessageRow.target_agent_id == focus,
                MessageRow.source_agent_id.is_not(None),
            ),
        )
        kept.append(sa.or_(AgentRow.id == focus, AgentRow.id.in_(partners)))
    return kept


def _focus_id(session: Session, team_id: int, query: TimelineQuery) -> int | None:
    if query.focus is None:
        return None
    focus = session.scalar(
        sa.select(AgentRow.id).where(
            AgentRow.team_id == team_id, AgentRow.display_name == query.focus
        )
    )
    if focus is None:
        raise errors.UnknownAgentError(f"unknown agent {query.focus!r} in team {team_id}")
    return focus


def _during(column: Any, start: datetime, end: datetime | None) -> list[ColumnElement[bool]]:
    return [column >= start] + ([column <= end] if end is not None else [])


def _arrows(
    session: Session,
    team_id: int,
    query: TimelineQuery,
    *,
    lanes: tuple[AgentIds, AgentIds, list[int]] | None,
    focus: int | None,
    start: datetime,
    end: datetime | None,
) -> tuple[list[Arrow], datetime | None]:
    """Messages routed or refused in the window of the lanes ``lanes`` (``None``: all; else
    every lane's agent, the page's own and its hubs, the lead and the focused agent), and to
    or from ``focus`` if given, in time order: those with an end among the page's own agents
    (the other end may be on another page: a stub), and those between hubs or from outside
    senders to a hub. A hub's messages to agents of other pages are theirs: the lead of a
    team of 70,000 would otherwise bring every message to every page. The
    window is read at most ``max_scan`` ledger events deep and cut at ``max_arrows`` messages:
    then also the time up to which the messages are complete, where the next window starts."""
    complete_until, window_end = None, end
    if query.max_scan is not None:
        # The time of the max_scan-th event of the window (a range of the team's time index,
        # whatever the team's size); at least a millisecond past the start, so that the next
        # window always moves on.
        boundary = session.scalar(
            sa.select(LedgerRow.created_at)
            .where(LedgerRow.team_id == team_id, *_during(LedgerRow.created_at, start, end))
            .order_by(LedgerRow.created_at, LedgerRow.id)
            .offset(query.max_scan - 1)
            .limit(1)
        )
        if boundary is not None and (window_end is None or boundary < window_end):
            end = complete_until = max(boundary, start + timedelta(milliseconds=1))
    target = sa.orm.aliased(AgentRow)
    stmt = (
        sa.select(
            LedgerRow.id,
            LedgerRow.created_at,
            LedgerRow.action,
            LedgerRow.outcome,
            # Only a refusal's detail is read: it names the sender and the target.
            sa.case(
                (LedgerRow.action == LedgerAction.SEND_REJECTED, LedgerRow.detail),
                else_=sa.null(),
            ),
            LedgerRow.message_id,
            target.display_name,
            MessageRow.source_name,
            MessageRow.source_agent_id,
            MessageRow.type,
            MessageRow.subtype,
            MessageRow.question_id,
            MessageRow.wake,
            MessageRow.status,
            sa.func.substr(MessageRow.content, 1, PREVIEW_CHARS),
        )
        .outerjoin(MessageRow, MessageRow.id == LedgerRow.message_id)
        .outerjoin(target, target.id == LedgerRow.agent_id)
        .where(
            LedgerRow.team_id == team_id,
            LedgerRow.action.in_(ARROW_ACTIONS),
            *_during(LedgerRow.created_at, start, end),
        )
        .order_by(LedgerRow.created_at, LedgerRow.id)
    )
    if lanes is not None:
        ids, own, hubs = lanes
        # A refusal names its sender only in its detail: those of the window are kept here
        # and sorted out below, by name.
        routed = sa.or_(
            LedgerRow.agent_id.in_(own),
            MessageRow.source_agent_id.in_(own),
            sa.and_(
                LedgerRow.agent_id.in_(hubs),
                sa.or_(MessageRow.source_agent_id.in_(hubs), MessageRow.source_agent_id.is_(None)),
            ),
        )
        if focus is not None:
            routed = sa.and_(
                routed,
                sa.or_(LedgerRow.agent_id == focus, MessageRow.source_agent_id == focus),
            )
        stmt = stmt.where(sa.or_(routed, LedgerRow.action == LedgerAction.SEND_REJECTED))
    limit = query.max_arrows
    rows = session.execute(stmt if limit is None else stmt.limit(limit + 1)).all()
    if limit is not None and len(rows) > limit:
        # Cut after the last message kept, or a millisecond past the start, whichever is later,
        # with every message of that time: messages written by one transaction share a time,
        # and the next window, starting there, must move on.
        complete_until = max(rows[limit - 1][1], start + timedelta(milliseconds=1))
        rows = session.execute(stmt.where(LedgerRow.created_at <= complete_until)).all()
        if window_end is not None and complete_until >= window_end:
            complete_until = None  # that is the whole window
    arrows = [_arrow(row) for row in rows]
    if lanes is not None:
        names = dict(
            session.execute(
                sa.select(AgentRow.id, AgentRow.display_name).where(AgentRow.id.in_(ids))
            ).all()
        )
        shown = set(names.values())
        about = names.get(focus) if focus is not None else None
        arrows = [
            a
            for a in arrows
            if a.message_id is not None
            or (
                (a.sender in shown or a.target in shown)
                and (about is None or about in (a.sender, a.target))
            )
        ]
    return arrows, complete_until


def _arrow(row: Any) -> Arrow:
    """The arrow of one row of :func:`_arrows`' statement."""
    (
        ledger_id,
        at,
        action,
        outcome,
        detail,
        message_id,
        target,
        sender,
        sender_id,
        msg_type,
        subtype,
        question_id,
        wake,
        status,
        preview,
    ) = row
    refused = action is LedgerAction.SEND_REJECTED
    detail = detail or {}
    sender = str(sender if sender is not None else detail.get("sender", "?"))
    return Arrow(
        ledger_id=ledger_id,
        at=at,
        sender=sender,
        sender_is_agent=sender_id is not None
        if not refused
        else not (sender in EXTERNAL_SENDERS or sender.startswith(EXTERNAL_PREFIX)),
        target=str(detail.get("to") or target or "?") if refused else str(target or "?"),
        type=msg_type.value if msg_type is not None else str(detail.get("type") or "message"),
        subtype=subtype,
        outcome=RouteOutcome.REJECTED if refused or outcome is None else outcome,
        message_id=None if refused else message_id,
        question_id=question_id,
        wake=wake,
        status=status,
        preview=str(detail.get("error") or refusals.sentence(detail) or detail.get("reason") or "")
        if refused
        else preview or "",
    )


def _turns(
    session: Session, ids: AgentIds, start: datetime, end: datetime | None
) -> list[TurnRecord]:
    if isinstance(ids, list) and not ids:
        return []
    stmt = sa.select(TurnRow).where(
        TurnRow.agent_id.in_(ids),
        sa.or_(TurnRow.ended_at.is_(None), TurnRow.ended_at >= start),
        *([TurnRow.started_at <= end] if end is not None else []),
    )
    return [values.turn(r) for r in session.scalars(stmt.order_by(TurnRow.started_at, TurnRow.id))]


def _waits(
    session: Session, team_id: int, ids: AgentIds, start: datetime, end: datetime | None
) -> list[Wait]:
    if isinstance(ids, list) and not ids:
        return []
    asker = sa.orm.aliased(AgentRow)
    target = sa.orm.aliased(AgentRow)
    rows = session.execute(
        sa.select(QuestionRow, asker.display_name, target.display_name)
        .join(asker, asker.id == QuestionRow.asker_agent_id)
        .join(target, target.id == QuestionRow.target_agent_id)
        .where(
            QuestionRow.team_id == team_id,
            sa.or_(QuestionRow.asker_agent_id.in_(ids), QuestionRow.target_agent_id.in_(ids)),
            sa.or_(QuestionRow.closed_at.is_(None), QuestionRow.closed_at >= start),
            *([QuestionRow.created_at <= end] if end is not None else []),
        )
        .order_by(QuestionRow.id)
    ).all()
    return [
        Wait(
            question_id=q.id,
            kind=q.kind,
            asker=asker_name,
            target=target_name,
            status=q.status,
            asked_at=q.created_at,
            closed_at=q.closed_at,
            answer_message_id=q.answer_message_id,
        )
        for q, asker_name, target_name in rows
    ]


def _calls(
    session: Session,
    team_id: int,
    names: dict[int, str],
    *,
    ids: AgentIds,
    start: datetime,
    end: datetime | None,
) -> list[Call]:
    """The model calls (``model_call`` events) and tool calls (tool results kept with how they
    ran) of the agents ``ids`` ending in the window, in time order."""
    if not names:
        return []
    calls = [
        Call(
            kind="model",
            agent=names.get(agent_id, "?"),
            turn_id=turn_id,
            ended_at=at,
            seconds=_seconds(detail.get("ms")),
            name=str(detail.get("model") or "model"),
            detail={k: v for k, v in detail.items() if k not in ("ms", "model", "agent_id")},
        )
        for at, agent_id, turn_id, detail in session.execute(
            sa.select(LedgerRow.created_at, LedgerRow.agent_id, LedgerRow.turn_id, LedgerRow.detail)
            .where(
                LedgerRow.team_id == team_id,
                LedgerRow.action == LedgerAction.MODEL_CALL,
                LedgerRow.agent_id.in_(ids),
                *_during(LedgerRow.created_at, start, end),
            )
            .order_by(LedgerRow.created_at, LedgerRow.id)
            .limit(MAX_CALLS)
        )
    ]
    for at, agent_id, turn_id, meta in session.execute(
        sa.select(
            TranscriptEntryRow.created_at,
            TranscriptEntryRow.agent_id,
            TranscriptEntryRow.turn_id,
            TranscriptEntryRow.meta,
        )
        .where(
            TranscriptEntryRow.agent_id.in_(ids),
            TranscriptEntryRow.role == "tool",
            *_during(TranscriptEntryRow.created_at, start, end),
        )
        .order_by(TranscriptEntryRow.created_at, TranscriptEntryRow.id)
        .limit(MAX_CALLS)
    ):
        if not isinstance(meta, dict) or "ms" not in meta:
            continue  # a result written by the router (an ask's answer, a cancelled call)
        calls.append(
            Call(
                kind="tool",
                agent=names.get(agent_id, "?"),
                turn_id=turn_id,
                ended_at=at,
                seconds=_seconds(meta.get("ms")),
                name=str(meta.get("tool") or "tool"),
                detail={"server": meta.get("server"), "outcome": meta.get("outcome")},
            )
        )
    return sorted(calls, key=lambda c: c.ended_at)


def _seconds(ms: Any) -> float | None:
    return ms / 1000 if isinstance(ms, int | float) and not isinstance(ms, bool) else None


def _blocked(session: Session, team_id: int) -> tuple[list[Blocked], int]:
    """The team's open questions (its blocked agents), the longest waiting first, at most
    :data:`MAX_BLOCKED` of them, and how many there are."""
    asker = sa.orm.aliased(AgentRow)
    target = sa.orm.aliased(AgentRow)
    open_ = [QuestionRow.team_id == team_id, QuestionRow.status == QuestionStatus.OPEN]
    total = session.scalar(sa.select(sa.func.count()).where(*open_)) or 0
    rows = session.execute(
        sa.select(QuestionRow, asker.display_name, asker.suspended, target.display_name)
        .join(asker, asker.id == QuestionRow.asker_agent_id)
        .join(target, target.id == QuestionRow.target_agent_id)
        .where(*open_)
        .order_by(QuestionRow.created_at, QuestionRow.id)
        .limit(MAX_BLOCKED)
    ).all()
    return [
        Blocked(
            question_id=q.id,
            kind=q.kind,
            asker=asker_name,
            target=target_name,
            since=q.created_at,
            deadline=q.deadline,
            suspended=bool(suspended),
        )
        for q, asker_name, suspended, target_name in rows
    ], total


def _outside(session: Session, team_id: int) -> list[str]:
    return sorted(
        session.scalars(
            sa.select(MessageRow.source_name)
            .where(MessageRow.team_id == team_id, MessageRow.source_agent_id.is_(None))
            .distinct()
        )
    )


def activity(session: Session, team_id: int, buckets: int) -> Activity:
    """The team's messages by type, and its turns' starts and ends, counted in ``buckets``
    buckets from its creation to its latest event."""
    team = session.get(TeamRow, team_id)
    if team is None:
        raise errors.UnknownTeamError(f"unknown team {team_id}")
    t0 = team.created_at
    last = session.scalar(_latest(team_id, LedgerRow.created_at))
    span = (last - t0).total_seconds() if last is not None else 0.0
    width = max(span, 0.001) / max(buckets, 1)
    return Activity(
        team_id=team_id,
        started_at=t0,
        bucket_seconds=width,
        counts=_counts(session, team_id, t0, width),
        calls=_call_buckets(session, team_id, t0, width),
        outside=_outside(session, team_id),
    )


def _counts(
    session: Session, team_id: int, t0: datetime, width: float
) -> list[tuple[int, str | None, int]]:
    counts: dict[tuple[int, str | None], int] = {}

    def add(stmt: sa.Executable) -> None:
        for bucket, kind, n in session.execute(stmt):
            key = (max(0, int(bucket)), None if kind is None else str(kind))
            counts[key] = counts.get(key, 0) + int(n)

    message_bucket = sa.cast(_SecondsSince(MessageRow.created_at, t0) / width, sa.Integer)
    add(
        sa.select(message_bucket, MessageRow.type, sa.func.count())
        .where(MessageRow.team_id == team_id)
        .group_by(message_bucket, MessageRow.type)
    )
    for column in (TurnRow.started_at, TurnRow.ended_at):
        turn_bucket = sa.cast(_SecondsSince(column, t0) / width, sa.Integer)
        add(
            sa.select(turn_bucket, sa.null(), sa.func.count())
            .where(TurnRow.team_id == team_id, column.is_not(None))
            .group_by(turn_bucket)
        )
    return sorted(((b, k, n) for (b, k), n in counts.items()), key=lambda r: (r[0], r[1] or ""))


def _call_buckets(
    session: Session, team_id: int, t0: datetime, width: float
) -> list[tuple[int, int]]:
    """The (first, last) buckets of the team's model calls and tool calls that recorded how
    long they took, each pair once."""
    model_ms = LedgerRow.detail["ms"].as_float()
    model_end = _SecondsSince(LedgerRow.created_at, t0)
    tool_ms = TranscriptEntryRow.meta["ms"].as_float()
    tool_end = _SecondsSince(TranscriptEntryRow.created_at, t0)
    found: set[tuple[int, int]] = set()
    for stmt in (
        sa.select(
            sa.cast((model_end - model_ms / 1000.0) / width, sa.Integer),
            sa.cast(model_end / width, sa.Integer),
        )
        .where(
            LedgerRow.team_id == team_id,
            LedgerRow.action == LedgerAction.MODEL_CALL,
            model_ms.is_not(None),
        )
        .distinct(),
        sa.select(
            sa.cast((tool_end - tool_ms / 1000.0) / width, sa.Integer),
            sa.cast(tool_end / width, sa.Integer),
        )
        .join(AgentRow, AgentRow.id == TranscriptEntryRow.agent_id)
        .where(AgentRow.team_id == team_id, TranscriptEntryRow.role == "tool", tool_ms.is_not(None))
        .distinct(),
    ):
        for first, last in session.execute(stmt):
            found.add((max(0, int(first)), max(0, int(last))))
    return sorted(found)
