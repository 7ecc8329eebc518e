"""The router keeps no state in a database session, so that PgBouncer in transaction pooling
(which hands each transaction whichever server connection is free) serves it: no SQL in the
package sets a session parameter (``SET`` without ``LOCAL``, ``set_config`` not local), takes a
session-level advisory lock, listens for notifications, keeps a cursor past its transaction,
creates a temporary table or prepares a statement by name. Row locks, ``SET LOCAL``, a local
``set_config`` and ``pg_advisory_xact_lock`` end with their transaction and are fine.
Prepared statements at the protocol level are the ``database_prepare`` setting's
(docs/deployment.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "agent_router"

SESSION_STATE = {
    # A statement (a string's first word) setting a parameter for the rest of the session.
    "SET without LOCAL": re.compile(r"""["'(]\s*SET\s+(?!LOCAL\b|TRANSACTION\b)"""),
    # set_config(name, value, is_local) lasts the session unless is_local is true.
    "set_config for the session": re.compile(r"\bset_config\s*\((?![^)]*,\s*(true|True)\s*\))"),
    "session advisory lock": re.compile(r"\bpg_(try_)?advisory_lock(_shared)?\s*\("),
    "LISTEN": re.compile(r"\bLISTEN\s+[\w\"]"),
    "cursor WITH HOLD": re.compile(r"\bWITH\s+HOLD\b"),
    "temporary table": re.compile(r"\bCREATE\s+(GLOBAL\s+|LOCAL\s+)?TEMP(ORARY)?\s+TABLE\b"),
    "PREPARE by name": re.compile(r"""["'(]\s*(PREPARE|DEALLOCATE)\s+\w"""),
}


def session_state_in(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in SESSION_STATE.items():
            if pattern.search(line):
                found.append(f"{number}: {what}: {line.strip()[:100]}")
    return found


def test_the_package_keeps_no_session_state() -> None:
    sources = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.sql")]
    assert len(sources) > 50
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sources
        if (hits := session_state_in(path.read_text(encoding="utf-8")))
    }
    assert found == {}


@pytest.mark.parametrize(
    "line",
    [
        'conn.exec_driver_sql("SET statement_timeout = 0")',
        "cur.execute('SET search_path TO app')",
        "sa.text(\"SELECT set_config('app.team', :t, false)\")",
        '"SELECT pg_advisory_lock(:key)"',
        '"SELECT pg_try_advisory_lock_shared(1)"',
        'conn.execute(sa.text("LISTEN agent_router_wake"))',
        '"DECLARE c CURSOR WITH HOLD FOR SELECT 1"',
        '"CREATE TEMP TABLE scratch (id int)"',
        'conn.exec_driver_sql("PREPARE route AS SELECT 1")',
    ],
)
def test_each_kind_of_session_state_is_found(line: str) -> None:
    assert session_state_in(line)


@pytest.mark.parametrize(
    "line",
    [
        "conn.exec_driver_sql(\"SET LOCAL lock_timeout = '1s'\")",
        '"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"',
        '"UPDATE ar_agents SET epoch = epoch + 1 WHERE id = :id"',
        '"SELECT pg_advisory_xact_lock(:team)"',
        'sa.func.set_config("synchronous_commit", "off", True) == "off"',
        "@event.listens_for(engine, 'connect')",
        "listen_addr = 127.0.0.1",
    ],
)
def test_what_ends_with_its_transaction_is_allowed(line: str) -> None:
    assert session_state_in(line) == []
