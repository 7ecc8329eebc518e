"""The scale curve: how route, claim and one sweeper pass cost as the stored history grows.

:func:`fill` grows a PostgreSQL database to a given number of stored messages and teams with
set-based statements (``INSERT ... SELECT generate_series`` through psycopg, one transaction per
step), writing rows consistent with what the router itself writes for that history: teams of a
lead and sub-agents at rest (``completed``), ended turns, their delivered messages, one
transcript entry per message, the ledger's route, claim and end events, each turn's published
outbox row, and one answered question per turn. :func:`curve` then measures at each size; the
figures of the smallest size are each later size's floor. Nothing here is asserted.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
import time
from dataclasses import dataclass

import psycopg
import sqlalchemy as sa

from agent_router.ops.bench_report import Row, row
from agent_router.ops.floors import Floors, ms
from agent_router.outbox import RecordingPublisher
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.waker import InProcessWaker

AGENTS_PER_TEAM = 4  # a lead and three sub-agents
MESSAGES_PER_TURN = 10
#: The published curve: 10^4 -> 10^6 stored messages, 10^3 -> 10^4 teams.
DEFAULT_SIZES = ((10_000, 1_000), (100_000, 3_000), (1_000_000, 10_000))


@dataclass(frozen=True)
class Size:
    messages: int
    teams: int


def parse_sizes(text: str) -> list[Size]:
    """``"10000:1000,100000:3000"`` -> sizes (messages:teams), growing."""
    sizes = []
    for part in text.split(","):
        messages, _, teams = part.strip().partition(":")
        if not (messages.isdigit() and teams.isdigit() and int(teams) > 0):
            raise ValueError(f"{part.strip()!r} is not messages:teams (two positive integers)")
        sizes.append(Size(int(messages), int(teams)))
    if any(b.messages < a.messages or b.teams < a.teams for a, b in itertools.pairwise(sizes)):
        raise ValueError("scale sizes must grow: messages:teams,messages:teams,...")
    return sizes


def _dsn(database_url: str) -> str:
    url = sa.engine.make_url(database_url)
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


_ADD_TEAMS = """
WITH t AS (
    INSERT INTO ar_teams (created_at) SELECT now() FROM generate_series(1, %(n)s) RETURNING id
)
INSERT INTO ar_agents (team_id, display_name, role, is_lead, state, suspended, epoch, next_seq,
                       stop_requested, created_at)
SELECT t.id, CASE WHEN k = 0 THEN 'Team Leader' ELSE 'Worker_' || k END,
       CASE WHEN k = 0 THEN 'Team Leader' ELSE 'Worker' END, k = 0,
       'completed'::ar_agent_state, false, 0, 1, false, now()
FROM t, generate_series(0, %(agents)s - 1) AS k
"""

# One step of history for every agent: ``turns`` ended turns of ``per`` messages each.
_ADD_TURNS = """
INSERT INTO ar_turns (team_id, agent_id, epoch, trigger, status, started_at, ended_at)
SELECT a.team_id, a.id, a.epoch + g, 'new'::ar_turn_trigger, 'ended'::ar_turn_status, now(), now()
FROM ar_agents a, generate_series(1, %(turns)s) AS g
"""
_ADD_MESSAGES = """
INSERT INTO ar_messages (team_id, seq, source_name, target_agent_id, type, content, wake,
                         outcome, status, consumed_turn_id, consumed_at, created_at)
SELECT a.team_id, a.next_seq + g - 1, 'user', a.id, 'message'::ar_message_type,
       'history message ' || g, true, 'triggered_new_turn'::ar_route_outcome,
       'delivered'::ar_message_status, t.id, now(), now()
FROM ar_agents a
CROSS JOIN generate_series(1, %(turns)s * %(per)s) AS g
JOIN ar_turns t ON t.agent_id = a.id AND t.epoch = a.epoch + 1 + (g - 1) / %(per)s
"""
_ADD_TRANSCRIPT = """
INSERT INTO ar_transcript_entries (agent_id, position, role, payload, message_id, turn_id,
                                   created_at)
SELECT m.target_agent_id,
       a.next_position - 1 + row_number() OVER (PARTITION BY m.target_agent_id ORDER BY m.seq),
       'user', jsonb_build_object('role', 'user', 'content', m.content), m.id,
       m.consumed_turn_id, now()
FROM ar_messages m JOIN ar_agents a ON a.id = m.target_agent_id WHERE m.id > %(after)s
"""
_ADD_LEDGER = """
INSERT INTO ar_ledger (team_id, agent_id, action, outcome, message_id, turn_id, epoch, detail,
                       created_at)
SELECT m.team_id, m.target_agent_id, 'route'::ar_ledger_action,
       'triggered_new_turn'::ar_route_outcome, m.id, NULL, NULL,
       '{"type": "message", "sender": "user"}'::jsonb, now()
FROM ar_messages m WHERE m.id > %(after)s
UNION ALL
SELECT t.team_id, t.agent_id, e.action::ar_ledger_action, NULL, NULL, t.id, t.epoch,
       '{}'::jsonb, now()
FROM ar_turns t, (VALUES ('turn_claimed'), ('turn_ended')) AS e(action)
WHERE t.id > %(after_turn)s
"""
_ADD_OUTBOX = """
INSERT INTO ar_outbox (team_id, agent_id, kind, epoch, payload, created_at, published_at,
                       attempts)
SELECT t.team_id, t.agent_id, 'enqueue_turn'::ar_outbox_kind, t.epoch,
       '{"trigger": "new"}'::jsonb, now(), now(), 1
FROM ar_turns t WHERE t.id > %(after_turn)s
"""
_ADD_QUESTIONS = """
INSERT INTO ar_questions (team_id, asker_agent_id, target_agent_id, tool_call_id, asker_epoch,
                          status, kind, waiting, answer_message_id, deadline, created_at,
                          closed_at)
SELECT t.team_id, t.agent_id, lead.id, 'call-' || t.id, t.epoch, 'answered'::ar_question_status,
       'ask'::ar_question_kind, false,
       NULL, now(), now(), now()
FROM ar_turns t
JOIN ar_agents lead ON lead.team_id = t.team_id AND lead.is_lead
WHERE t.id > %(after_turn)s
"""
_ADVANCE_AGENTS = """
UPDATE ar_agents SET epoch = epoch + %(turns)s, next_seq = next_seq + %(turns)s * %(per)s,
                     next_position = next_position + %(turns)s * %(per)s
"""


def _scalar(conn: psycopg.Connection[tuple[int]], sql: str) -> int:
    found = conn.execute(sql).fetchone()
    return int(found[0]) if found and found[0] is not None else 0


def fill(database_url: str, size: Size, *, per_turn: int = MESSAGES_PER_TURN) -> float:
    """Grow the database (its schema created) to at least ``size``; returns the seconds taken.
    Every agent receives the same number of ended turns of ``per_turn`` messages."""
    start = time.perf_counter()
    with psycopg.connect(_dsn(database_url)) as conn:
        teams = _scalar(conn, "SELECT count(*) FROM ar_teams")
        if size.teams > teams:
            conn.execute(_ADD_TEAMS, {"n": size.teams - teams, "agents": AGENTS_PER_TEAM})
        agents = _scalar(conn, "SELECT count(*) FROM ar_agents")
        missing = size.messages - _scalar(conn, "SELECT count(*) FROM ar_messages")
        if missing > 0 and agents:
            turns = -(-missing // (agents * per_turn))
            after = _scalar(conn, "SELECT max(id) FROM ar_messages")
            after_turn = _scalar(conn, "SELECT max(id) FROM ar_turns")
            step = {"turns": turns, "per": per_turn, "after": after, "after_turn": after_turn}
            for sql in (
                _ADD_TURNS,
                _ADD_MESSAGES,
                _ADD_TRANSCRIPT,
                _ADD_LEDGER,
                _ADD_OUTBOX,
                _ADD_QUESTIONS,
                _ADVANCE_AGENTS,
            ):
                conn.execute(sql, step)
        conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE")
    return time.perf_counter() - start


class Curve:
    """Route, claim and sweeper pass at each size, on agents of the filled teams."""

    def __init__(self, database_url: str, *, samples: int) -> None:
        self.settings = Settings(database_url=database_url)
        self.samples = samples
        # A publisher that keeps entries in memory: the sweeper pass runs every step, the
        # broker's part is not this curve's.
        self.router = Router(self.settings, publisher=RecordingPublisher(), waker=InProcessWaker())
        self.router.create_schema()
        self.floors = Floors(self.settings)
        self.random = random.Random(7)

    def close(self) -> None:
        self.floors.close()
        self.router.close()

    def measure(self, size: Size) -> dict[str, float]:
        # Read as fill() writes the rows, on a connection of the curve's own.
        with psycopg.connect(_dsn(self.settings.database_url)) as conn:
            agents = conn.execute(
                "SELECT id, team_id, display_name FROM ar_agents "
                "WHERE state = 'completed' ORDER BY id"
            ).fetchall()
        chosen = self.random.sample(agents, min(self.samples, len(agents)))
        route: list[float] = []
        claim: list[float] = []
        for agent_id, team_id, name in chosen:
            start = time.perf_counter()
            self.router.send(team_id, to=name, content="curve", sender="user")
            route.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            turn = self.router.claim(agent_id)
            claim.append((time.perf_counter() - start) * 1000)
            assert turn is not None
            turn.drain()
            self.router.end_turn(turn)
        sweep = [ms(self.router.sweep) for _ in range(max(5, self.samples // 20))]
        raw = self.floors.latency(max(20, self.samples))["raw"][0]
        return {
            "route p50": statistics.median(route),
            "claim p50": statistics.median(claim),
            "sweeper pass p50": statistics.median(sweep),
            "raw floor p50": raw,
        }


def curve(
    database_url: str, sizes: list[Size], *, samples: int
) -> tuple[list[Row], list[tuple[Size, dict[str, float]]]]:
    """Fill to each size in turn and measure there. Rows compare every size with the first."""
    rows: list[Row] = []
    points: list[tuple[Size, dict[str, float]]] = []
    bench = Curve(database_url, samples=samples)
    try:
        for size in sizes:
            seconds = fill(database_url, size)
            figures = bench.measure(size)
            points.append((size, figures))
            at = f"{size.messages} msgs, {size.teams} teams"
            rows.append(row(f"fill to {at}", "postgresql", seconds, None, "s"))
            first = points[0][1]
            for name in ("route p50", "claim p50", "sweeper pass p50"):
                rows.append(
                    row(
                        f"{name} at {at}",
                        "postgresql",
                        figures[name],
                        first[name],
                        "ms",
                        raw=figures["raw floor p50"],
                        target="<= 1.2x the smallest size",
                        limit=1.2 * first[name],
                    )
                )
    finally:
        bench.close()
    return rows, points


_COLOURS = {"route p50": "#1f77b4", "claim p50": "#2ca02c", "sweeper pass p50": "#d62728"}


def svg(points: list[tuple[Size, dict[str, float]]]) -> str:
    """The curve as a small SVG line chart: each figure as a multiple of the raw floor
    transaction measured at the same size (so that a machine busier at one size than at another
    does not bend the curve), against stored messages (log scale)."""
    width, height, left, bottom, top, right = 640, 360, 60, 50, 20, 170
    xs = [math.log10(max(size.messages, 1)) for size, _ in points]
    ratios = [{name: f[name] / f["raw floor p50"] for name in _COLOURS} for _, f in points]
    top_ms = max((r[name] for r in ratios for name in _COLOURS), default=1.0) * 1.15
    x_lo, x_hi = min(xs), max(xs)
    span = (x_hi - x_lo) or 1.0

    def px(x: float) -> float:
        return left + (x - x_lo) / span * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - y / top_ms * (height - bottom - top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<line x1="{left}" y1="{py(0):.1f}" x2="{width - right}" y2="{py(0):.1f}" '
        'stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{py(0):.1f}" stroke="black"/>',
    ]
    for k in range(5):
        y = top_ms * k / 4
        parts.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    for x, (size, _) in zip(xs, points, strict=True):
        parts.append(
            f'<text x="{px(x):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
            f"{size.messages:,} / {size.teams:,}</text>"
        )
    parts.append(
        f'<text x="{(left + width - right) / 2:.0f}" y="{height - 10}" text-anchor="middle">'
        "stored messages / teams (log scale)</text>"
    )
    parts.append(
        f'<text x="14" y="{top + 170}" transform="rotate(-90 14 {top + 170})">'
        "p50, x the raw floor transaction</text>"
    )
    for i, (name, colour) in enumerate(_COLOURS.items()):
        at = [(px(x), py(r[name])) for x, r in zip(xs, ratios, strict=True)]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in at)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in at)
        ly = top + 16 * i + 10
        parts.append(
            f'<line x1="{width - right + 15}" y1="{ly}" x2="{width - right + 35}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        parts.append(f'<text x="{width - right + 40}" y="{ly + 4}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
