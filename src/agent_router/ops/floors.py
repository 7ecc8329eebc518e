"""The floors the bench compares with, measured in the same run on the same machine.

The route floor is the cheapest transaction with the shape of a route: lock one row
``FOR UPDATE``, insert one row, update the locked row, commit. It runs twice on the same tables:
through the raw driver (psycopg, or ``sqlite3`` for the embedded default; one connection per
thread, no pool, no ORM), which is the physical floor, and through our own SQLAlchemy engine
(:func:`agent_router.store.make_engine`), so that the stack's own overhead shows as the ratio
between the two.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import psycopg.types.json
import sqlalchemy as sa

from agent_router.settings import Settings
from agent_router.store import make_engine


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def rate(threads: int, per: int, fn: Callable[[int], None]) -> float:
    """Operations per second of ``threads`` threads each calling ``fn(i)`` ``per`` times."""
    barrier = threading.Barrier(threads)

    def run(i: int) -> None:
        barrier.wait()
        for _ in range(per):
            fn(i)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(run, range(threads)))
    return threads * per / (time.perf_counter() - start)


class EngineFloor:
    """The floor transaction through our own engine (its pool and connection handling)."""

    def __init__(self, settings: Settings, rows: int = 64) -> None:
        self.engine = make_engine(settings)
        self.tag = uuid.uuid4().hex[:8]
        meta = sa.MetaData()
        self.counter = sa.Table(
            f"ar_bench_counter_{self.tag}",
            meta,
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("n", sa.Integer),
        )
        self.log = sa.Table(
            f"ar_bench_log_{self.tag}",
            meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("v", sa.Text),
        )
        self.meta = meta
        # Built once, as the store builds its hot statements: the floor times the engine, not
        # the building of statements.
        row: sa.BindParameter[int] = sa.bindparam("b_row")
        self._statements = (
            sa.select(self.counter.c.n).where(self.counter.c.id == row).with_for_update(),
            self.log.insert().values(v="message"),
            sa.update(self.counter).where(self.counter.c.id == row).values(n=self.counter.c.n + 1),
        )
        meta.create_all(self.engine)
        with self.engine.begin() as conn:
            conn.execute(self.counter.insert(), [{"id": i, "n": 0} for i in range(rows)])

    def run(self, row: int = 0) -> None:
        lock, insert, update = self._statements
        with self.engine.begin() as conn:
            conn.execute(lock, {"b_row": row})
            conn.execute(insert)
            conn.execute(update, {"b_row": row})

    def close(self) -> None:
        self.meta.drop_all(self.engine)
        self.engine.dispose()


class RawFloor:
    """The floor transaction through the raw driver on the engine floor's tables: one connection
    per thread (``connection(i)``), opened once, no pool, no ORM, statements written by hand."""

    def __init__(self, settings: Settings, tables: EngineFloor) -> None:
        url = sa.engine.make_url(settings.database_url)
        self.sqlite = url.get_backend_name() == "sqlite"
        self._dsn = (
            url.database or ""
            if self.sqlite
            else url.set(drivername="postgresql").render_as_string(hide_password=False)
        )
        counter, log = tables.counter.name, tables.log.name
        mark = "?" if self.sqlite else "%s"
        self._lock = f"SELECT n FROM {counter} WHERE id = {mark}" + (
            "" if self.sqlite else " FOR UPDATE"
        )
        self._insert = f"INSERT INTO {log} (v) VALUES ('message')"
        self._update = f"UPDATE {counter} SET n = n + 1 WHERE id = {mark}"
        self._connections: dict[int, Any] = {}
        self._guard = threading.Lock()

    def connection(self, i: int) -> Any:
        with self._guard:
            conn = self._connections.get(i)
            if conn is None:
                if self.sqlite:
                    conn = sqlite3.connect(self._dsn, isolation_level=None, check_same_thread=False)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("PRAGMA busy_timeout=30000")
                else:
                    conn = psycopg.connect(self._dsn)
                self._connections[i] = conn
            return conn

    def run(self, i: int = 0) -> None:
        conn = self.connection(i)
        if self.sqlite:
            # SQLite locks the database, not a row: BEGIN IMMEDIATE takes the write lock up front.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(self._lock, (i,))
            conn.execute(self._insert)
            conn.execute(self._update, (i,))
            conn.execute("COMMIT")
            return
        with conn.cursor() as cur:
            cur.execute(self._lock, (i,))
            cur.execute(self._insert)
            cur.execute(self._update, (i,))
        conn.commit()

    def round_trip(self) -> float:
        """Median milliseconds of one ``SELECT 1`` on an open connection: one database round
        trip."""
        conn = self.connection(-1)
        if not self.sqlite:
            conn.autocommit = True  # no BEGIN: the statement alone
        return statistics.median(ms(lambda: conn.execute("SELECT 1").fetchone()) for _ in range(50))

    def close(self) -> None:
        with self._guard:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()


class _HandWritten:
    """Transactions written by hand through the raw driver: one connection per thread
    (``run(i)`` uses the ``i``-th), opened once; no pool, no ORM (psycopg 3, or ``sqlite3``
    under ``BEGIN IMMEDIATE``). A subclass's statements use ``{m}`` for a parameter."""

    def __init__(self, settings: Settings) -> None:
        url = sa.engine.make_url(settings.database_url)
        self.sqlite = url.get_backend_name() == "sqlite"
        self._dsn = (
            url.database or ""
            if self.sqlite
            else url.set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self._connections: dict[int, Any] = {}
        self._guard = threading.Lock()

    def sql(self, text: str) -> str:
        return text.format(m="?" if self.sqlite else "%s")

    def json(self, value: Any) -> Any:
        """A JSON parameter as the driver takes it."""
        return json.dumps(value) if self.sqlite else psycopg.types.json.Jsonb(value)

    def _connection(self, i: int) -> Any:
        with self._guard:
            conn = self._connections.get(i)
            if conn is None:
                if self.sqlite:
                    conn = sqlite3.connect(self._dsn, isolation_level=None, check_same_thread=False)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("PRAGMA busy_timeout=30000")
                else:
                    conn = psycopg.connect(self._dsn)
                self._connections[i] = conn
            return conn

    def transaction(self, i: int, body: Callable[[Callable[..., Any]], None]) -> None:
        """One transaction on the ``i``-th connection: ``body(execute)``, where
        ``execute(statement, *params)`` returns the statement's first row."""
        conn = self._connection(i)
        if self.sqlite:
            conn.execute("BEGIN IMMEDIATE")
            body(lambda statement, *params: conn.execute(statement, params).fetchone())
            conn.execute("COMMIT")
            return
        with conn.cursor() as cur:
            body(lambda statement, *params: _first(cur, statement, params))
        conn.commit()

    def close(self) -> None:
        with self._guard:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()


def _first(cur: Any, statement: str, params: tuple[Any, ...]) -> Any:
    """Run ``statement`` on the psycopg cursor; its first row, if it returns rows."""
    cur.execute(statement, params)
    return cur.fetchone() if cur.description is not None else None


class SameWorkFloor(_HandWritten):
    """The same-work floor: one transaction writing, through the raw driver, the rows the design
    must write for a message routed to a running agent: the receiver's counter taken (its row
    locked and updated), the message inserted into its mailbox (with the mailbox's indexes and
    foreign keys) and the route's ledger event (``run(i)`` writes to the ``i``-th agent given).
    The rows it writes are real pending messages, left for the bench's teams to discard."""

    _TAKE = (
        "UPDATE ar_agents SET next_seq = next_seq + 1 WHERE id = {m} RETURNING team_id, next_seq"
    )
    _MESSAGE = (
        "INSERT INTO ar_messages (team_id, seq, source_name, target_agent_id, type, content, "
        "wake, outcome, status, created_at) VALUES ({m}, {m}, 'user', {m}, 'message', 'm', "
        "true, 'injected_inline', 'pending', CURRENT_TIMESTAMP) RETURNING id"
    )
    _EVENT = (
        "INSERT INTO ar_ledger (team_id, agent_id, action, outcome, message_id, detail, "
        "created_at) VALUES ({m}, {m}, 'route', 'injected_inline', {m}, {m}, CURRENT_TIMESTAMP)"
    )

    def __init__(self, settings: Settings, agents: list[int]) -> None:
        super().__init__(settings)
        self._take, self._message, self._event = map(
            self.sql, (self._TAKE, self._MESSAGE, self._EVENT)
        )
        self.agents = agents

    def run(self, i: int = 0) -> None:
        agent = self.agents[i]
        detail = self.json({"seq": 0, "type": "message", "wake": True})

        def route(execute: Callable[..., Any]) -> None:
            team, seq = execute(self._take, agent)
            (message,) = execute(self._message, team, seq - 1, agent)
            execute(self._event, team, agent, message, detail)

        self.transaction(i, route)


class ModelCallFloor(_HandWritten):
    """The same-work floor of a model call of the built-in loop: the two transactions the
    design must make for it (one before the call, one after), writing by hand through the raw
    driver the rows they must write. Before: the last tool result appended (the agent's row
    locked and its next position taken), the call counted in the team's budget row, the turn's
    lease renewed. After: the reply appended likewise, its usage row inserted and summed into
    the budget row, its ledger event, the lease renewed. ``run(i)`` makes one model call's
    writes for the ``i``-th ``(agent, turn)`` given (a turn of the agent's, ended or not)."""

    _NEXT = (
        "UPDATE ar_agents SET next_position = next_position + 1 WHERE id = {m} "
        "RETURNING team_id, next_position"
    )
    _ENTRY = (
        "INSERT INTO ar_transcript_entries (agent_id, position, role, payload, turn_id, "
        "created_at) VALUES ({m}, {m}, {m}, {m}, {m}, CURRENT_TIMESTAMP)"
    )
    _LEASE = "UPDATE ar_turns SET lease_expires_at = CURRENT_TIMESTAMP WHERE id = {m}"
    _COUNT = "UPDATE ar_budgets SET model_calls = model_calls + 1 WHERE team_id = {m}"
    _USAGE = (
        "INSERT INTO ar_model_calls (team_id, agent_id, turn_id, model, prompt_tokens, "
        "completion_tokens, cached_tokens, cost_nano, estimated, created_at) VALUES "
        "({m}, {m}, {m}, 'bench', 10, 2, 0, 0, false, CURRENT_TIMESTAMP)"
    )
    _SUMS = (
        "UPDATE ar_budgets SET prompt_tokens = prompt_tokens + 10, "
        "completion_tokens = completion_tokens + 2 WHERE team_id = {m}"
    )
    _EVENT = (
        "INSERT INTO ar_ledger (team_id, agent_id, action, turn_id, detail, created_at) "
        "VALUES ({m}, {m}, 'model_call', {m}, {m}, CURRENT_TIMESTAMP)"
    )

    def __init__(self, settings: Settings, turns: list[tuple[int, int]]) -> None:
        super().__init__(settings)
        self._next, self._entry, self._lease, self._count, self._usage, self._sums = map(
            self.sql, (self._NEXT, self._ENTRY, self._LEASE, self._COUNT, self._USAGE, self._SUMS)
        )
        self._event = self.sql(self._EVENT)
        self.turns = turns
        self._result = self.json({"role": "tool", "tool_call_id": "floor", "content": "done"})
        self._reply = self.json({"role": "assistant", "content": "Done."})
        self._detail = self.json({"model": "bench", "prompt_tokens": 10, "completion_tokens": 2})

    def run(self, i: int = 0) -> None:
        agent, turn = self.turns[i]

        def before(execute: Callable[..., Any]) -> None:
            team, position = execute(self._next, agent)
            execute(self._entry, agent, position - 1, "tool", self._result, turn)
            execute(self._count, team)
            execute(self._lease, turn)

        def after(execute: Callable[..., Any]) -> None:
            team, position = execute(self._next, agent)
            execute(self._entry, agent, position - 1, "assistant", self._reply, turn)
            execute(self._usage, team, agent, turn)
            execute(self._sums, team)
            execute(self._event, team, agent, turn, self._detail)
            execute(self._lease, turn)

        self.transaction(i, before)
        self.transaction(i, after)


class MinimalLoopFloor(_HandWritten):
    """The floor of the built-in loop's wall time per model call: a minimal agent loop that
    reads its mailbox between calls, written by hand through the raw driver (PostgreSQL, one
    autocommit connection, one statement on each side of a call), the model the same instant
    one. It keeps the history and the transcript's next position in memory (the only writer of
    its agent's transcript), and per call: before it, the last tool result appended and the
    agent's pending messages marked delivered in sequence order (read back); then the model
    called with the history; after it, the messages read and the reply appended. Nothing more:
    no fence, lease, budget, usage or ledger (what the built-in loop writes beyond that is what
    the ratio shows). ``run()`` makes one call for ``agent``, writing under ``turn``."""

    _BEFORE = (
        "WITH d AS (UPDATE ar_messages SET status = 'delivered', consumed_turn_id = {m}, "
        "consumed_at = CURRENT_TIMESTAMP WHERE id IN (SELECT id FROM ar_messages "
        "WHERE target_agent_id = {m} AND status = 'pending' ORDER BY seq LIMIT 50) "
        "RETURNING seq, content), "
        "t AS (INSERT INTO ar_transcript_entries (agent_id, position, role, payload, turn_id, "
        "created_at) VALUES ({m}, {m}, 'tool', {m}, {m}, CURRENT_TIMESTAMP)) "
        "SELECT coalesce(jsonb_agg(jsonb_build_object('role', 'user', 'content', content) "
        "ORDER BY seq), '[]') FROM d"
    )
    _AFTER = (
        "WITH m AS (INSERT INTO ar_transcript_entries (agent_id, position, role, payload, "
        "turn_id, created_at) SELECT {m}, {m} + k - 1, 'user', e, {m}, CURRENT_TIMESTAMP "
        "FROM jsonb_array_elements({m}) WITH ORDINALITY AS x(e, k)) "
        "INSERT INTO ar_transcript_entries (agent_id, position, role, payload, turn_id, "
        "created_at) VALUES ({m}, {m}, 'assistant', {m}, {m}, CURRENT_TIMESTAMP)"
    )

    def __init__(
        self,
        settings: Settings,
        agent: int,
        turn: int,
        complete: Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]],
    ) -> None:
        super().__init__(settings)
        self._before, self._after = self.sql(self._BEFORE), self.sql(self._AFTER)
        self.agent, self.turn, self.complete = agent, turn, complete
        self._result = {"role": "tool", "tool_call_id": "floor", "content": "done"}
        self._history: list[dict[str, Any]] = []
        self._conn: Any = None
        self._position = 0

    def _connect(self) -> Any:
        if self._conn is None:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
            (self._position,) = self._conn.execute(
                "SELECT next_position FROM ar_agents WHERE id = %s", (self.agent,)
            ).fetchone()
        return self._conn

    def run(self, i: int = 0) -> None:
        conn, agent, turn = self._connect(), self.agent, self.turn
        (messages,) = conn.execute(
            self._before, (turn, agent, agent, self._position, self.json(self._result), turn)
        ).fetchone()
        self._history += [self._result, *messages]
        reply = self.complete(self._history, [])
        after = self._position + 1
        conn.execute(
            self._after,
            (agent, after, turn, self.json(messages), agent, after + len(messages),
             self.json(reply), turn),
        )  # fmt: skip
        self._history.append(reply)
        self._position = after + len(messages) + 1

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        super().close()


def _process_cpu(pid: int) -> float | None:
    """Seconds of CPU the PostgreSQL process ``pid`` of this machine has used (``/proc``);
    ``None`` when no such process runs here."""
    proc = Path(f"/proc/{pid}")
    try:
        if proc.joinpath("comm").read_text().strip() != "postgres":
            return None
        fields = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def cpu_per_op(
    threads: int, per: int, fn: Callable[[int], None], server: Callable[[], float | None]
) -> tuple[float, float, float | None]:
    """:func:`rate` of ``fn``, and the CPU each operation cost in microseconds: this
    process's, and the database server's (``server()``: its seconds so far, or ``None``)."""
    client, served = time.process_time(), server()
    ops_per_second = rate(threads, per, fn)
    ops = threads * per
    client_us = (time.process_time() - client) / ops * 1e6
    after = server()
    server_us = None if served is None or after is None else (after - served) / ops * 1e6
    return ops_per_second, client_us, server_us


class Floors:
    """Both floor transactions on the same tables, and what each measured in this run."""

    def __init__(self, settings: Settings) -> None:
        self.engine = EngineFloor(settings)
        self.raw = RawFloor(settings, self.engine)

    def latency(self, samples: int) -> dict[str, tuple[float, float]]:
        """``{"raw": (p50, p99), "engine": (p50, p99)}`` in milliseconds, interleaved so that
        both see the same machine."""
        raw: list[float] = []
        engine: list[float] = []
        self.raw.run()  # open the connection outside the samples
        self.engine.run()
        for _ in range(samples):
            raw.append(ms(self.raw.run))
            engine.append(ms(self.engine.run))
        return {
            "raw": (statistics.median(raw), pct(raw, 0.99)),
            "engine": (statistics.median(engine), pct(engine, 0.99)),
        }

    def server_cpu(self) -> float | None:
        """Seconds of CPU used so far by the server processes of this database, when they run
        on this machine (PostgreSQL; ``None`` for SQLite, whose work is this process's)."""
        if self.raw.sqlite:
            return None
        conn = self.raw.connection(-2)
        conn.autocommit = True  # each read its own snapshot of pg_stat_activity
        pids = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
        total = 0.0
        for (pid,) in pids:
            used = _process_cpu(pid)
            if used is None:  # a server on another machine
                return None
            total += used
        return total

    def close(self) -> None:
        self.raw.close()
        self.engine.close()
