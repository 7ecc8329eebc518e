"""Refusals as codes: what a transition refused is a code and its fields, on SQLite and on
PostgreSQL alike; the error class and the one-line message are this table's.

A transition on PostgreSQL returns ``{"refused": {"code": ..., "fields": {...}}}``, one on
SQLite raises :func:`error` with the same code and fields, and both reach the caller as the
same :class:`~agent_router.errors.RefusedError` (or :class:`~agent_router.errors.TurnError`),
its ``code`` and ``fields`` set and its message rendered here. A refused send's ledger event
records the code and fields too (``refused``, ``fields``): :func:`sentence` renders them where
an operator reads the ledger.

Field names that hold a row's id end in ``_id`` (``team_id``, ``message_id``, ...), as the
ledger's columns do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_router import errors

Template = str | Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Refusal:
    """A code's error class and message (a :meth:`str.format` template over the fields, or a
    function of them); ``kwargs``: the fields the error class takes as arguments."""

    error: type[errors.AgentRouterError]
    template: Template
    kwargs: tuple[str, ...] = ()


def _unknown_agent(f: Mapping[str, Any]) -> str:
    close = f.get("close")
    guess = f"; did you mean {close!r}?" if close else ""
    return f"no agent {f['name']!r} in team {f['team_id']}{guess}"


def _sub_agents_spent(f: Mapping[str, Any]) -> str:
    created = f["budget"] == "sub_agents_created"
    what = "created" if created else "active at once"
    hint = "" if created else " (terminate one that is done first)"
    return (
        f"the team's budget of {f['limit']} sub-agents {what} is spent ({f['used']}): "
        f"no new sub-agent{hint}"
    )


def _cycle(f: Mapping[str, Any]) -> str:
    return f"this {f['verb']} would deadlock: " + " -> ".join(f["cycle"])


#: The kinds of rows a team may still owe someone, in the order a refusal lists them (the
#: order of :data:`agent_router.store.lifecycle.OWED`).
OWED_KINDS = (
    "undelivered_messages",
    "open_questions",
    "spent_budget",
    "unpublished_outbox",
    "current_transcripts",
)


def _owed_rows(f: Mapping[str, Any]) -> str:
    owed = sorted(f["owed"].items(), key=lambda kind_n: OWED_KINDS.index(kind_n[0]))
    listed = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in owed)
    return (
        f"team {f['team_id']} still owes {listed}; delete it with include_undelivered "
        "(--include-undelivered) to drop them, which the ledger records"
    )


_ASK = errors.AskRefusedError

#: Every code a transition refuses with.
CODES: dict[str, Refusal] = {
    # teams and agents
    "unknown_team": Refusal(errors.UnknownTeamError, "unknown team {team_id}"),
    "no_team": Refusal(errors.UnknownTeamError, "no team with id {team_id}"),
    "no_agent_id": Refusal(errors.UnknownAgentError, "no agent with id {agent_id}"),
    "unknown_agent": Refusal(errors.UnknownAgentError, _unknown_agent),
    "display_name_taken": Refusal(
        errors.DuplicateDisplayNameError, "display name {name!r} is taken in team {team_id}"
    ),
    "lead_kept": Refusal(errors.InvalidMessageError, "the Team Leader cannot be {done}"),
    "already_terminated": Refusal(errors.AgentTerminatedError, "{name!r} is already terminated"),
    "terminated": Refusal(errors.AgentTerminatedError, "agent {name!r} is terminated"),
    "owed_rows": Refusal(errors.OwedRowsError, _owed_rows, ("owed",)),
    # sends
    "unknown_sender": Refusal(
        errors.UnknownAgentError,
        "unknown sender {sender!r}: not an agent of team {team_id}, "
        "nor 'user', 'system' or 'job:<name>'",
    ),
    "sender_terminated": Refusal(errors.AgentTerminatedError, "sender {sender!r} is terminated"),
    "self_send": Refusal(errors.InvalidMessageError, "an agent cannot message itself"),
    "dedup_conflict": Refusal(
        errors.DedupConflictError,
        "dedup key {dedup_key!r} was used for message {message_id} to {target} "
        "with other content, sender or type",
    ),
    "no_question_id": Refusal(errors.InvalidMessageError, "an answer needs a question_id"),
    "unknown_question": Refusal(
        errors.UnknownQuestionError, "no question {question_id} in team {team_id}"
    ),
    "not_asked_by": Refusal(
        errors.WrongQuestionError, "question {question_id} was not asked by {target!r}"
    ),
    "users_question": Refusal(
        errors.WrongQuestionError, "question {question_id} is the user's to answer"
    ),
    "not_a_question": Refusal(
        errors.WrongQuestionError,
        "{question_id} is not a question but a wait for output: nothing to answer",
    ),
    "question_closed": Refusal(
        errors.QuestionClosedError, "question {question_id} is already {status}"
    ),
    # asks and waits for output
    "ask_unknown_target": Refusal(_ASK, "no agent {target!r} in this team", ("cycle",)),
    "ask_self": Refusal(_ASK, "an agent cannot ask itself", ("cycle",)),
    "wait_self": Refusal(_ASK, "an agent cannot wait for its own output", ("cycle",)),
    "ask_terminated": Refusal(_ASK, "{target!r} is terminated", ("cycle",)),
    "cycle": Refusal(_ASK, _cycle, ("cycle",)),
    "not_working": Refusal(
        _ASK,
        "{target!r} is {state} with nothing to work on: it will produce no output until it "
        "is given a task",
        ("cycle",),
    ),
    "not_open_tool_call": Refusal(
        errors.InvalidTranscriptEntryError,
        "{call!r} is not an open tool call of the last assistant message",
    ),
    # turns
    "host_owned": Refusal(
        errors.HostOwnedTurnError,
        "the turns of this agent run in the host's task {runner!r}",
        ("runner",),
    ),
    "stale_turn": Refusal(
        errors.StaleTurnError,
        "turn {turn_id} (epoch {epoch}) is no longer current: {operation} refused",
    ),
    "cannot_drain": Refusal(errors.TurnError, "{name!r} is {state}: cannot drain"),
    "calls_open_at_drain": Refusal(
        errors.ToolCallsPendingError,
        "tool calls {calls!r} have no result yet: a drain would split them from their "
        "assistant message",
    ),
    "calls_open_at_append": Refusal(
        errors.ToolCallsPendingError,
        "tool calls {calls!r} need results before the next assistant message",
    ),
    "nothing_to_take_over": Refusal(errors.TurnError, "{name!r} is {state}: nothing to take over"),
    "turn_changed": Refusal(errors.TurnError, "the turn changed since it was found expired"),
    "lease_renewed": Refusal(errors.TurnError, "the lease was renewed"),
    # budgets
    "sub_agents_spent": Refusal(errors.BudgetExhaustedError, _sub_agents_spent, ("budget",)),
    # background jobs
    "job_task_recorded": Refusal(
        errors.InvalidArgumentError, "a background job of task {task_id!r} is recorded already"
    ),
    "unknown_job": Refusal(errors.RefusedError, "no background job {job_id}"),
}


def render(code: str, fields: Mapping[str, Any]) -> str:
    """The one-line message of ``code`` with ``fields``."""
    template = CODES[code].template
    return template(fields) if callable(template) else template.format(**fields)


def error(code: str, /, **fields: Any) -> errors.AgentRouterError:
    """The error a refusal of ``code`` raises: its class, its message, and ``code`` and
    ``fields`` on it. An unknown code is the database's mistake (a :class:`StoreError`)."""
    refusal = CODES.get(code)
    if refusal is None:
        return errors.StoreError(f"the database refused with an unknown code: {code!r} {fields}")
    kwargs = {name: fields.get(name) for name in refusal.kwargs}
    found = refusal.error(render(code, fields), **kwargs)
    found.code = code
    found.fields = dict(fields)
    return found


def sentence(detail: Mapping[str, Any]) -> str | None:
    """The message of a refusal's ledger event (its ``refused`` code and ``fields``); an event
    written before refusals were codes carries its ``message`` instead."""
    code = detail.get("refused")
    if isinstance(code, str) and code in CODES:
        fields = detail.get("fields")
        try:
            return render(code, fields if isinstance(fields, Mapping) else {})
        except (KeyError, IndexError, TypeError, ValueError):
            return code
    message = detail.get("message")
    return None if message is None else str(message)
