"""A team's story as a swimlane: one lane per agent (and one per outside sender such as
``user``), each turn a bar on its agent's lane, each message an arrow from its sender's lane to
its receiver's, coloured by its kind, an ask linked to its answer with the time the asker
waited, each model call and tool call a span inside its turn, and who is blocked now. Built
from the store's timeline reads (:mod:`agent_router.store.timeline`).

- :func:`view`: a window of time and a page of lanes (what ``agent-router web`` serves, and the
  page asks for again as it is zoomed, panned, filtered or focused);
- :func:`overview`: the whole team counted by time bucket, with its idle gaps (the overview
  strip, and the breaks the swimlane compresses);
- :func:`team_timeline`: all of it at once, with every message's content and every turn's
  ledger lines, for :func:`render_html` (a page that opens from a file, with no network) and
  :func:`render_mermaid` (a Mermaid sequence diagram, split in parts past Mermaid's limit,
  by role past 16 participants).

Times in the data are seconds since the team was created.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import html
import itertools
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

from agent_router.domain import AgentStatus, LedgerEvent, Message, MessageType
from agent_router.ops.explain import describe
from agent_router.router import Router
from agent_router.store.timeline import Activity, Call, TimelineQuery, TimelineWindow

#: Message kinds as the swimlane tells them apart (an ``output`` is a report).
KINDS = ("task", "ask", "answer", "report", "message", "notice")
#: Buckets of the overview strip: finer than any screen shows it.
OVERVIEW_BUCKETS = 1000
#: An idle stretch shorter than this is drawn to scale.
MIN_GAP_SECONDS = 1.0
#: An idle stretch is compressed once it is this share of the team's span or more.
GAP_SHARE = 1 / 40
#: What a model call and a tool call say of themselves, besides their name and times.
CALL_FIELDS = {
    "model": (
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "cost_usd",
        "estimated",
        "unpriced",
        "saturated",
    ),
    "tool": ("server", "outcome"),
}
#: Mermaid refuses a diagram longer than this (its ``maxTextSize``).
MERMAID_MAX_CHARS = 50_000
#: Past this many participants (agents and outside senders) a sequence diagram is wider than
#: any screen reads (a team of 30 drew 5,929 px wide): it is summarised by role.
MERMAID_MAX_PARTICIPANTS = 16


def kind(message_type: str) -> str:
    """The kind of a message type: ``output`` is a ``report``; the others are themselves."""
    return "report" if message_type == MessageType.OUTPUT.value else message_type


def _seconds(at: datetime | None, t0: datetime) -> float | None:
    return None if at is None else round((at - t0).total_seconds(), 3)


def _iso(at: datetime) -> str:
    return f"{at.isoformat()}Z"


def view(router: Router, team_id: int, query: TimelineQuery) -> dict[str, Any]:
    """The lanes of ``query``'s page and what happened to them in its window, JSON-ready."""
    window = router.reads.team_window(team_id, query)
    return _view(window, query)


def _view(w: TimelineWindow, query: TimelineQuery) -> dict[str, Any]:
    t0 = w.started_at
    end = _seconds(w.last_event_at, t0) or 0.0
    names = {s.agent.id: s.agent.display_name for s in w.lanes}
    to = end if query.end is None else max(query.start, query.end)
    return {
        "team_id": w.team_id,
        "started_at": _iso(t0),
        "end": end,
        "last_event_id": w.last_event_id,
        "agents_total": w.agents_total,
        "states": {state.value: n for state, n in sorted(w.states.items())},
        "lanes": {
            "offset": query.offset,
            "limit": query.limit,
            "total": w.lanes_total,
            "items": [_lane(s) for s in w.lanes],
        },
        "window": {
            "from": max(0.0, query.start),
            "to": to,
            # Down to the millisecond: the next window starts there and reads nothing twice
            # that it could miss (a message read twice is one, by its id).
            "complete_to": to
            if w.complete_until is None
            else math.floor((w.complete_until - t0).total_seconds() * 1000) / 1000,
        },
        "turns": [
            {
                "id": t.id,
                "agent": names[t.agent_id],
                "trigger": t.trigger.value,
                "epoch": t.epoch,
                "start": _seconds(t.started_at, t0),
                "end": _seconds(t.ended_at, t0),
                "how": t.status.value,
            }
            for t in w.turns
        ],
        "messages": [
            {
                "id": a.ledger_id,
                "message_id": a.message_id,
                "t": _seconds(a.at, t0),
                "from": a.sender,
                "from_agent": a.sender_is_agent,
                "to": a.target,
                "kind": kind(a.type),
                "type": a.type,
                "subtype": a.subtype.value if a.subtype else None,
                "outcome": a.outcome.value,
                "question_id": a.question_id,
                "wake": a.wake,
                "status": a.status.value if a.status else None,
                "preview": a.preview,
            }
            for a in w.arrows
        ],
        "calls": [_call(c, t0) for c in w.calls],
        "now": {
            "at": _seconds(w.now, t0),
            "total": w.blocked_total,
            "blocked": [
                {
                    "question_id": b.question_id,
                    "kind": b.kind.value,
                    "asker": b.asker,
                    "target": b.target,
                    "since": _seconds(b.since, t0),
                    "deadline": _seconds(b.deadline, t0),
                    "suspended": b.suspended,
                }
                for b in w.blocked
            ],
        },
        "questions": [
            {
                "id": q.question_id,
                "kind": q.kind.value,
                "asker": q.asker,
                "target": q.target,
                "status": q.status.value,
                "asked": _seconds(q.asked_at, t0),
                "closed": _seconds(q.closed_at, t0),
                "wait": None
                if q.closed_at is None
                else round((q.closed_at - q.asked_at).total_seconds(), 3),
                "answer_message_id": q.answer_message_id,
            }
            for q in w.waits
        ],
    }


def _call(c: Call, t0: datetime) -> dict[str, Any]:
    """A model call or tool call as the swimlane draws it: from ``start`` to ``end`` on its
    agent's lane (``start`` null: how long it took was not recorded)."""
    end = _seconds(c.ended_at, t0) or 0.0
    return {
        "kind": c.kind,
        "agent": c.agent,
        "turn": c.turn_id,
        "name": c.name,
        "start": None if c.seconds is None else round(max(0.0, end - c.seconds), 3),
        "end": end,
        "ms": None if c.seconds is None else round(c.seconds * 1000),
        **{k: c.detail.get(k) for k in CALL_FIELDS[c.kind]},
    }


def _lane(status: AgentStatus) -> dict[str, Any]:
    a = status.agent
    return {
        "name": a.display_name,
        "role": a.role,
        "lead": a.is_lead,
        "state": a.state.value,
        "suspended": a.suspended,
        "epoch": a.epoch,
        "mailbox": a.mailbox_depth,
        "open_questions": list(status.open_questions),
        "questions_to_answer": list(status.questions_to_answer),
        "turn_id": status.turn_id,
    }


def overview(router: Router, team_id: int, buckets: int = OVERVIEW_BUCKETS) -> dict[str, Any]:
    """The whole team by time bucket: messages of each kind, turns started or ended, the idle
    gaps, and the outside senders."""
    return _overview(router.reads.activity(team_id, buckets), buckets)


def _overview(a: Activity, buckets: int) -> dict[str, Any]:
    per: dict[int, list[int]] = {}
    for bucket, message_type, n in a.counts:
        row = per.setdefault(min(bucket, buckets - 1), [0] * (len(KINDS) + 1))
        column = len(KINDS) if message_type is None else KINDS.index(kind(message_type))
        row[column] += n
    end = round(a.bucket_seconds * buckets, 3)
    return {
        "team_id": a.team_id,
        "end": end,
        "bucket": a.bucket_seconds,
        "kinds": list(KINDS),
        # Sparse: [bucket, [messages of each kind...], turn starts and ends], by bucket.
        "counts": [[b, row[: len(KINDS)], row[-1]] for b, row in sorted(per.items())],
        "gaps": gaps(sorted(set(per) | _call_buckets(a.calls, buckets)), a.bucket_seconds, end),
        "outside": a.outside,
    }


def _call_buckets(calls: list[tuple[int, int]], buckets: int) -> set[int]:
    """The buckets a model call or a tool call runs in: busy, though no message is in them."""
    busy: set[int] = set()
    for first, last in calls:
        busy.update(range(min(first, buckets - 1), min(last, buckets - 1) + 1))
    return busy


def gaps(busy: list[int], width: float, end: float) -> list[list[float]]:
    """Idle stretches worth compressing, as ``[start, end]`` seconds: the runs of buckets with
    nothing in them (between the busy buckets ``busy``, sorted) lasting at least
    ``MIN_GAP_SECONDS`` and ``GAP_SHARE`` of the span ``end``."""
    shortest = max(MIN_GAP_SECONDS, end * GAP_SHARE)
    found = []
    for before, after in itertools.pairwise(busy):
        start, stop = (before + 1) * width, after * width
        if stop - start >= shortest:
            found.append([round(start, 3), round(stop, 3)])
    return found


def team_timeline(router: Router, team_id: int) -> dict[str, Any]:
    """The whole swimlane of ``team_id``, JSON-ready: every lane, turn and message (with its
    content and ledger line), every question, and the overview; what the exported page draws."""
    data = view(router, team_id, TimelineQuery())
    data["overview"] = overview(router, team_id)
    events = router.ledger(team_id)
    messages = {m.id: m for m in router.messages(team_id)}
    lines: dict[int, list[str]] = {}
    routed: dict[int, LedgerEvent] = {}
    for e in events:
        if e.turn_id is not None:
            lines.setdefault(e.turn_id, []).append(describe(e, {}))
        routed[e.id] = e
    for turn in data["turns"]:
        turn["lines"] = lines.get(turn["id"], [])
    for m in data["messages"]:
        message: Message | None = messages.get(m["message_id"] or -1)
        event = routed.get(m["id"])
        m["content"] = message.content if message is not None else m["preview"]
        m["line"] = describe(event, messages) if event is not None else ""
    return data


def _asset(name: str) -> str:
    return resources.files("agent_router.ops.web").joinpath("static", name).read_text("utf-8")


#: What JSON inside a <script> element must not hold as it is: ``<`` (``</script``, ``<!--``
#: and ``<script`` change how the HTML parser reads the element), ``>`` and ``&``, and the line
#: separators U+2028 and U+2029 (line ends to older JavaScript parsers).
_SCRIPT_UNSAFE = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def script_json(data: Any) -> str:
    """JSON that can sit inside a <script> element whatever its strings hold: the characters
    that could end the element or change how it is parsed are written as JSON escapes, which
    ``JSON.parse`` reads back as the same characters."""
    text = json.dumps(data, default=str, ensure_ascii=False)
    return re.sub("[<>&\u2028\u2029]", lambda m: _SCRIPT_UNSAFE[m.group()], text)


def render_html(data: dict[str, Any], *, title: str | None = None) -> str:
    """A self-contained page of the swimlane: opens from a file, with no network. Its
    Content-Security-Policy lets only its own two scripts run (by their hashes) and fetch
    nothing."""
    heading = html.escape(title or f"agent-router team {data['team_id']}")
    script = _asset("swimlane.js")
    start = (
        'window.swimlane = Swimlane.mount(document.getElementById("timeline"), Swimlane.local('
        'JSON.parse(document.getElementById("timeline-data").textContent)));'
    )
    policy = (
        f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src {_hash(script)} {_hash(start)}"
    )
    agents, messages = len(data["lanes"]["items"]), len(data["messages"])
    summary = html.escape(
        f"{agents} agents · {messages} messages · {len(data['turns'])} turns · {data['end']:.1f} s"
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<title>{heading}</title>
<style>{_asset("swimlane.css")}</style>
</head>
<body class="export">
<header><h1>{heading}</h1><span id="summary">{summary}</span></header>
<div id="timeline"></div>
<script type="application/json" id="timeline-data">{script_json(data)}</script>
<script>{script}</script>
<script>{start}</script>
</body>
</html>
"""


def _hash(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return f"'sha256-{digest}'"


# ---------------------------------------------------------------------------- Mermaid


@dataclass(frozen=True)
class MermaidDiagram:
    """A Mermaid sequence diagram of a team, or one part of it."""

    text: str
    part: int  # 1-based
    parts: int
    start: float  # seconds since the team was created
    end: float
    summarised: bool  # runs of messages between one pair, of one kind, are one arrow each
    by_role: bool = False  # a participant per role, an arrow per pair of roles and kind


def _mermaid_id(name: str) -> str:
    return "P_" + re.sub(r"\W", "_", name)


def _mermaid_text(text: str, limit: int = 80) -> str:
    # Mermaid ends a message at a newline, and `;` or `#` start syntax of their own.
    return re.sub(r"[;#\n\r]+", " ", text).strip()[:limit]


def _mermaid_steps(data: dict[str, Any], *, summarise: bool) -> list[tuple[float, int, str]]:
    """The diagram's lines in time order with their times; summarised, runs of consecutive
    messages between one pair, of one kind and outcome, become one arrow with their count, and
    turns are left out."""
    steps: list[tuple[float, int, str]] = []
    run: list[dict[str, Any]] = []

    def arrow(messages: list[dict[str, Any]]) -> None:
        m = messages[0]
        head = "-x" if m["outcome"] == "rejected" else "->>"
        label = m["type"] + (f"/{m['subtype']}" if m["subtype"] else "") + f": {m['outcome']}"
        if m["question_id"] is not None:
            label += f" (question {m['question_id']})"
        if len(messages) > 1:
            label = f"{len(messages)} x {label}"
        line = f"    {_mermaid_id(m['from'])}{head}{_mermaid_id(m['to'])}: {_mermaid_text(label)}"
        steps.append((m["t"], 1, line))

    for m in data["messages"]:
        key = (m["from"], m["to"], m["type"], m["subtype"], m["outcome"], m["question_id"])
        if summarise and run and key == _run_key(run[0]):
            run.append(m)
            continue
        if run:
            arrow(run)
        run = [m]
        if not summarise:
            arrow(run)
            run = []
    if run:
        arrow(run)
    if summarise:
        return sorted(steps, key=lambda s: (s[0], s[1]))
    for turn in data["turns"]:
        who = _mermaid_id(turn["agent"])
        steps.append((turn["start"], 2, f"    activate {who}"))
        steps.append(
            (turn["start"], 3, f"    Note right of {who}: turn {turn['id']} ({turn['trigger']})")
        )
        if turn["end"] is not None:
            steps.append((turn["end"], 0, f"    deactivate {who}"))
    return sorted(steps, key=lambda s: (s[0], s[1]))


def _run_key(m: dict[str, Any]) -> tuple[Any, ...]:
    return (m["from"], m["to"], m["type"], m["subtype"], m["outcome"], m["question_id"])


def _lanes_of(data: dict[str, Any]) -> list[tuple[str, bool]]:
    """Every lane's name and whether it is an outside sender, in the swimlane's order."""
    agents = [lane["name"] for lane in data["lanes"]["items"]]
    outside = sorted(
        set(data.get("overview", {}).get("outside", []))
        | {m["from"] for m in data["messages"] if not m["from_agent"]}
    )
    return [(n, True) for n in outside] + [(n, False) for n in agents]


def _diagram(lanes: list[tuple[str, bool]], steps: list[tuple[float, int, str]], head: str) -> str:
    out = [head] if head else []
    out.append("sequenceDiagram")
    for name, outside in lanes:
        kind_ = "actor" if outside else "participant"
        out.append(f"    {kind_} {_mermaid_id(name)} as {_mermaid_text(name)}")
    out.extend(line for _, _, line in steps)
    return "\n".join(out) + "\n"


def render_mermaid(
    data: dict[str, Any], *, max_chars: int = MERMAID_MAX_CHARS, by_agent: bool = False
) -> list[MermaidDiagram]:
    """A Mermaid sequence diagram of the team: messages as arrows labelled with type and
    outcome, turns as activations. Past ``max_chars`` (Mermaid's limit), runs of messages
    between one pair are summarised as one arrow with their count and the turns left out; if
    that is still too long, the diagram is split in time into parts that each fit, each
    declaring only its own participants and saying which part of the whole it is. A team
    with more than :data:`MERMAID_MAX_PARTICIPANTS` participants is summarised by role
    (:func:`mermaid_by_role`) unless ``by_agent``."""
    lanes = _lanes_of(data)
    if not by_agent and len(lanes) > MERMAID_MAX_PARTICIPANTS:
        return [mermaid_by_role(data)]
    whole = _diagram(lanes, _mermaid_steps(data, summarise=False), "")
    end = float(data["end"])
    if len(whole) <= max_chars:
        return [MermaidDiagram(whole, 1, 1, 0.0, end, summarised=False)]
    steps = _mermaid_steps(data, summarise=True)
    declared = {_mermaid_id(n): len(_diagram([(n, o)], [], "")) for n, o in lanes}
    chunks: list[list[tuple[float, int, str]]] = [[]]
    used: set[str] = set()
    room = max_chars - 400  # the part's comment line comes on top
    size = 0
    for step in steps:
        new = set(re.findall(r"P_\w+", step[2])) - used
        cost = len(step[2]) + 1 + sum(declared.get(w, 0) for w in new)
        if chunks[-1] and size + cost > room:
            chunks.append([])
            used, size = set(), 0
            new = set(re.findall(r"P_\w+", step[2]))
            cost = len(step[2]) + 1 + sum(declared.get(w, 0) for w in new)
        chunks[-1].append(step)
        used |= new
        size += cost
    diagrams = []
    for i, chunk in enumerate(chunks, start=1):
        start = chunk[0][0] if chunk else 0.0
        stop = chunks[i][0][0] if i < len(chunks) and chunks[i] else end
        used = {w for _, _, line in chunk for w in re.findall(r"P_\w+", line)}
        own = [(n, o) for n, o in lanes if _mermaid_id(n) in used]
        head = (
            f"%% part {i} of {len(chunks)}: {start:.3f} s to {stop:.3f} s of team "
            f"{data['team_id']}; runs of messages between one pair are one arrow "
            f"(Mermaid reads at most {max_chars} characters)"
        )
        diagrams.append(
            MermaidDiagram(_diagram(own, chunk, head), i, len(chunks), start, stop, True)
        )
    return diagrams


def _role_of(data: dict[str, Any]) -> dict[str, str]:
    """Each lane's participant in a summary by role: the lead and each outside sender alone,
    every other agent its role with how many agents have it (``Backend Engineer (6)``)."""
    roles: dict[str, list[str]] = {}
    group: dict[str, str] = {}
    for lane in data["lanes"]["items"]:
        if lane.get("lead"):
            group[lane["name"]] = lane["name"]
        else:
            roles.setdefault(lane.get("role") or lane["name"], []).append(lane["name"])
    for role, names in roles.items():
        for name in names:
            group[name] = f"{role} ({len(names)})" if len(names) > 1 else name
    return group


def mermaid_by_role(data: dict[str, Any]) -> MermaidDiagram:
    """The team as a sequence diagram of its roles: the lead, the outside senders and one
    participant per role of the sub-agents; one arrow per pair of participants and kind of
    message (a refused send's arrow apart), in the order of its first message, labelled with
    how many messages it stands for, their outcomes and when the first and the last were
    sent. Every message is in one arrow."""
    group = _role_of(data)
    arrows: dict[tuple[str, str, str, bool], list[dict[str, Any]]] = {}
    for m in data["messages"]:
        refused = m["outcome"] == "rejected"
        key = (
            group.get(m["from"], m["from"]),
            group.get(m["to"], m["to"]),
            kind(m["type"]),
            refused,
        )
        arrows.setdefault(key, []).append(m)
    outside = sorted({m["from"] for m in data["messages"] if not m["from_agent"]})
    participants = [(n, True) for n in outside] + [
        (n, False) for n in dict.fromkeys(group[lane["name"]] for lane in data["lanes"]["items"])
    ]
    steps = []
    for (sender, target, what, refused), messages in arrows.items():
        head = "-x" if refused else "->>"
        first, last = messages[0]["t"], messages[-1]["t"]
        when = f"at {first:.1f} s" if len(messages) == 1 else f"{first:.1f} s to {last:.1f} s"
        outcomes = collections.Counter(m["outcome"] for m in messages).most_common()
        how = ", ".join(f"{n} {outcome}" for outcome, n in outcomes)
        text = _mermaid_text(f"{len(messages)} x {what} ({how}), {when}", limit=240)
        steps.append((first, 1, f"    {_mermaid_id(sender)}{head}{_mermaid_id(target)}: {text}"))
    agents = len(data["lanes"]["items"])
    head = (
        f"%% team {data['team_id']}: {agents} agents summarised by role, one arrow per pair of "
        f"participants and kind; `agent-router timeline {data['team_id']} --format mermaid "
        f"--by-agent` draws one participant per agent"
    )
    end = float(data["end"])
    return MermaidDiagram(
        _diagram(participants, sorted(steps), head), 1, 1, 0.0, end, True, by_role=True
    )
