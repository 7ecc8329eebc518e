"""``agent-router bench``: the published figures, each printed beside a floor measured in the
same run on the same machine, as a ratio to the raw driver's floor, and against its target.

Floors: one transaction that locks a row, inserts one and updates one, through the raw driver
(route; the same transaction through our own engine is printed too, so that the stack's own
overhead shows); the route of the waking answer plus one Redis and one database round trip
(wake); a raw Redis ``PUBLISH`` to a subscriber blocked in another thread (the live feed's
wake); the route with the feed signal off, and a raw ``PUBLISH`` (the signal's cost on the
route); one Celery round trip of a no-op task, sent, run and its result back, on the same broker
and worker (turn start); the same number of threads doing the raw floor transaction
(throughput); one Celery task per message (burst). Nothing here is asserted: it reports.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

import redis
from kombu import Queue

from agent_router.agents.builder import scripted_models
from agent_router.agents.llm import SCRIPTED_MODEL, Model, ModelFactory
from agent_router.budgeting import NO_LIMITS
from agent_router.domain import Agent, Delivery, MessageType
from agent_router.feed import InProcessSignals, Listener, TeamSignals, Wake
from agent_router.hooks import HookChain, RouterHooks
from agent_router.ops.bench_report import Row, row
from agent_router.ops.floors import (
    Floors,
    MinimalLoopFloor,
    ModelCallFloor,
    SameWorkFloor,
    cpu_per_op,
    ms,
    pct,
    rate,
)
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.turn import Turn
from agent_router.waker import InProcessWaker, RedisWaker

#: Rounds of each rate in :meth:`Bench.throughput`, the floor's and ours alternating.
THROUGHPUT_ROUNDS = 3
#: Transcript lengths at which the router's CPU per model call is measured: it should be flat.
TRANSCRIPT_ENTRIES = (10, 100, 1000)
#: Turns measured per transcript length (after one that warms the worker up), and the model
#: calls each makes: two ``do_work`` calls, then the final reply.
MODEL_CALL_TURNS = 7
MODEL_CALLS_PER_TURN = 3
#: Turns at once (threads of this process, each its own team's lead) in the model call capacity
#: figure, and the model calls per turn there: two ``do_work`` calls, then the final reply.
CAPACITY_THREADS = 4
#: The built-in loop beside a minimal one: model calls of the longer turn, rounds.
MINIMAL_LOOP_CALLS = 9
MINIMAL_LOOP_ROUNDS = 5
#: Request sizes, in thousands of tokens, at which the CPU of one model call through the OpenAI
#: SDK is measured (:func:`request_cpu`), and the calls measured at each.
REQUEST_KTOKENS = (1, 8, 32)
REQUEST_CALLS = 30
#: A transcript entry's text in the model call figures: a short message, as agents send them.
ENTRY_TEXT = (
    "Progress: the login form now posts to /api/session; tests for the reset flow pass, the "
    "mail template still needs review. Next: wire the audit log and re-run the suite. "
)


def _call(i: int, calls: str = "ask") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"{calls}-{i}",
                "type": "function",
                "function": {"name": "ask_master", "arguments": "{}"},
            }
        ],
    }


class Bench:
    def __init__(self, settings: Settings, backend: str, *, samples: int, redis_url: str | None):
        self.settings = settings
        self.backend = backend
        self.samples = samples
        self.redis_url = redis_url
        waker = RedisWaker(redis_url) if redis_url else InProcessWaker()
        self.router = Router(settings, publisher=None, waker=waker)  # routing alone is measured
        self.router.create_schema()
        self.floors = Floors(settings)
        self.rows: list[Row] = []
        # The raw driver's floor, set by measure_floors: (p50, p99) ms, rates by thread count.
        self.raw: tuple[float, float] = (0.0, 0.0)
        self.raw_rate: dict[int, float] = {}
        self.db_round_trip = 0.0

    def close(self) -> None:
        self.floors.close()
        self.router.close()

    # ---------------------------------------------------------------- helpers

    def _team_with(self, n: int, role: str = "Bench") -> int:
        team = self.router.create_team()
        for _ in range(n):
            self.router.create_agent(team.id, role=role)
        return team.id

    def _running(self, team_id: int, name: str) -> Turn:
        self.router.send(team_id, to=name, content="start", sender="user")
        turn = self.router.claim_turn(team_id, name)
        assert turn is not None
        turn.drain()
        return turn

    # ---------------------------------------------------------------- figures

    def _ms_row(self, figure: str, ours: float, floor: float | None, **target: Any) -> Row:
        raw = self.raw[1] if " p99" in figure else self.raw[0]
        return row(figure, self.backend, ours, floor, "ms", raw=raw, **target)

    def measure_floors(self) -> None:
        """Both floor transactions' latency, interleaved: through the raw driver and through our
        engine; one database round trip. (Their rates are measured beside ours, in
        :meth:`throughput`.)"""
        lat = self.floors.latency(self.samples)
        self.raw = lat["raw"]
        self.db_round_trip = self.floors.raw.round_trip()
        for q, i in (("p50", 0), ("p99", 1)):
            for name, key in (("raw driver", "raw"), ("our engine", "engine")):
                self.rows.append(
                    self._ms_row(f"floor transaction {q} ({name})", lat[key][i], self.raw[i])
                )
        self.rows.append(
            self._ms_row("database round trip (SELECT 1, raw driver)", self.db_round_trip, None)
        )

    def route_latency(self) -> None:
        n = self.samples
        f50, f99 = self.raw
        team = self._team_with(n)
        names = [f"Bench_{i + 1}" for i in range(n)]
        idle = [
            ms(partial(self.router.send, team, to=name, content="hi", sender="user"))
            for name in names
        ]
        team_r = self._team_with(1)
        self._running(team_r, "Bench_1")
        running = [
            ms(lambda: self.router.send(team_r, to="Bench_1", content="hi", sender="user"))
            for _ in range(n)
        ]
        team_w = self._team_with(n)
        questions = []
        for i in range(n):
            turn = self._running(team_w, f"Bench_{i + 1}")
            turn.append_assistant(_call(i))
            questions.append(turn.ask("Team Leader", "?", tool_call_id=f"ask-{i}"))
        waiting = [
            ms(
                partial(
                    self.router.send,
                    team_w,
                    to=f"Bench_{i + 1}",
                    content="answer",
                    sender="Team Leader",
                    type=MessageType.ANSWER,
                    question_id=q.id,
                )
            )
            for i, q in enumerate(questions)
        ]
        for label, samples in (("idle", idle), ("running", running), ("waiting", waiting)):
            times = 3 if label == "waiting" else 2
            self.rows.append(
                self._ms_row(
                    f"route p50 ({label})",
                    statistics.median(samples),
                    f50,
                    target=f"<= {times}x raw floor",
                    limit=times * f50,
                )
            )
            self.rows.append(self._ms_row(f"route p99 ({label})", pct(samples, 0.99), f99))

    def wake_latency(self) -> None:
        """Answer sent -> the blocked ``wait_for`` returns in another thread. Its floor is the
        route of that same answer (until ``send`` returned, in the same samples: a sample
        follows a pause, which slows the route as much as the rest) plus one Redis and one
        database round trip."""
        n = max(20, self.samples // 5)
        if self.redis_url:
            client = redis.Redis.from_url(self.redis_url)
            rtt = statistics.median(ms(client.ping) for _ in range(n))
            client.close()
        else:
            rtt = 0.0
        team = self._team_with(n)
        samples: list[float] = []
        routes: list[float] = []
        for i in range(n):
            name = f"Bench_{i + 1}"
            turn = self._running(team, name)
            turn.append_assistant(_call(i))
            q = turn.ask("Team Leader", "?", tool_call_id=f"ask-{i}")
            returned = threading.Event()
            done_at: list[float] = []

            def wait(
                turn: Turn = turn,
                q: Any = q,
                done_at: list[float] = done_at,
                returned: threading.Event = returned,
            ) -> None:
                turn.wait_for(q, block_seconds=30)
                done_at.append(time.perf_counter())
                returned.set()

            waiter = threading.Thread(target=wait)
            waiter.start()
            time.sleep(0.005)  # let it block
            sent = time.perf_counter()
            self.router.send(
                team,
                to=name,
                content="answer",
                sender="Team Leader",
                type=MessageType.ANSWER,
                question_id=q.id,
            )
            routes.append((time.perf_counter() - sent) * 1000)
            returned.wait(30)
            waiter.join()
            samples.append((done_at[0] - sent) * 1000)
        floor = rtt + statistics.median(routes) + self.db_round_trip
        self.rows.append(
            self._ms_row(
                "wake p50",
                statistics.median(samples),
                floor,
                target="<= route + Redis + database round trip",
                limit=floor,
            )
        )
        self.rows.append(self._ms_row("wake p99", pct(samples, 0.99), floor))

    def feed_wake_latency(self) -> None:
        """A send to the lead committed -> the reader blocked in :meth:`Router.events` (in
        another thread, ``wait=30``) returns holding it: the commit's time is taken by a hook
        (hooks run after the commit, before the feed's signal is published), so the figure
        is the publish, its delivery to the reader and the reader's one read of the feed. Its
        floor is a raw Redis ``PUBLISH`` -> ``get_message`` of a subscriber blocked in another
        thread, the two alternating, sample by sample; with them, one read of the feed alone
        (:meth:`Router.events` without a wait, finding nothing new). Redis only."""
        if not self.redis_url:
            return
        n = self.samples
        team = self._team_with(0)
        self._running(team, "Team Leader")
        cursor = max(item.cursor for item in self.router.events(team))
        commits = _CommitClock()
        assert isinstance(self.router.hooks, HookChain)  # Router always chains its hooks
        self.router.hooks.hooks.insert(0, commits)
        signals = self.router.signals
        watched = _WatchedSignals(signals)
        self.router.signals = watched
        client = redis.Redis.from_url(self.redis_url)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(f"agent_router:bench:{uuid.uuid4().hex}")
        pubsub.get_message(timeout=2.0)  # the confirmation
        channel = next(iter(pubsub.channels)).decode()
        ours: list[float] = []
        floor: list[float] = []
        reads: list[float] = []  # the reader's one read after its wake, alone
        try:
            for i in range(n):
                floor.append(_pubsub_round_trip(client, pubsub, channel))
                reads.append(ms(partial(self.router.events, team, after=cursor)))
                waiting = threading.Event()
                watched.waiting = waiting
                got: list[tuple[float, list[Any]]] = []

                def read(cursor: int = cursor, got: list[tuple[float, list[Any]]] = got) -> None:
                    items = self.router.events(team, after=cursor, wait=30)
                    got.append((time.perf_counter(), items))

                reader = threading.Thread(target=read)
                reader.start()
                if not waiting.wait(30):
                    raise TimeoutError("the feed reader never waited")
                content = f"feed {i}"
                self.router.send(team, to="Team Leader", content=content, sender="user")
                reader.join(30)
                if not got:
                    raise TimeoutError("the feed reader did not return")
                done, items = got[0]
                if not any(item.content == content for item in items):
                    raise RuntimeError("the feed reader returned without the message")
                ours.append((done - commits.last) * 1000)
                cursor = max(item.cursor for item in items)
        finally:
            self.router.signals = signals
            self.router.hooks.hooks.remove(commits)
            pubsub.close()
            client.close()
        figure = "feed wake {} (commit -> reader holds it)"
        self.rows.append(
            self._ms_row(figure.format("p50"), statistics.median(ours), statistics.median(floor))
        )
        self.rows.append(self._ms_row(figure.format("p99"), pct(ours, 0.99), pct(floor, 0.99)))
        alone = "feed read p50 (events after a cursor, no wait)"
        self.rows.append(self._ms_row(alone, statistics.median(reads), None))

    def feed_signal_cost(self) -> None:
        """A send to a running lead with the team's feed signal (one Redis ``PUBLISH``) and
        with the router's signals in process (what it uses without Redis: no network), the two
        alternating sample by sample, and a raw ``PUBLISH`` of the same size beside them; the
        difference of the p50s is the signal's cost on the send path. Redis only."""
        if not self.redis_url:
            return
        n = self.samples
        team = self._team_with(0)
        self._running(team, "Team Leader")
        signals = self.router.signals
        quiet = InProcessSignals()
        client = redis.Redis.from_url(self.redis_url)
        channel = f"agent_router:bench:{uuid.uuid4().hex}"
        send = partial(self.router.send, team, to="Team Leader", content="hi", sender="user")
        on: list[float] = []
        off: list[float] = []
        publish: list[float] = []
        try:
            for i in range(n):
                for with_signal in (True, False) if i % 2 else (False, True):
                    self.router.signals = signals if with_signal else quiet
                    (on if with_signal else off).append(ms(send))
                publish.append(ms(partial(client.publish, channel, b"1")))
        finally:
            self.router.signals = signals
            client.close()
        f50 = self.raw[0]
        on50, off50 = statistics.median(on), statistics.median(off)
        self.rows.append(self._ms_row("route p50 (to the lead, feed signal off)", off50, f50))
        self.rows.append(self._ms_row("route p50 (to the lead, feed signal on)", on50, off50))
        self.rows.append(
            self._ms_row(
                "feed signal cost p50 (route on - off)", on50 - off50, statistics.median(publish)
            )
        )

    def throughput(self) -> None:
        """Routed messages per second with 1, 4 and 16 senders (to running agents), each beside
        the same number of threads running the raw floor transaction (with 4, also through our
        engine). They alternate, ``THROUGHPUT_ROUNDS`` rounds each, so that all see the same
        machine; each figure is the median of its rounds."""
        total = max(1000, self.samples * 5)
        for threads in (1, 4, 16):
            team = self._team_with(threads)
            for i in range(threads):
                self._running(team, f"Bench_{i + 1}")
                self.floors.raw.run(i)  # connections opened outside the timing
            per = total // threads

            def send(i: int, team: int = team) -> None:
                self.router.send(team, to=f"Bench_{i + 1}", content="m", sender="user")

            runs: dict[str, Callable[[int], None]] = {"raw": self.floors.raw.run, "ours": send}
            same_work: SameWorkFloor | None = None
            if threads == 4:
                runs["engine"] = self.floors.engine.run
                agents = [a.id for a in self.router.agents(team) if not a.is_lead]
                same_work = SameWorkFloor(self.settings, agents)
                runs["same work"] = same_work.run
            rates: dict[str, list[float]] = {name: [] for name in runs}
            # With 4: the CPU per operation of ours and the raw floor's, client and server.
            cpu: dict[tuple[str, str], list[float | None]] = {}
            for _ in range(THROUGHPUT_ROUNDS):
                for name, fn in runs.items():
                    if threads == 4 and name in ("raw", "ours"):
                        ops, client, server = cpu_per_op(threads, per, fn, self.floors.server_cpu)
                        cpu.setdefault((name, "client"), []).append(client)
                        cpu.setdefault((name, "server"), []).append(server)
                    else:
                        ops = rate(threads, per, fn)
                    rates[name].append(ops)
            self._cpu_rows(cpu)
            ours = statistics.median(rates["ours"])
            base = self.raw_rate[threads] = statistics.median(rates["raw"])
            floor = base
            target: dict[str, Any] = {}
            if same_work is not None:
                same_work.close()
                floor = statistics.median(rates["same work"])
                target = {
                    "target": ">= 0.9x same-work floor, 4 threads",
                    "limit": 0.9 * floor,
                    "at_least": True,
                }
                self.rows.append(
                    row(
                        "same-work floor transactions/s, 4 threads (raw driver)",
                        self.backend,
                        floor,
                        floor,
                        "tx/s",
                        raw=base,
                    )
                )
            if threads == 4:
                engine_rate = statistics.median(rates["engine"])
                for name, value in (("raw driver", base), ("our engine", engine_rate)):
                    self.rows.append(
                        row(
                            f"floor transactions/s, 4 threads ({name})",
                            self.backend,
                            value,
                            base,
                            "tx/s",
                            raw=base,
                        )
                    )
            self.rows.append(
                row(
                    f"routed msgs/s ({threads} senders)",
                    self.backend,
                    ours,
                    floor,
                    "msg/s",
                    raw=base,
                    **target,
                )
            )

    def _cpu_rows(self, cpu: dict[tuple[str, str], list[float | None]]) -> None:
        """The CPU a send cost with four senders, beside the raw floor transaction's, each the
        median of its rounds: this process's, and the database server's when it runs on this
        machine (the ratio of ours to the raw floor's throughput follows from their sum, on a
        machine where the client and the server share the cores)."""
        for side in ("client", "server"):
            ours = [v for v in cpu.get(("ours", side), []) if v is not None]
            raw = [v for v in cpu.get(("raw", side), []) if v is not None]
            if len(ours) < THROUGHPUT_ROUNDS or len(raw) < THROUGHPUT_ROUNDS:
                continue  # not measured (not 4 senders, or a server not on this machine)
            mine, floor = statistics.median(ours), statistics.median(raw)
            self.rows.append(
                row(f"{side} CPU per send (4 senders)", self.backend, mine, floor, "us", raw=floor)
            )

    def fan_out(self) -> None:
        """One sender briefing eight running agents per ``send_many``: one transaction each."""
        team = self._team_with(8)
        for i in range(8):
            self._running(team, f"Bench_{i + 1}")
        batch = [{"to": f"Bench_{i + 1}", "content": "brief"} for i in range(8)]
        rounds = max(25, self.samples // 4)
        start = time.perf_counter()
        for _ in range(rounds):
            self.router.send_many(team, batch, sender="user")
        ours = rounds * len(batch) / (time.perf_counter() - start)
        base = self.raw_rate[1]
        self.rows.append(
            row(
                "routed msgs/s (send_many of 8, 1 sender)",
                self.backend,
                ours,
                base,
                "msg/s",
                raw=base,
            )
        )

    def drain(self, queued: int) -> None:
        team = self._team_with(1)
        agent = self.router.agent(team, "Bench_1")
        turn = self._running(team, "Bench_1")
        self.router.seed_mailbox(agent.id, queued, content="queued message")
        half = queued // 2
        drained = 0
        start = time.perf_counter()
        while drained < half:
            drained += len(turn.drain())
        per_message_us = (time.perf_counter() - start) / drained * 1e6
        tracemalloc.start()
        while turn.drain():
            pass
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        self.rows.append(row("drain cost per message", self.backend, per_message_us, None, "us"))
        self.rows.append(
            row(
                f"drain peak memory, {queued} queued (batches of {self.settings.drain_batch_size})",
                self.backend,
                peak / 2**20,
                None,
                "MiB",
            )
        )

    def model_calls(self) -> None:
        """The router's own CPU for one model call (reading the transcript, building the
        request, the protocol section, the checks, the token counts, compaction) at 10, 100
        and 1,000 transcript entries, the model answering at once: the median of several
        turns, in microseconds (``do_work`` takes no time here). Twice: with the agent's
        request window kept in the process between turns, and let go (a worker that keeps one
        agent ran another's turn in between, so each turn builds the window again)."""
        for let_go in (False, True):
            update = {"work_seconds": 0.0} | ({"transcript_cache_agents": 1} if let_go else {})
            router = Router(
                self.settings.model_copy(update=update), publisher=None, waker=InProcessWaker()
            )
            how = ", window let go" if let_go else ""
            try:
                for entries in TRANSCRIPT_ENTRIES:
                    per_call, _ = model_call_cpu(router, entries, let_go=let_go)
                    self.rows.append(
                        row(
                            f"router CPU per model call ({entries:,} transcript entries{how})",
                            self.backend,
                            statistics.median(per_call) * 1e6,
                            None,
                            "us",
                        )
                    )
            finally:
                router.close()

    def model_call_capacity(self) -> None:
        """What a model call costs the database: the statements a turn of the built-in loop
        sends, counted at the driver (per model call: the difference between a turn of four
        model calls and a turn of one, over three; and per turn), and the model calls per
        second the database sustains with the built-in loop and an :class:`InstantModel`,
        ``CAPACITY_THREADS`` turns at once in this process (each a team's lead: no report
        to send), beside the same-work floor (:class:`ModelCallFloor`: the rows a model call
        must write, by hand through the raw driver, in the two transactions it must make).
        The two alternate, ``THROUGHPUT_ROUNDS`` rounds each; each figure is the median."""
        settings = self.settings.model_copy(update={"work_seconds": 0.0})
        router = Router(settings, publisher=None, waker=InProcessWaker())
        try:
            counted = {calls: turn_statements(router, calls) for calls in (1, 4)}
            # The bounds hold on PostgreSQL, where a transition is one statement.
            bound = not settings.is_sqlite
            per_call = (counted[4] - counted[1]) / 3
            self.rows.append(self._statements_row("model call", per_call, 2 if bound else None))
            for calls, sent in counted.items():
                what = f"turn of {calls} model call{'s' if calls > 1 else ''}"
                # Its transitions; its end writes the lead's answer to the user.
                self.rows.append(self._statements_row(what, sent, 2 * calls + 1 if bound else None))
            self._capacity(router, settings)
        finally:
            router.close()

    def minimal_loop(self) -> None:
        """The built-in loop's wall time per model call beside a minimal loop's
        (:class:`MinimalLoopFloor`: the SQL a minimal agent loop that reads the mailbox
        between calls must send, by hand through the raw driver), one turn at a time in this
        process, the model the same :class:`InstantModel` (the floor's agent is another team's
        lead, its turn claimed and left running). Ours: a turn of
        ``MINIMAL_LOOP_CALLS`` model calls less a turn of one, per call in between (the claim
        and the end left out, as the floor has none); the floor: as many calls. They
        alternate, ``MINIMAL_LOOP_ROUNDS`` rounds; each figure is the median. The design
        target: within twice the floor. PostgreSQL only (the floor's statements are its)."""
        if self.settings.is_sqlite:
            return
        from agent_router.agents.loop import claim, run_turn
        from agent_router.agents.tools import default_registry

        settings = self.settings.model_copy(update={"work_seconds": 0.0})
        router = Router(settings, publisher=None, waker=InProcessWaker())
        tools = default_registry()
        lead = router.create_team(budget=NO_LIMITS).lead

        def turn_of(calls: int) -> tuple[float, int]:
            router.send(lead.team_id, to=lead.display_name, content=ENTRY_TEXT, sender="user")
            began = time.perf_counter()
            turn = claim(router, lead.id)
            assert turn is not None
            model = InstantModel(calls - 1)
            run_turn(router, turn, models=partial(_same_model, model), tools=tools)
            return time.perf_counter() - began, turn.id

        turn_of(MINIMAL_LOOP_CALLS)  # warms the process up
        # The floor's agent, of a team of its own: the only writer of its transcript.
        other = router.create_team(budget=NO_LIMITS).lead
        router.send(other.team_id, to=other.display_name, content=ENTRY_TEXT, sender="user")
        held = claim(router, other.id)
        assert held is not None
        floor = MinimalLoopFloor(settings, other.id, held.id, InstantModel(10**9).complete)
        calls = MINIMAL_LOOP_CALLS - 1
        ours: list[float] = []
        floors: list[float] = []
        try:
            floor.run()  # its connection opened
            for _ in range(MINIMAL_LOOP_ROUNDS):
                long, _ = turn_of(MINIMAL_LOOP_CALLS)
                short, _ = turn_of(1)
                ours.append((long - short) / calls * 1000)
                began = time.perf_counter()
                for _ in range(calls):
                    floor.run()
                floors.append((time.perf_counter() - began) / calls * 1000)
        finally:
            floor.close()
            router.close()
        same = statistics.median(floors)
        self.rows.append(self._ms_row("minimal loop, wall per model call", same, same))
        self.rows.append(
            self._ms_row(
                "built-in loop, wall per model call",
                statistics.median(ours),
                same,
                target="<= 2x the minimal loop",
                limit=2 * same,
            )
        )

    def _statements_row(self, what: str, sent: float, bound: int | None) -> Row:
        target: dict[str, Any] = {} if bound is None else {"target": f"<= {bound}", "limit": bound}
        return row(f"statements per {what} (counted)", self.backend, sent, None, "stmts", **target)

    def _capacity(self, router: Router, settings: Settings) -> None:
        from agent_router.agents.loop import run_turn
        from agent_router.agents.tools import default_registry

        tools = default_registry()
        leads = [router.create_team(budget=NO_LIMITS).lead for _ in range(CAPACITY_THREADS)]

        def turn_of(i: int) -> None:
            one_turn(i)

        def one_turn(i: int) -> int:
            lead = leads[i]
            router.send(lead.team_id, to=lead.display_name, content=ENTRY_TEXT, sender="user")
            turn = router.claim(lead.id)
            assert turn is not None
            model = InstantModel()
            run_turn(router, turn, models=partial(_same_model, model), tools=tools)
            return turn.id

        floor = ModelCallFloor(settings, [(lead.id, one_turn(i)) for i, lead in enumerate(leads)])
        turns = max(2, self.samples // 20)
        runs: dict[str, Callable[[], float]] = {
            "ours": lambda: MODEL_CALLS_PER_TURN * rate(CAPACITY_THREADS, turns, turn_of),
            "floor": lambda: rate(CAPACITY_THREADS, turns * MODEL_CALLS_PER_TURN, floor.run),
        }
        rates: dict[str, list[float]] = {name: [] for name in runs}
        try:
            for _ in range(THROUGHPUT_ROUNDS):
                for name, measure in runs.items():
                    rates[name].append(measure())
        finally:
            floor.close()
        ours, same = (statistics.median(rates[name]) for name in ("ours", "floor"))
        how = f"{CAPACITY_THREADS} turns at once"
        self.rows.append(
            row(f"same-work floor model calls/s ({how})", self.backend, same, same, "calls/s")
        )
        self.rows.append(
            row(f"model calls/s, built-in loop ({how})", self.backend, ours, same, "calls/s")
        )

    def request_figures(self) -> None:
        """The router's CPU for one model call through the OpenAI SDK at 1k, 8k and 32k-token
        requests, beside the same request's JSON encoding alone (its floor); the target: at
        32k tokens within twice the figure at 1k."""
        figures = request_cpu(self.settings)
        if figures is None:
            return  # the SDK is not installed: nothing to measure
        first = figures[REQUEST_KTOKENS[0]][0]
        for ktokens, (ours, floor) in figures.items():
            target: dict[str, Any] = {}
            if ktokens == REQUEST_KTOKENS[-1]:
                target = {"target": f"<= 2x the {REQUEST_KTOKENS[0]}k figure", "limit": 2 * first}
            self.rows.append(
                row(
                    f"router CPU per model call ({ktokens}k-token request, OpenAI SDK)",
                    self.backend,
                    ours,
                    floor,
                    "us",
                    **target,
                )
            )

    def celery_figures(self) -> None:
        """Turn start latency and the burst, with a real worker on the configured broker."""
        from agent_router.worker import runtime
        from agent_router.worker.threaded import thread_worker

        queue = f"agent_router.ops.bench.{uuid.uuid4().hex[:8]}"
        # The scripted model's final reply takes a quarter second to "write" (a short streamed
        # answer; real model calls take seconds), so that a burst lands on a running turn as it
        # does in production, not between turns of a model that answers in no time. Turn start
        # is measured at the claim, before any model call.
        settings = self.settings.model_copy(
            update={
                "queue": queue,
                "scripted_write_seconds": 0.25,
                "work_seconds": 0.0,
                "openai_model": SCRIPTED_MODEL,  # every agent of the run on the scripted model
            }
        )
        calls = _FirstCallClock(scripted_models(settings))
        rt = runtime.configure(settings, models=calls)
        noop = _NoopTask(rt.app, queue)
        n = max(20, self.samples // 5)
        try:
            with thread_worker(rt.app, concurrency=4, queues=[queue], shutdown_timeout=30.0):
                # A turn start and a floor round trip alternate, so that both see the same
                # machine, and each is sent after the same idle pause, as long as a turn of
                # settings.scripted_write_seconds (on a virtual machine a pause slows the next
                # steps, Celery's as much as ours).
                pause = settings.scripted_write_seconds
                back_to_back = [noop.round_trip() for _ in range(n)]
                floor: list[float] = []

                def floor_then_pause() -> None:
                    floor.append(noop.round_trip(after=pause))
                    time.sleep(pause)

                ours, first_calls = _turn_starts(
                    rt.router, n, before_each=floor_then_pause, calls=calls
                )
                trip = statistics.median(floor)
                p50 = self._ms_row(
                    "turn start p50",
                    statistics.median(ours),
                    trip,
                    target="<= Celery round trip + 2 ms",
                    limit=trip + 2.0,
                )
                trip99 = pct(floor, 0.99)
                p99 = self._ms_row("turn start p99", pct(ours, 0.99), trip99)
                # The same samples: the message sent -> the model called with it, beside the
                # same floor figures as the turn start's.
                first = [
                    self._ms_row(
                        "send -> first model call p50", statistics.median(first_calls), trip
                    ),
                    self._ms_row("send -> first model call p99", pct(first_calls, 0.99), trip99),
                ]
                rt_row = self._ms_row(
                    "Celery round trip p50, back to back", statistics.median(back_to_back), None
                )
                turns = _burst_turns(rt.router)
                noop.run_many(100)  # the baseline: one task per message
                burst = row("turns fired for a burst of 100", self.backend, turns, 100, "turns")
                self.rows.extend([p50, p99, *first, rt_row, burst])
        finally:
            runtime.reset()
            with rt.app.connection_for_write() as conn:
                Queue(queue, channel=conn.default_channel).delete()


class InstantModel:
    """A model that answers at once and reads nothing: ``calls`` ``do_work`` calls, then a
    final reply. What a model call costs then is the router's own work alone."""

    def __init__(self, calls: int = MODEL_CALLS_PER_TURN - 1) -> None:
        self.tool_calls = calls
        self.calls = 0

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.tool_calls:
            call = {
                "id": f"instant_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": "do_work", "arguments": '{"step": "one step"}'},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"role": "assistant", "content": "Done."}


def _same_model(model: InstantModel, _agent: object) -> InstantModel:
    return model


def model_call_cpu(
    router: Router, entries: int, *, turns: int = MODEL_CALL_TURNS, let_go: bool = False
) -> tuple[list[float], int]:
    """Process CPU seconds per model call of ``turns`` turns of an agent whose transcript holds
    about ``entries`` entries (an :class:`InstantModel`, in this process), after one turn that
    warms the worker up; and the model calls made. Each turn appends a few entries more.
    ``let_go``: another agent's turn (not measured) runs before each, so that a router which
    keeps one agent's window builds this one's again."""
    from agent_router.agents.loop import run_turn
    from agent_router.agents.tools import default_registry

    tools = default_registry()
    team = router.create_team()
    agent = router.create_agent(team.id, role="Bench")
    # The transcript: the system prompt, the messages drained by the warm-up turn.
    router.seed_mailbox(agent.id, max(0, entries - 3), content=ENTRY_TEXT)
    other = router.create_agent(team.id, role="Bench") if let_go else None
    per_call: list[float] = []
    calls = 0
    for sample in range(turns + 1):
        if other is not None:
            router.send(team.id, to=other.display_name, content=ENTRY_TEXT, sender="user")
            other_turn = router.claim_turn(team.id, other.display_name)
            assert other_turn is not None
            run_turn(router, other_turn, models=partial(_same_model, InstantModel()), tools=tools)
        router.send(team.id, to=agent.display_name, content=ENTRY_TEXT, sender="user")
        turn = router.claim_turn(team.id, agent.display_name)
        assert turn is not None
        model = InstantModel()
        start = time.process_time()
        run_turn(router, turn, models=partial(_same_model, model), tools=tools)
        spent = time.process_time() - start
        if sample:  # the first turn drains the seeded messages and warms the worker up
            per_call.append(spent / model.calls)
            calls += model.calls
    return per_call, calls


#: The tool the requests of :func:`request_cpu` offer.
_BENCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "do_work",
        "description": "Do one step of the task.",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "string", "description": "The step."}},
            "required": ["step"],
        },
    },
}


def request_messages_of(tokens: int) -> list[dict[str, Any]]:
    """A transcript of about ``tokens`` tokens (as :func:`estimate_tokens` counts them): a
    system prompt, then rounds of a drained message, a tool call and its result."""
    from agent_router.agents.context import count_tokens

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a bench agent."}]
    i = 0
    while count_tokens(messages) < tokens:
        i += 1
        messages += [
            {"role": "user", "content": f"{ENTRY_TEXT}{i}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "do_work", "arguments": '{"step": "one step"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": ENTRY_TEXT * 3},
        ]
    return messages


def request_cpu(
    settings: Settings, *, calls: int = REQUEST_CALLS
) -> dict[int, tuple[float, float]] | None:
    """Per request size (:data:`REQUEST_KTOKENS`): the CPU seconds of the calling thread for
    one :class:`~agent_router.agents.openai_model.OpenAIModel` call (mapping the request,
    fitting it to the window, the SDK, HTTP, reading the reply) against a server on loopback
    that answers at once, and of the same request body's JSON encoding alone, each the median
    of ``calls``, in microseconds. The server runs in another thread: its CPU is not counted.
    ``None`` when the SDK is not installed."""
    from agent_router.agents.openai_model import OpenAIModel

    try:
        import openai  # noqa: F401
    except ImportError:
        return None
    server = _AnsweringServer()
    tools = [_BENCH_TOOL]
    figures: dict[int, tuple[float, float]] = {}
    try:
        model_settings = settings.model_copy(
            update={
                "openai_model": "bench-model",
                "openai_base_url": server.base_url,
                "openai_api_key": "bench",
                "openai_max_retries": 0,
            }
        )
        model = OpenAIModel(model_settings)
        try:
            for ktokens in REQUEST_KTOKENS:
                messages = request_messages_of(ktokens * 1000)
                body = {"model": "bench-model", "messages": messages, "tools": tools}
                ours: list[float] = []
                floor: list[float] = []
                for _ in range(calls + 1):
                    start = time.thread_time()
                    model.respond(messages, tools)
                    ours.append(time.thread_time() - start)
                    start = time.thread_time()
                    json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
                    floor.append(time.thread_time() - start)
                # The first call warms the client (its connection, the SDK's caches) up.
                figures[ktokens] = (
                    statistics.median(ours[1:]) * 1e6,
                    statistics.median(floor[1:]) * 1e6,
                )
        finally:
            model.close()
    finally:
        server.stop()
    return figures


class _AnsweringServer:
    """A Chat Completions server on loopback that answers every request at once with the same
    short reply, in a thread of its own."""

    REPLY = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "bench-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Done."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        reply = self.REPLY

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a call costs no new connection

            def setup(self) -> None:
                super().setup()
                # The reply's head and body are two writes: without this, a delayed ACK holds
                # the second one back for tens of milliseconds.
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


class _NoopTask:
    """A no-op Celery task on the bench's queue: the floor of turn start is one Celery round
    trip of it."""

    def __init__(self, app: Any, queue: str) -> None:
        self.app = app
        self.queue = queue
        self.started: dict[str, float] = {}
        started = self.started

        # shared=False: Celery shares app.task tasks with every app by default, and a second
        # bench run in the process would reach the first run's closure.
        @app.task(name="agent_router.bench_noop", bind=True, shared=False)  # type: ignore[untyped-decorator]
        def noop(task: Any) -> None:
            started[task.request.id] = time.perf_counter()

        self.task = noop

    def round_trip(self, *, after: float = 0.0) -> float:
        """One no-op task sent, run, its result back (through the result backend; the embedded
        broker has none, so there the task's start, seen in this process, ends the trip), ms;
        sent ``after`` seconds of pause."""
        time.sleep(after)
        sent = time.perf_counter()
        if self.app.conf.result_backend:
            self.task.apply_async(queue=self.queue, ignore_result=False).get(timeout=30)
        else:
            task_id = self.task.apply_async(queue=self.queue).id
            _until(partial(self.started.__contains__, task_id))
        return (time.perf_counter() - sent) * 1000

    def run_many(self, count: int) -> None:
        """``count`` tasks, one per message, run to their start."""
        before = len(self.started)
        for _ in range(count):
            self.task.apply_async(queue=self.queue)
        _until(lambda: len(self.started) - before >= count, timeout=120)


def _turn_starts(
    router: Router, n: int, *, before_each: Callable[[], None], calls: _FirstCallClock
) -> tuple[list[float], list[float]]:
    """Message to an idle agent -> its turn claimed by the worker, and -> its first model call
    (which holds the message), ``n`` times, ms; each sample after ``before_each()`` returned."""
    team = router.create_team()
    agents = [router.create_agent(team.id, role="Bench") for _ in range(n)]
    # The worker in this process tells when it claimed (a hook, no polling: a probe
    # querying the database every millisecond would slow the very claim it watches).
    clock = _ClaimClock()
    assert isinstance(router.hooks, HookChain)  # Router always chains its hooks
    router.hooks.hooks.insert(0, clock)  # before the task events: only the claim
    ours: list[float] = []
    first: list[float] = []
    for agent in agents:
        before_each()
        sent = time.perf_counter()
        router.send(team.id, to=agent.display_name, content="go", sender="user")
        ours.append((clock.wait(agent.id) - sent) * 1000)
        first.append((calls.wait(agent.id) - sent) * 1000)
        # The next sample starts with every worker slot free, as the floor's does.
        _until(partial(_team_resting, router, team.id))
    return ours, first


def _burst_turns(router: Router) -> int:
    """Turns fired for a burst of 100 messages to one idle agent, sent as fast as the API takes
    them (eight senders at once)."""
    burst_team = router.create_team()
    router.create_agent(burst_team.id, role="Bench")
    target = router.agent(burst_team.id, "Bench_1")
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(
            pool.map(
                lambda k: router.send(burst_team.id, to="Bench_1", content=f"m{k}", sender="user"),
                range(100),
            )
        )
    _until(
        lambda: (
            router.agent(burst_team.id, "Bench_1").state.value == "completed"
            and router.agent(burst_team.id, "Bench_1").mailbox_depth == 0
        ),
        timeout=120,
    )
    return len(router.reads.turns(target.id))


def _team_resting(router: Router, team_id: int) -> bool:
    return all(a.state.value in ("idle", "completed") for a in router.agents(team_id))


class _ClaimClock(RouterHooks):
    """When each agent's first turn was claimed (``perf_counter``), as the worker reports it."""

    def __init__(self) -> None:
        self._claimed: dict[int, float] = {}
        self._changed = threading.Condition()

    def after_claim(self, turn: Turn) -> None:
        with self._changed:
            self._claimed.setdefault(turn.record.agent_id, time.perf_counter())
            self._changed.notify_all()

    def wait(self, agent_id: int, timeout: float = 120.0) -> float:
        with self._changed:
            if not self._changed.wait_for(lambda: agent_id in self._claimed, timeout):
                raise TimeoutError(f"no turn of agent {agent_id} was claimed")
            return self._claimed[agent_id]


class _CommitClock(RouterHooks):
    """When the last routed message was committed (``perf_counter``): hooks run after the
    commit."""

    def __init__(self) -> None:
        self.last = 0.0

    def after_route(self, team_id: int, sender: str, delivery: Delivery) -> None:
        self.last = time.perf_counter()


class _WatchedSignals:
    """A router's feed signals that set ``waiting`` when a reader begins to wait on them (it
    has listened and read the feed: a signal sent from here on wakes it)."""

    def __init__(self, signals: TeamSignals) -> None:
        self._signals = signals
        self.waiting = threading.Event()

    def notify(self, team_id: int) -> None:
        self._signals.notify(team_id)

    def say(self, team_id: int, delta: Mapping[str, Any]) -> None:
        self._signals.say(team_id, delta)

    @contextmanager
    def listen(self, team_id: int) -> Iterator[Listener]:
        with self._signals.listen(team_id) as listener:
            yield _WatchedListener(listener, self.waiting)


class _WatchedListener:
    def __init__(self, listener: Listener, waiting: threading.Event) -> None:
        self._listener = listener
        self._waiting = waiting

    @property
    def live(self) -> bool:
        return self._listener.live

    def wait(self, timeout: float) -> Wake | None:
        self._waiting.set()
        return self._listener.wait(timeout)


def _pubsub_round_trip(client: redis.Redis, pubsub: Any, channel: str) -> float:
    """A raw ``PUBLISH`` -> the ``get_message`` of ``pubsub`` (subscribed to ``channel``)
    returning it in another thread, ms."""
    waiting = threading.Event()
    done: list[float] = []

    def read() -> None:
        waiting.set()
        message = pubsub.get_message(timeout=30)
        if message is not None:
            done.append(time.perf_counter())

    reader = threading.Thread(target=read)
    reader.start()
    waiting.wait(30)
    sent = time.perf_counter()
    client.publish(channel, b"1")
    reader.join(30)
    if not done:
        raise RuntimeError("the raw subscriber got no message")
    return (done[0] - sent) * 1000


class _FirstCallClock:
    """A model factory (``models``, the worker's) that tells when each agent's model was first
    called (``perf_counter``), as the worker's loop calls it."""

    def __init__(self, models: ModelFactory) -> None:
        self._models = models
        self._called: dict[int, float] = {}
        self._changed = threading.Condition()

    def __call__(self, agent: Agent) -> Model:
        return _Clocked(self, agent.id, self._models(agent))

    def called(self, agent_id: int) -> None:
        with self._changed:
            self._called.setdefault(agent_id, time.perf_counter())
            self._changed.notify_all()

    def wait(self, agent_id: int, timeout: float = 120.0) -> float:
        with self._changed:
            if not self._changed.wait_for(lambda: agent_id in self._called, timeout):
                raise TimeoutError(f"the model of agent {agent_id} was never called")
            return self._called[agent_id]


class _Clocked:
    """A model that tells :class:`_FirstCallClock` when it is called, then answers as
    ``model``."""

    def __init__(self, clock: _FirstCallClock, agent_id: int, model: Model) -> None:
        self._clock, self._agent_id, self._model = clock, agent_id, model
        self.model_name = getattr(model, "model_name", None)

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self._clock.called(self._agent_id)
        return self._model.complete(messages, tools)


def turn_statements(router: Router, calls: int) -> int:
    """The statements the store sends (counted at the driver) for one turn of ``calls`` model
    calls of an :class:`InstantModel` (``do_work`` calls between them), from the claim of a
    team's lead to its end (its final reply is its answer to the user: one send), after one
    turn of the same agent that warms this process up."""
    from agent_router.agents.loop import claim, run_turn
    from agent_router.agents.tools import default_registry

    tools = default_registry()
    lead = router.create_team(budget=NO_LIMITS).lead

    def turn() -> None:
        turn = claim(router, lead.id)
        assert turn is not None
        model = InstantModel(calls - 1)
        run_turn(router, turn, models=partial(_same_model, model), tools=tools)

    router.send(lead.team_id, to=lead.display_name, content=ENTRY_TEXT, sender="user")
    turn()  # warms the process up
    router.send(lead.team_id, to=lead.display_name, content=ENTRY_TEXT, sender="user")
    with router.reads.statements() as sent:
        turn()
    return len(sent)


def _until(probe: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.001)
    raise TimeoutError("benchmark condition not reached")


@contextmanager
def _bench(
    settings: Settings, backend: str, samples: int, redis_url: str | None
) -> Iterator[Bench]:
    bench = Bench(settings, backend, samples=samples, redis_url=redis_url)
    try:
        yield bench
    finally:
        bench.close()


def run(
    *,
    postgres_url: str | None,
    redis_url: str | None,
    sqlite_path: str,
    samples: int = 200,
    queued: int = 100_000,
) -> list[Row]:
    """Run every figure on the embedded default (SQLite + memory://) and, when given, on
    PostgreSQL + Redis."""
    rows: list[Row] = []
    targets: list[tuple[str, Settings, str | None]] = [
        (
            "embedded",
            Settings(database_url=f"sqlite:///{sqlite_path}", broker_url="memory://"),
            None,
        )
    ]
    if postgres_url and redis_url:
        targets.append(
            (
                "postgresql+redis",
                Settings(database_url=postgres_url, broker_url=redis_url, redis_url=redis_url),
                redis_url,
            )
        )
    for backend, settings, redis_for_wake in targets:
        with _bench(settings, backend, samples, redis_for_wake) as bench:
            bench.measure_floors()
            bench.route_latency()
            bench.wake_latency()
            bench.feed_wake_latency()
            bench.feed_signal_cost()
            bench.throughput()
            bench.fan_out()
            bench.celery_figures()
            bench.drain(queued)
            bench.model_calls()
            bench.model_call_capacity()
            bench.minimal_loop()
            bench.request_figures()
            rows.extend(bench.rows)
    return rows
