"""The operator's reads: ``status``, ``ledger``, ``inspect message|agent``."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agent_router import errors
from agent_router import validation as check
from agent_router.domain import AgentState, AgentStatus, Budget, RouteOutcome, TokenUsage
from agent_router.ops.cli import failures
from agent_router.ops.cli.budgets import print_budget
from agent_router.ops.cli.common import (
    DatabaseUrlOption,
    JsonLinesOption,
    JsonOption,
    TeamArgument,
    _one_line_errors,
    _render,
    _router,
    _store,
    app,
    team_number,
)
from agent_router.ops.explain import LedgerTail
from agent_router.store import Store, utcnow

#: How often ``ledger --follow`` reads new events.
FOLLOW_POLL_SECONDS = 0.5


def _lease_text(expires: datetime | None, now: datetime) -> str:
    if expires is None:
        return "-"
    left = (expires - now).total_seconds()
    return f"{left:.0f}s" if left >= 0 else "expired"


def _state_text(status: AgentStatus) -> str:
    """The state as the table shows it: a waiting agent is ``blocked`` (in a worker) or
    ``suspended`` (no worker held), so that the column stays narrow."""
    agent = status.agent
    if agent.state is AgentState.WAITING:
        return "suspended" if agent.suspended else "blocked"
    return agent.state.value


def _ids_text(ids: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _team(team: int) -> int:
    """A team id from the command line, checked like the library's."""
    return check.row_id(team, "team", errors.UnknownTeamError)


@app.command()
@_one_line_errors
def status(  # noqa: PLR0917 - typer options
    team: Annotated[
        int | None,
        typer.Argument(
            envvar="AGENT_ROUTER_TEAM",
            help="Team id; all teams when omitted.",
            parser=team_number,
            metavar="[TEAM]",
        ),
    ] = None,
    state: Annotated[
        list[AgentState] | None,
        typer.Option(
            "--state", envvar="AGENT_ROUTER_STATE", help="Only agents in this state (repeatable)."
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option(envvar="AGENT_ROUTER_LIMIT", help="Agents per page.", min=1)
    ] = 200,
    after: Annotated[
        int,
        typer.Option(
            envvar="AGENT_ROUTER_AFTER", help="The next page: agents with ids above this.", min=0
        ),
    ] = 0,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
    team_option: Annotated[
        int | None,
        typer.Option(
            "--team",
            envvar="AGENT_ROUTER_TEAM",
            help="The team id, as an option (the same as TEAM).",
            min=0,
        ),
    ] = None,
) -> None:
    """Agents of a team (or of all teams), a page at a time by agent id: state (a waiting
    agent is blocked, in a worker, or suspended, holding none), epoch, mailbox depth (mail), the
    questions they asked and those they are to answer, their running turn and the seconds left
    on its lease, and why its last turn failed when it did; the model calls, tokens and cost of
    each agent and team; with a team, its budgets. A full page ends with the --after that shows
    the next."""
    if team_option is not None:
        if team is not None and team != team_option:
            raise typer.BadParameter(f"TEAM {team} and --team {team_option} differ")
        team = team_option
    check.integer(after, "--after", minimum=0, maximum=check.MAX_ID)
    with _store(database_url) as store:
        statuses = store.reads.agent_statuses(
            None if team is None else _team(team),
            states=state or (),
            after_id=after,
            limit=check.integer(limit, "--limit"),
        )
        usage, budget = _usage_of(store, statuses, team)
    if as_json:
        for s in statuses:
            record = _status_record(s) | _usage_record(usage.get(s.agent.id, TokenUsage()))
            print(json.dumps(record))
        return
    console = Console(highlight=False)
    if not statuses:
        console.print("no agents" if team is None else f"team {team} has no agents")
    else:
        # One table, whatever the number of teams on the page: the agents of many teams
        # interleave by id, and a table per team would print one per agent.
        console.print(_status_table(team, statuses))
        for s in statuses:
            if s.last_error:
                # Why an agent's last turn failed (a model not configured, a model error).
                who = s.agent.display_name + ("" if team else f" (team {s.agent.team_id})")
                console.print(
                    f"{who}: last turn failed: {s.last_error[:300]}", soft_wrap=True, markup=False
                )
        console.print(_usage_line([usage.get(s.agent.id, TokenUsage()) for s in statuses]))
    if len(statuses) == limit:
        console.print(f"more: --after {statuses[-1].agent.id}")
    if budget is not None:
        print_budget(console, budget)


def _usage_of(
    store: Store, statuses: list[AgentStatus], team: int | None
) -> tuple[dict[int, TokenUsage], Budget | None]:
    """Usage per agent id of the agents listed, and the budget of the team asked for."""
    if not statuses:
        return {}, None
    usage = store.reads.usage_of_agents(statuses[0].agent.id, statuses[-1].agent.id)
    return usage, store.budget(team) if team is not None else None


def _usage_line(usages: list[TokenUsage]) -> str:
    calls = sum(u.model_calls for u in usages)
    tokens = sum(u.total_tokens for u in usages)
    cost = sum(u.cost_usd for u in usages)
    return f"usage: {calls} model calls, {tokens} tokens, ${cost:.4f}"


def _print_usage(console: Console, per_turn: dict[int, TokenUsage]) -> None:
    fields = [f.name for f in dataclasses.fields(TokenUsage)]
    total = TokenUsage(**{f: sum(getattr(u, f) for u in per_turn.values()) for f in fields})
    console.print(
        f"usage: {total.model_calls} model calls, {total.prompt_tokens} prompt "
        f"({total.cached_tokens} cached) + {total.completion_tokens} completion tokens, "
        f"${total.cost_usd:.6f}"
    )


def _turn_usage(turn_id: int | None, u: TokenUsage) -> str:
    return (
        f"turn {turn_id}: {u.model_calls} model calls, {u.total_tokens} tokens, ${u.cost_usd:.6f}"
    )


def _usage_record(usage: TokenUsage) -> dict[str, Any]:
    """An agent's usage in ``status --json``: every field of :class:`TokenUsage`."""
    return dataclasses.asdict(usage)


def _status_record(s: AgentStatus) -> dict[str, Any]:
    """One agent's status as a JSON object (``status --json``)."""
    return {
        "team_id": s.agent.team_id,
        "agent_id": s.agent.id,
        "agent": s.agent.display_name,
        "role": s.agent.role,
        "state": s.agent.state.value,
        "suspended": s.agent.suspended,
        "epoch": s.agent.epoch,
        "mailbox_depth": s.agent.mailbox_depth,
        "open_questions": list(s.open_questions),
        "questions_to_answer": list(s.questions_to_answer),
        "turn_id": s.turn_id,
        "lease_expires_at": s.lease_expires_at.isoformat() + "Z" if s.lease_expires_at else None,
        "last_error": s.last_error,
    }


def _status_table(team_id: int | None, statuses: list[AgentStatus]) -> Table:
    """One team's agents (all teams': ``None``, with a team column) in at most 80 columns: no
    column is cut, and a display name of 21 characters (``Full-Stack Engineer_1``) fits on its
    line."""
    now = utcnow()
    table = Table(
        title="all teams" if team_id is None else f"team {team_id}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=0,  # the box puts one space between columns
    )
    if team_id is None:
        table.add_column("team", justify="right", no_wrap=True)
    table.add_column("agent", overflow="fold", min_width=21)
    table.add_column("state", no_wrap=True)
    for column in ("epoch", "mail", "asked", "answers", "turn", "lease"):
        table.add_column(
            column,
            justify="right" if column in ("epoch", "mail", "turn") else "left",
            overflow="fold",
        )
    for s in statuses:
        table.add_row(
            *([str(s.agent.team_id)] if team_id is None else []),
            s.agent.display_name,
            Text(_state_text(s), style=_STATE_STYLES.get(s.agent.state, "")),
            str(s.agent.epoch),
            str(s.agent.mailbox_depth),
            _ids_text(s.open_questions),
            _ids_text(s.questions_to_answer),
            str(s.turn_id) if s.turn_id is not None else "-",
            _lease_text(s.lease_expires_at, now),
        )
    return table


_STATE_STYLES = {
    AgentState.RUNNING: "bold green",
    AgentState.WAITING: "bold blue",
    AgentState.SCHEDULED: "cyan",
    AgentState.COMPLETED: "yellow",
    AgentState.TERMINATED: "red",
}


def _ledger_filter(name: str, help: str) -> Any:
    """A repeatable ``--name`` of ``ledger`` (or AGENT_ROUTER_LEDGER_<NAME>): only the records
    whose ``name`` is one of those given."""
    return typer.Option(f"--{name}", envvar=f"AGENT_ROUTER_LEDGER_{name.upper()}", help=help)


@app.command()
@_one_line_errors
def ledger(  # noqa: PLR0917 - typer options
    team: TeamArgument,
    database_url: DatabaseUrlOption = None,
    as_json: JsonLinesOption = False,
    after: Annotated[
        int, typer.Option(envvar="AGENT_ROUTER_AFTER", help="Only events after this ledger id.")
    ] = 0,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            envvar="AGENT_ROUTER_FOLLOW",
            help="Keep printing new events as they are written (Ctrl-C ends).",
        ),
    ] = False,
    agents: Annotated[
        list[str] | None,
        _ledger_filter("agent", "Only this agent's events (repeat for more agents)."),
    ] = None,
    outcomes: Annotated[
        list[str] | None,
        _ledger_filter(
            "outcome",
            "Only routing events with this outcome, e.g. queued or rejected (repeatable).",
        ),
    ] = None,
) -> None:
    """The team's timeline: routing decisions (with outcomes) and turns, from the ledger (of a
    deleted team: what its deletion dropped that was still owed)."""
    reader_gone = threading.Event()  # stdout was closed (`ledger --follow | head -1`)
    sink = _ledger_sink(
        as_json=as_json, after=after, agents=agents, outcomes=outcomes, follow=follow,
        reader_gone=reader_gone,
    )  # fmt: skip
    _check_choices("outcome", outcomes or [], [o.value for o in RouteOutcome], "the outcomes are")
    with _store(database_url) as store:
        try:
            store.reads.team(_team(team))  # an unknown team is an error, not an empty timeline
        except errors.UnknownTeamError:
            # A deleted team's record of what it dropped (owed_dropped) outlives it.
            if not store.reads.ledger(team):
                raise
        else:
            names = [a.display_name for a in store.reads.agents(team)]
            _check_choices("agent", agents or [], names, f"team {team} has")
    with _router(database_url) as router:
        tail = LedgerTail(router, team, sink, poll=FOLLOW_POLL_SECONDS)
        if not follow:
            tail.flush()
            return
        try:
            tail.start()
            with contextlib.suppress(KeyboardInterrupt):
                reader_gone.wait()
        finally:
            tail.stop()
    if reader_gone.is_set():
        raise BrokenPipeError  # ends quietly (see failures.run_quietly_on_broken_pipe)


def _check_choices(what: str, given: list[str], known: list[str], known_as: str) -> None:
    """A filter that can match nothing is one line and exit status 1, with the value meant
    when one is close (``--outcome queud``), not an empty listing."""
    for value in given:
        if value in known:
            continue
        close = difflib.get_close_matches(value, known, n=1, cutoff=0.6)
        folded = [k for k in known if k.casefold() == value.casefold()]
        guess = next(iter(folded or close), None)
        said = f"no {what} {value!r}" + (f"; did you mean {guess!r}?" if guess else "")
        listed = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
        failures.report(errors.InvalidArgumentError(said), hint=f"{known_as}: {listed or 'none'}")
        raise typer.Exit(failures.EXIT_FAILURE)


def _ledger_sink(
    *,
    as_json: bool,
    after: int,
    agents: list[str] | None,
    outcomes: list[str] | None,
    follow: bool,
    reader_gone: threading.Event,
) -> Callable[[dict[str, Any]], None]:
    """Where the ledger's records go: filtered, then one JSON line or one rendered line each.
    A reader that went away while following sets ``reader_gone`` instead of raising."""
    console = Console(highlight=False)

    def sink(record: dict[str, Any]) -> None:
        if reader_gone.is_set() or record["id"] <= after:
            return
        if (agents and record["agent"] not in agents) or (
            outcomes and record["outcome"] not in outcomes
        ):
            return
        try:
            if as_json:
                print(json.dumps(record, default=str), flush=True)
            else:
                _render(console, record)
        except BrokenPipeError:
            if not follow:
                raise
            reader_gone.set()  # the follower's thread stops printing; the command ends

    return sink


inspect_app = typer.Typer(help="Look at one message or one agent's transcript, with provenance.")
app.add_typer(inspect_app, name="inspect")


@inspect_app.command("message")
@_one_line_errors
def inspect_message(
    message_id: Annotated[int, typer.Argument(help="Message id.")],
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """A message: who sent it to whom, how it was routed, and where it entered a transcript."""
    with _store(database_url) as store:
        msg = store.reads.message(check.row_id(message_id, "message", errors.UnknownMessageError))
        events = store.reads.message_events(message_id)
        entry = next(
            (
                e
                for e in store.reads.transcript_entries(msg.target_agent_id)
                if e["message_id"] == msg.id
            ),
            None,
        )
    record: dict[str, Any] = {
        "id": msg.id,
        "team_id": msg.team_id,
        "from": msg.source_name,
        "to": msg.target_name,
        "type": msg.type.value,
        "subtype": msg.subtype.value if msg.subtype else None,
        "question_id": msg.question_id,
        "wake": msg.wake,
        "seq": msg.seq,
        "dedup_key": msg.dedup_key,
        "created_at": msg.created_at.isoformat() + "Z",
        "outcome": msg.outcome.value,
        "status": msg.status.value,
        "consumed_by_turn": msg.consumed_turn_id,
        "drop_reason": msg.drop_reason,
        "transcript_position": entry["position"] if entry else None,
        "transcript_role": entry["payload"]["role"] if entry else None,
        "content": msg.content,
        "ledger": [
            {"id": e.id, "action": e.action.value, "agent": e.agent_name, "detail": e.detail}
            for e in events
        ],
    }
    if as_json:
        print(json.dumps(record, default=str))
        return
    console = Console(highlight=False)
    for key, value in record.items():
        if key not in ("content", "ledger") and value is not None:
            console.print(Text(f"{key:>20}  ", style="dim") + Text(str(value)))
    for e in events:
        console.print(Text(f"{'ledger':>20}  ", style="dim") + Text(f"#{e.id} {e.action.value}"))
    console.rule("content")
    console.print(Text(msg.content))


@inspect_app.command("agent")
@_one_line_errors
def inspect_agent(
    team: Annotated[int, typer.Argument(help="Team id.", parser=team_number, metavar="TEAM")],
    name: Annotated[str, typer.Argument(help="Display name, e.g. 'UI Operator_1'.")],
    database_url: DatabaseUrlOption = None,
    as_json: JsonLinesOption = False,
    full: Annotated[
        bool,
        typer.Option("--full", envvar="AGENT_ROUTER_FULL", help="Whole contents, not previews."),
    ] = False,
) -> None:
    """An agent's transcript, entry by entry, with each entry's turn and provenance."""
    with _store(database_url) as store:
        agent = store.reads.agent(_team(team), check.name(name))
        entries = store.reads.transcript_entries(agent.id)
        per_turn = store.reads.usage_by_turn(agent.id)
    if as_json:
        for e in entries:
            print(json.dumps(e, default=str))
        return
    console = Console(highlight=False)
    console.print(
        Text(f"{agent.display_name} ", style="bold")
        + Text(
            f"(team {agent.team_id}, {agent.state.value}, epoch {agent.epoch}, "
            f"{agent.mailbox_depth} pending)"
        )
    )
    _print_usage(console, per_turn)
    turn_seen: int | None = None
    for e in entries:
        if e["turn_id"] != turn_seen and e["turn_id"] in per_turn:
            turn_seen = e["turn_id"]
            console.print(Text(_turn_usage(turn_seen, per_turn[turn_seen]), style="dim"))
        _print_entry(console, e, full=full)


def _entry_head(e: dict[str, Any]) -> Text:
    """An entry's first line: position, role, turn, and where it came from."""
    payload = e["payload"]
    head = Text(f"[{e['position']}] ", style="dim")
    head.append(payload.get("role", "?"), style="bold")
    head.append(f"  turn {e['turn_id'] if e['turn_id'] is not None else '-'}", style="dim")
    meta = e["meta"] or {}
    if e["message_id"] is not None:
        head.append(
            f"  <- {meta.get('type')}"
            + (f"/{meta['subtype']}" if meta.get("subtype") else "")
            + f" from {meta.get('from')} (message {e['message_id']}"
            + (f", question {meta['question_id']}" if meta.get("question_id") else "")
            + ")",
            style="cyan",
        )
    if meta.get("synthetic"):
        head.append(f"  synthetic {meta['synthetic']}", style="yellow")
    if payload.get("tool_call_id"):
        head.append(f"  result of {payload['tool_call_id']}", style="magenta")
    return head


def _print_entry(console: Console, e: dict[str, Any], *, full: bool) -> None:
    payload = e["payload"]
    console.print(_entry_head(e))
    for call in payload.get("tool_calls") or []:
        fn = call.get("function", {})
        console.print(Text(f"    call {call.get('id')}: {fn.get('name')}({fn.get('arguments')})"))
    content = payload.get("content")
    if content:
        text = str(content)
        if not full and len(text) > 300:
            text = text[:300] + f"… ({len(text)} chars; --full for all)"
        console.print(Text("    " + text.replace("\n", "\n    ")))


# ---------------------------------------------------------------------- acting on a team
#
# The same transitions the tools and the host's code use, from a shell: each goes through the
# Router (one transaction, a ledger event), and a turn it schedules is published to the broker.
