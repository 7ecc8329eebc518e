"""Connections the PostgreSQL server closes under the store: the pool replaces one found closed
at checkout (without a round trip to ask, the pool pings no connection), and a transaction
whose connection dies in its hands before its commit runs again on a new connection."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from agent_router import RouteOutcome, Router, Settings
from agent_router.domain import LedgerAction
from agent_router.store.engine import closed_by_server


def _terminate(admin_url: str, pid: int) -> None:
    admin = sa.create_engine(admin_url, poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    admin.dispose()


def _until_closed(dbapi_conn: Any) -> None:
    deadline = time.monotonic() + 10
    while not closed_by_server(dbapi_conn):
        assert time.monotonic() < deadline, "the server never closed the connection"
        time.sleep(0.01)


def _pids(router: Router) -> set[int]:
    with router.store.engine.connect() as conn:
        return {int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())}


def test_a_pooled_connection_the_server_closed_is_replaced_at_checkout(pg_schema_url: str) -> None:
    router = Router(Settings(database_url=pg_schema_url, pool_size=1))
    try:
        team = router.create_team().id
        router.create_agent(team, role="Worker")
        (pid,) = _pids(router)
        pooled = router.store.engine.raw_connection()
        dbapi_conn = pooled.dbapi_connection
        pooled.close()  # back to the pool, idle
        _terminate(pg_schema_url, pid)
        _until_closed(dbapi_conn)
        delivery = router.send(team, to="Worker_1", content="after the kill", sender="user")
        assert delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN
        assert _pids(router) != {pid}
    finally:
        router.close()


def test_a_transaction_whose_connection_dies_before_commit_runs_again(pg_schema_url: str) -> None:
    router = Router(Settings(database_url=pg_schema_url, pool_size=1))
    engine = router.store.engine
    killed: list[int] = []

    def kill_first(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        # After the pool's own check: the connection dies in the hands of the transaction.
        if not killed:
            killed.append(int(dbapi_conn.info.backend_pid))
            _terminate(pg_schema_url, killed[0])
            _until_closed(dbapi_conn)

    try:
        team = router.create_team().id
        router.create_agent(team, role="Worker")
        event.listen(engine, "checkout", kill_first)
        delivery = router.send(team, to="Worker_1", content="through a kill", sender="user")
        event.remove(engine, "checkout", kill_first)
        assert killed, "the connection was never killed"
        assert delivery.outcome is RouteOutcome.TRIGGERED_NEW_TURN and delivery.seq == 1
        # Written once: one message, one route event.
        assert [m.content for m in router.messages(team)] == ["through a kill"]
        routes = [e for e in router.ledger(team) if e.action is LedgerAction.ROUTE]
        assert len(routes) == 1
        assert _pids(router) != {killed[0]}
    finally:
        router.close()
