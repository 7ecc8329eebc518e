"""Small builders shared by the integration tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from celery import Celery
from sqlalchemy import event

from agent_router import LedgerAction, Router, Settings, Turn
from agent_router.broker import CeleryPublisher
from agent_router.ops.demo import wait_until


def tool_call(call_id: str, name: str = "do_work", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = list(calls)
    return msg


def start_running(router: Router, team_id: int, name: str, content: str = "start") -> Turn:
    """Wake ``name`` and claim its turn: the agent is then ``running``."""
    router.send(team_id, to=name, content=content, sender="user")
    turn = router.claim_turn(team_id, name)
    assert turn is not None
    turn.drain()
    return turn


#: Leases short enough that a dead turn is taken over within about a second.
FAST_SWEEP = {"lease_seconds": 1.0, "heartbeat_seconds": 0.2, "sweep_seconds": 0.2}


def dead_turn(settings: Settings, app: Celery) -> tuple[Settings, Router, int]:
    """``settings`` with :data:`FAST_SWEEP`, a router on them publishing to ``app``, and a team
    whose ``Engineer_1`` runs a turn that no worker heartbeats any more (its worker died)."""
    fast = settings.model_copy(update=FAST_SWEEP)
    router = Router(fast, publisher=CeleryPublisher(app))
    team = router.create_team()
    router.create_agent(team.id, role="Engineer")
    start_running(router, team.id, "Engineer_1")
    return fast, router, team.id


def wait_taken_over(router: Router, team_id: int, name: str, what: str, timeout: float) -> None:
    """Wait until the team's ledger has a sweeper's takeover of ``name``'s turn."""
    wait_until(
        lambda: any(
            e.action is LedgerAction.TAKE_OVER and e.agent_name == name
            for e in router.ledger(team_id)
        ),
        what,
        timeout=timeout,
    )


def start_waiting(
    router: Router, team_id: int, name: str, target: str, call_id: str = "ask-1"
) -> Turn:
    """Put ``name`` in ``waiting``: blocked in an ask to ``target``."""
    turn = start_running(router, team_id, name)
    turn.append_assistant(assistant(None, tool_call(call_id, "ask_master")))
    turn.ask(target, "which auth module?", tool_call_id=call_id)
    return turn


@contextmanager
def statements_in_autocommit(router: Router) -> Iterator[list[tuple[str, bool]]]:
    """The SQL statements the router's store sends to the database meanwhile, in order, each
    with whether its connection was in autocommit (the statement its own transaction: no BEGIN
    before it, no COMMIT after it; BEGIN and COMMIT are not among the statements)."""
    seen: list[tuple[str, bool]] = []

    def record(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append((statement, bool(conn.connection.dbapi_connection.autocommit)))

    event.listen(router.store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(router.store.engine, "before_cursor_execute", record)


@contextmanager
def statements_sent(router: Router) -> Iterator[list[str]]:
    """The SQL statements the router's store sends to the database meanwhile, in order (BEGIN
    and COMMIT are not among them); the list is filled when the block ends."""
    seen: list[str] = []
    with statements_in_autocommit(router) as both:
        yield seen
    seen.extend(statement for statement, _ in both)


def lock_waiters(conn: sa.Connection) -> list[str]:
    """The statements of this database that wait for a lock, oldest first."""
    # pg_stat_activity is read once per transaction unless its snapshot is cleared.
    conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
    return list(
        conn.execute(
            sa.text(
                "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' ORDER BY query_start"
            )
        ).scalars()
    )


def until_lock_waiters(conn: sa.Connection, n: int) -> None:
    """Until ``n`` statements of this database wait for a lock."""
    for _ in range(1000):
        if len(lock_waiters(conn)) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} statements never waited for the lock")
