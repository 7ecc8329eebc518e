"""Every statement the hot paths run is planned on an index, never a sequential scan of a table
that grows with history. A PostgreSQL database is filled with a few tens of thousands of rows of
consistent history and analysed (so that the planner would scan a table whose index is missing),
then a team routes, claims, drains, asks, answers, ends a turn and sweeps.

A transition is one call of its function (``SELECT ar_send(...)``), whose own plan is a Result
node: the statements that matter run inside it. PostgreSQL's auto_explain logs the plan of every
statement as it runs, nested ones included; loaded on the router's connections at level NOTICE,
it sends each plan to the client, where the driver's notice handler collects it. Each path is
run twice: with plans made for the values of each call (custom), and with the plans a
function's statements may get once they are cached for any value on a long-lived connection
(generic; the functions' own statements only: the statements the store sends carry their values
as parameters, and are planned for them)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from agent_router import Router, Settings
from agent_router.domain import MessageType
from agent_router.ops.scale import Size, fill
from agent_router.outbox import RecordingPublisher
from agent_router.store import utcnow
from agent_router.waker import InProcessWaker

from ..conftest import _new_database
from .helpers import assistant, start_running, tool_call

#: Tables whose size grows with the history a deployment keeps, or with its number of teams.
LARGE = frozenset(
    {
        "ar_messages",
        "ar_transcript_entries",
        "ar_ledger",
        "ar_outbox",
        "ar_turns",
        "ar_questions",
        "ar_agents",
    }
)

#: The hot paths, in the order they run.
PATHS = (
    "route to a resting agent",
    "claim",
    "drain",
    "route to a running agent",
    "ask",
    "route an answer to a waiting agent (resolve)",
    "end turn",
    "sweeper pass",
)

#: A parameter as the driver is given it (psycopg sends ``$n``, numbered by first use).
_PARAMETER = re.compile(r"%\((\w+)\)s")

#: Every statement's plan, as a notice to the client (auto_explain's settings are per session).
_EXPLAIN_ALL = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_format = json",
    "SET auto_explain.log_level = notice",
    "SET client_min_messages = notice",
)


class Plans:
    """The plans the router's statements ran with, by the hot path that ran them, and the
    statements the store sent (as the server reads them: ``$n`` for each parameter)."""

    def __init__(self) -> None:
        self.by_path: dict[str, list[dict[str, Any]]] = {}
        self.sent: set[str] = set()
        self._path: str | None = None

    @contextmanager
    def path(self, name: str) -> Iterator[None]:
        self._path = name
        try:
            yield
        finally:
            self._path = None

    def notice(self, diagnostic: Any) -> None:
        """auto_explain's notice: ``duration: ... ms  plan:`` and the plan as JSON."""
        head, sep, body = str(diagnostic.message_primary).partition("plan:")
        if self._path is None or not sep or not head.startswith("duration:"):
            return
        self.by_path.setdefault(self._path, []).append(json.loads(body))

    def sending(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        numbers: dict[str, str] = {}

        def number(found: re.Match[str]) -> str:
            return numbers.setdefault(found.group(1), f"${len(numbers) + 1}")

        self.sent.add(_PARAMETER.sub(number, statement).replace("%%", "%"))

    def nested(self, explained: dict[str, Any]) -> bool:
        """Whether the plan is of a statement run inside a function (not one the store sent)."""
        return str(explained["Query Text"]) not in self.sent


@contextmanager
def _explaining(engine: sa.Engine, plan_cache_mode: str) -> Iterator[Plans]:
    """The plans of every statement the engine's connections run meanwhile, with
    ``plan_cache_mode`` (``force_custom_plan``, ``force_generic_plan``)."""
    plans = Plans()

    def connected(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.autocommit = True
        for statement in (*_EXPLAIN_ALL, f"SET plan_cache_mode = {plan_cache_mode}"):
            dbapi_connection.execute(statement)  # a superuser's LOAD; settings of ours
        dbapi_connection.autocommit = False
        dbapi_connection.add_notice_handler(plans.notice)

    engine.dispose()  # every connection from now on is a new one, set up as above
    event.listen(engine, "connect", connected)
    event.listen(engine, "before_cursor_execute", plans.sending)
    try:
        yield plans
    finally:
        event.remove(engine, "connect", connected)
        event.remove(engine, "before_cursor_execute", plans.sending)
        engine.dispose()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _large(explained: dict[str, Any]) -> set[str]:
    """The large tables a statement's plan reads or writes."""
    return {str(n.get("Relation Name")) for n in _nodes(explained["Plan"])} & LARGE


def _seq_scans(explained: dict[str, Any]) -> list[str]:
    return [
        str(n["Relation Name"])
        for n in _nodes(explained["Plan"])
        if n.get("Node Type") == "Seq Scan" and n.get("Relation Name") in LARGE
    ]


def _hot_paths(router: Router, plans: Plans) -> None:
    team = router.create_team().id
    lead = router.create_agent(team, role="Team Leader").display_name
    worker = router.create_agent(team, role="Worker").display_name
    other = router.create_agent(team, role="Worker").display_name
    with plans.path("route to a resting agent"):
        router.send(team, to=worker, content="start", sender="user")
    with plans.path("claim"):
        turn = router.claim_turn(team, worker)
    assert turn is not None
    with plans.path("drain"):
        turn.drain()
    with plans.path("route to a running agent"):
        router.send(team, to=worker, content="more", sender=lead)
    turn.drain()
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    with plans.path("ask"):
        question = turn.ask(lead, "which module?", tool_call_id="ask-1")
    with plans.path("route an answer to a waiting agent (resolve)"):
        router.send(
            team,
            to=worker,
            content="this one",
            sender=lead,
            type=MessageType.ANSWER,
            question_id=question.id,
        )
    turn.wait_for(question, block_seconds=1)
    turn.append_assistant(assistant("done"))
    with plans.path("end turn"):
        router.end_turn(turn)
    # One agent left scheduled with its task lost: the sweeper re-enqueues it; another blocked
    # in an ask past its deadline: the sweeper expires the question.
    router.send(team, to=other, content="start", sender="user")
    asker = start_running(router, team, router.create_agent(team, role="Worker").display_name)
    asker.append_assistant(assistant(None, tool_call("ask-2", "ask_master")))
    overdue = asker.ask(lead, "which colour?", tool_call_id="ask-2", timeout_seconds=0.001)
    assert router.question(overdue.id).deadline <= utcnow()
    with plans.path("sweeper pass"):
        router.sweep()
        for agent in router.store.reads.scheduled(older_than_seconds=0):
            router.store.reenqueue(agent, windows=1)
        router.store.reads.queued_publishes()
        router.store.reads.running_turns()
        router.store.reads.overdue_questions()
        router.store.reads.quarantined()
        router.store.claim_unpublished(older_than_seconds=0)
        router.store.expire_questions()


def _scans(router: Router, plan_cache_mode: str) -> dict[str, list[str]]:
    """Run the hot paths; the sequential scans of large tables their statements ran, by path
    and table (each with its statement); with generic plans, of the functions' statements."""
    with _explaining(router.store.engine, plan_cache_mode) as plans:
        _hot_paths(router, plans)
    generic = plan_cache_mode == "force_generic_plan"
    # Every path ran statements nested in a function on the large tables (in the sweeper pass:
    # the expiry's), else the test would pass for want of plans.
    nested = {
        path: sum(bool(_large(p)) for p in plans.by_path.get(path, []) if plans.nested(p))
        for path in PATHS
    }
    assert all(nested.values()), nested
    scans: dict[str, list[str]] = {}
    for path, explained in plans.by_path.items():
        for plan in explained:
            if generic and not plans.nested(plan):
                continue
            for table in _seq_scans(plan):
                scans.setdefault(f"{path}: {table}", []).append(plan["Query Text"])
    return scans


@pytest.fixture(scope="module")
def filled_url() -> Iterator[str]:
    """A database of the module's own, filled once (one test drops an index of it a while)."""
    with _new_database("ar_plans") as url:
        router = Router(Settings(database_url=url))
        router.create_schema()
        router.close()
        fill(url, Size(messages=40_000, teams=500))
        yield url


@pytest.fixture
def router(filled_url: str) -> Iterator[Router]:
    r = Router(
        Settings(database_url=filled_url), publisher=RecordingPublisher(), waker=InProcessWaker()
    )
    yield r
    r.close()


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
def test_hot_statements_never_scan_a_large_table(router: Router, plan_cache_mode: str) -> None:
    scans = _scans(router, plan_cache_mode)
    assert scans == {}, json.dumps(scans, indent=1)


def test_a_missing_index_makes_a_functions_statement_scan(router: Router, filled_url: str) -> None:
    """Without the index of the questions by their asker, the end of a turn's look for the
    question its agent is blocked on (a statement inside ar_end) scans the table: the test above
    sees the statements inside the functions. The index is made again afterwards."""
    index = "ix_ar_questions_asker_agent_id"
    admin = sa.create_engine(filled_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            definition = conn.execute(
                sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :name"), {"name": index}
            ).scalar_one()
            conn.execute(sa.text(f"DROP INDEX {index}"))
        try:
            for mode in ("force_custom_plan", "force_generic_plan"):
                scans = _scans(router, mode)
                assert set(scans) == {"end turn: ar_questions"}, mode
                assert all("asker_agent_id" in text for text in scans["end turn: ar_questions"])
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(definition))
    finally:
        admin.dispose()
