"""``agent-router run``: give a task to a new team's lead and run the team with an
OpenAI-compatible model until every agent rests.

The lead gets the ``Team Leader`` role's system prompt and the lead tools; sub-agents are created
by the lead (``create_sub_agent``) from the roles catalogue, each with its role's prompt. Models
and tools come from :func:`agent_router.agents.builder.build`, as in every process that runs
turns: a role's own ``model`` and ``temperature`` when it names them, else ``--model``
(``AGENT_ROUTER_OPENAI_MODEL``); the multi-agent tools (no pretend work tool) and, for
sub-agents, the MCP servers and host functions their role declares.
Questions get a deadline below the run's timeout, so that an unanswered one expires (and is
reported) while the run still watches.

The run ends when every agent rests, when its timeout passes, or when nothing can make progress
any more: no agent runs or is scheduled, and every waiting agent waits on an agent that rests
with nothing to read (only a deadline could move the team on). The result says what the team was
waiting on and why it stopped.

Separate worker processes (``agent-router worker`` on a real broker) build the same models and
tools from the same settings: the ``openai_*`` settings (``AGENT_ROUTER_OPENAI_MODEL``,
``AGENT_ROUTER_OPENAI_BASE_URL``, the API key), the roles file (``AGENT_ROUTER_ROLES_FILE``),
``AGENT_ROUTER_MCP_SERVERS`` and ``AGENT_ROUTER_HOST_TOOLS``. No runtime factory is needed;
:func:`openai_runtime` builds that same runtime for deployments that still name it in
``AGENT_ROUTER_RUNTIME_FACTORY``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_router.agents.roles import RoleCatalogue
from agent_router.domain import (
    RESTING_STATES,
    AgentState,
    LedgerAction,
    MessageType,
    QuestionKind,
    TokenUsage,
    UserMessageKind,
)
from agent_router.ops import preflight
from agent_router.ops.checks import TeamReport, check_team
from agent_router.router import Router
from agent_router.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

    from agent_router.agents.toolbox import AgentTools
    from agent_router.worker.runtime import Runtime

#: Agents in these states are done for now: nothing runs and nothing is scheduled for them.
SETTLED_STATES = RESTING_STATES | {AgentState.TERMINATED}


def openai_runtime(settings: Settings, app: Celery) -> Runtime:
    """``AGENT_ROUTER_RUNTIME_FACTORY`` target: the runtime a worker builds without a factory
    (:func:`agent_router.agents.builder.for_router`: the team's, the role's or the setting's
    model, and the roles' tools)."""
    from agent_router.agents.builder import for_router
    from agent_router.worker.runtime import Runtime, worker_router

    router = worker_router(settings, app)
    built = for_router(router)
    return Runtime(router=router, models=built.models, tools=built.tools, app=app)


def print_tool_listing(tools: AgentTools, roles: RoleCatalogue, *, as_json: bool) -> bool:
    """Print what each role of the catalogue gets (``run --list-tools``); false when an MCP
    server could not be listed or a tool filter names no tool of its server."""
    listings = [tools.listing(name) for name in roles.names()]
    for listing in listings:
        if as_json:
            print(json.dumps({"event": "tools", "role": listing.role, "tools": listing.tools,
                              "unavailable": listing.unavailable,
                              "unmatched": listing.unmatched}))  # fmt: skip
            continue
        print(f"{listing.role}:")
        for name, source in listing.tools.items():
            print(f"  {name:<40} {source}")
        for server, error in listing.unavailable.items():
            print(f"  mcp:{server} unavailable: {error}")
        for server, entries in listing.unmatched.items():
            print(f"  mcp:{server} filter names no tool: {', '.join(entries)}")
    return all(listing.complete for listing in listings)


def require_tools(tools: AgentTools) -> None:
    """Refuse to start a team (:class:`~agent_router.ops.preflight.NotReadyError`) when a
    declared MCP server cannot be listed, or a tool filter names no tool of its server: its
    agents would silently go without those tools."""
    problems = tools.unlisted()
    if problems:
        what, why = next(iter(problems.items()))
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise preflight.NotReadyError(
            f"MCP server {what} cannot give its tools: {why}{more}",
            hint="check the server's command or URL and the roles file (`agent-router run "
            "--list-tools` shows what each role gets), or pass --allow-missing-tools to run "
            "without them",
        )


#: Seconds the team must look stuck (polled again and again) before the run gives up on it: a
#: turn being enqueued or a wake signal in flight looks stuck for a moment.
STALL_SECONDS = 3.0


def question_timeout_for(settings: Settings, run_timeout: float) -> float:
    """A question deadline below the run's timeout (half of it at most)."""
    return min(settings.question_timeout_seconds, run_timeout / 2)


@dataclass(frozen=True, kw_only=True)
class Wait:
    """One agent blocked on another: an open ask, or a wait for a sub-agent's report."""

    asker: str
    target: str
    target_state: str
    question_id: int
    kind: str
    target_pending: int  # messages waiting in the target's mailbox

    def describe(self) -> str:
        if self.kind == QuestionKind.USER:
            return f"{self.asker} waits on the user for the answer to question {self.question_id}"
        what = (
            f"its answer to question {self.question_id}"
            if self.kind == "ask"
            else f"its report (wait {self.question_id})"
        )
        return (
            f"{self.asker} waits on {self.target} for {what} "
            f"({self.target} is {self.target_state}, {self.target_pending} message(s) to read)"
        )

    @property
    def hopeless(self) -> bool:
        """Nothing but a deadline can end this wait: its target rests with nothing to read."""
        resting = self.target_state in {s.value for s in SETTLED_STATES}
        return resting and not self.target_pending


def waits(router: Router, team_id: int) -> list[Wait]:
    statuses = router.reads.agent_statuses(team_id)
    by_id = {s.agent.id: s for s in statuses}
    found = []
    for status in statuses:
        for qid in status.open_questions:
            question = router.question(qid)
            if not question.waiting:
                continue
            target = by_id[question.target_agent_id].agent
            found.append(
                Wait(
                    asker=status.agent.display_name,
                    target=question.target or target.display_name,
                    target_state=target.state.value,
                    question_id=qid,
                    kind=question.kind.value,
                    target_pending=target.mailbox_depth,
                )
            )
    return found


def stuck(router: Router, team_id: int) -> list[Wait] | None:
    """The waits that hold the team when nothing can make progress; ``None`` otherwise."""
    agents = router.agents(team_id)
    if any(a.state in (AgentState.RUNNING, AgentState.SCHEDULED) for a in agents):
        return None
    if any(a.state in RESTING_STATES and a.mailbox_depth for a in agents):
        return None
    found = waits(router, team_id)
    if not found or not all(w.hopeless for w in found):
        return None
    return found


@dataclass(kw_only=True)
class Progress:
    """How watching the team ended."""

    settled: bool
    reason: str | None = None  # why the run stopped without the team settling


def wait_settled(
    router: Router,
    team_id: int,
    *,
    timeout: float,
    poll: float = 0.1,
    stall_seconds: float = STALL_SECONDS,
) -> Progress:
    deadline = time.monotonic() + timeout
    stuck_since: float | None = None
    while not settled(router, team_id):
        now = time.monotonic()
        holding = stuck(router, team_id)
        if holding is None:
            stuck_since = None
        elif stuck_since is None:
            stuck_since = now
        elif now - stuck_since >= stall_seconds:
            return Progress(
                settled=False,
                reason="nothing can make progress: " + "; ".join(w.describe() for w in holding),
            )
        if now > deadline:
            return Progress(settled=False, reason=f"the team did not settle within {timeout:.0f}s")
        time.sleep(poll)
    return Progress(settled=True)


@dataclass(kw_only=True)
class RunResult:
    team_id: int
    settled: bool
    states: dict[str, str] = field(default_factory=dict)
    failed_turns: list[str] = field(default_factory=list)
    expired_questions: list[str] = field(default_factory=list)
    waiting_on: list[str] = field(default_factory=list)
    reason: str | None = None
    final: str | None = None  # the lead's last answer to the user
    report: TeamReport | None = None
    budget_exhausted: str | None = None  # the budget that stopped the team, if one did
    usage: TokenUsage = field(default_factory=TokenUsage)

    @property
    def ok(self) -> bool:
        return (
            self.settled
            and not self.failed_turns
            and not self.expired_questions
            and self.budget_exhausted is None
            and (self.report is None or self.report.ok)
        )


def start_team(router: Router, task: str, roles: RoleCatalogue) -> int:
    """A new team whose lead has the catalogue's lead prompt and ``task`` from the user."""
    lead = roles.lead
    team = router.create_team(lead_system_prompt=lead.system_prompt if lead else None)
    router.send(
        team.id, to=team.lead.display_name, content=task, sender="user", type=MessageType.TASK
    )
    return team.id


def settled(router: Router, team_id: int) -> bool:
    return all(a.state in SETTLED_STATES for a in router.agents(team_id))


def result_of(router: Router, team_id: int, *, progress: Progress) -> RunResult:
    agents = router.agents(team_id)
    ledger = router.ledger(team_id)
    failed = [
        f"{e.agent_name} turn {e.turn_id}: {e.detail.get('error')}"
        for e in ledger
        if e.action is LedgerAction.TURN_ENDED and e.detail.get("failed")
    ]
    expired = [
        f"question {e.detail.get('question_id')} of {e.agent_name} got no answer in time"
        for e in ledger
        if e.action is LedgerAction.QUESTION_EXPIRED
    ]
    # The lead's answer reaches the user as a message to the user, as a host's would.
    answers = [m.content for m in router.user_messages(team_id) if m.kind is UserMessageKind.ANSWER]
    budget = router.budget(team_id)
    return RunResult(
        budget_exhausted=budget.exhausted.value if budget.exhausted else None,
        usage=budget.usage,
        team_id=team_id,
        settled=progress.settled,
        states={a.display_name: a.state.value for a in agents},
        failed_turns=failed,
        expired_questions=expired,
        waiting_on=[w.describe() for w in waits(router, team_id)],
        reason=progress.reason,
        final=answers[-1] if answers else None,
        report=check_team(router, team_id, quiescent=True) if progress.settled else None,
    )
