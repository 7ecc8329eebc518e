"""Every statement the hot paths issue is planned on an index, never a sequential scan of a table
that grows with history. A PostgreSQL database is filled with a few tens of thousands of rows of
consistent history and analysed (so that the planner would scan a table whose index is
missing); the statements the store really sends while routing, claiming, draining, asking,
answering, ending a turn and sweeping are captured at the cursor and explained."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from agent_router import Router, Settings
from agent_router.domain import MessageType
from agent_router.ops.scale import Size, fill
from agent_router.outbox import RecordingPublisher
from agent_router.waker import InProcessWaker
from tests.integration.helpers import assistant, tool_call

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

PLANNED = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")

Captured = list[tuple[str, str, Any]]


@contextmanager
def _capture(engine: sa.Engine, label: str, into: Captured) -> Iterator[None]:
    def before(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool
    ) -> None:
        first = parameters[0] if many and parameters else parameters
        into.append((label, statement, first))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", before)


def _seq_scans(plan: dict[str, Any]) -> list[str]:
    found = []
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") in LARGE:
        found.append(str(plan["Relation Name"]))
    for child in plan.get("Plans", []):
        found.extend(_seq_scans(child))
    return found


def _hot_paths(router: Router, engine: sa.Engine) -> Captured:
    captured: Captured = []
    team = router.create_team().id
    lead = router.create_agent(team, role="Team Leader").display_name
    worker = router.create_agent(team, role="Worker").display_name
    other = router.create_agent(team, role="Worker").display_name
    with _capture(engine, "route to a resting agent", captured):
        router.send(team, to=worker, content="start", sender="user")
    with _capture(engine, "claim", captured):
        turn = router.claim_turn(team, worker)
    assert turn is not None
    with _capture(engine, "drain", captured):
        turn.drain()
    with _capture(engine, "route to a running agent", captured):
        router.send(team, to=worker, content="more", sender=lead)
    turn.drain()
    turn.append_assistant(assistant(None, tool_call("ask-1", "ask_master")))
    with _capture(engine, "ask", captured):
        question = turn.ask(lead, "which module?", tool_call_id="ask-1")
    with _capture(engine, "route an answer to a waiting agent (resolve)", captured):
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
    with _capture(engine, "end turn", captured):
        router.end_turn(turn)
    # One agent left scheduled with its task lost: the sweeper re-enqueues it.
    router.send(team, to=other, content="start", sender="user")
    with _capture(engine, "sweeper pass", captured):
        router.sweep()
        router.store.stuck_scheduled(older_than_seconds=0)
        router.store.claim_unpublished(older_than_seconds=0)
        router.store.expire_questions()
    return captured


def test_hot_statements_never_scan_a_large_table(fresh_pg_url: str) -> None:
    settings = Settings(database_url=fresh_pg_url)
    router = Router(settings, publisher=RecordingPublisher(), waker=InProcessWaker())
    router.create_schema()
    fill(fresh_pg_url, Size(messages=40_000, teams=500))
    engine = router.store.engine
    try:
        captured = _hot_paths(router, engine)
        labels = {label for label, _, _ in captured}
        assert len(labels) == 8, labels  # every path issued statements
        scans: dict[str, list[str]] = {}
        explained = 0
        with engine.connect() as conn:
            for label, statement, params in captured:
                if not statement.lstrip().upper().startswith(PLANNED):
                    continue
                plan = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", params).scalar()
                tree = (plan if isinstance(plan, list) else json.loads(str(plan)))[0]["Plan"]
                explained += 1
                for table in _seq_scans(tree):
                    scans.setdefault(f"{label}: {table}", []).append(statement)
            conn.rollback()
        assert explained >= 30, explained
        assert scans == {}, json.dumps(scans, indent=1)
    finally:
        router.close()
