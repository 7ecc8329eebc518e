"""A team's story as a swimlane: one lane per agent (and one per outside sender such as
``user``), each turn a bar on its agent's lane, each message an arrow from its sender's lane to its
receiver's, asks linked to their answers. Built from the ledger and the messages alone.

:func:`team_timeline` gives the data (JSON-ready); :func:`render_html` a page that draws it with
no network at view time (the script, style and data inline); :func:`render_mermaid` a Mermaid
sequence diagram of the same story. The live page (``agent-router web``) draws the same data
with the same script.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

from agent_router.domain import LedgerAction, LedgerEvent, Message
from agent_router.ops.explain import describe, event_record
from agent_router.router import Router

#: Ledger actions that end a turn (a stop honoured at a boundary ends it too).
_TURN_ENDS = (LedgerAction.TURN_ENDED, LedgerAction.STOPPED)
#: What the swimlane keeps of an event's ``--json`` record, in this order.
_EVENT_KEYS = ("id", "t", "agent", "action", "outcome", "turn_id", "message_id", "text")


def _iso(event_time: Any) -> str:
    return f"{event_time.isoformat()}Z"


def team_timeline(router: Router, team_id: int) -> dict[str, Any]:
    """The swimlane data of ``team_id``: lanes, turns, messages and the explained ledger.
    Times are seconds since the team's first event."""
    router.store.reads.team(team_id)  # an unknown team is an error
    events = router.ledger(team_id)
    messages = {m.id: m for m in router.messages(team_id)}
    t0 = events[0].created_at.timestamp() if events else 0.0
    agents = [
        {
            "name": s.agent.display_name,
            "role": s.agent.role,
            "state": s.agent.state.value,
            "suspended": s.agent.suspended,
            "epoch": s.agent.epoch,
            "mailbox": s.agent.mailbox_depth,
        }
        for s in router.store.reads.agent_statuses(team_id)
    ]
    names = [a["name"] for a in agents]
    outsiders = sorted({m.source_name for m in messages.values()} - set(names))
    lanes = [{"name": n, "outside": True} for n in outsiders] + [
        {**a, "outside": False} for a in agents
    ]
    return {
        "team_id": team_id,
        "last_event_id": events[-1].id if events else 0,
        "end": round(events[-1].created_at.timestamp() - t0, 3) if events else 0.0,
        "lanes": lanes,
        "turns": _turns(events, t0),
        "messages": [
            _arrow(e, messages.get(e.message_id or -1), t0) for e in events if _is_arrow(e)
        ],
        "events": [_event(e, messages, t0) for e in events],
    }


def _event(event: LedgerEvent, messages: dict[int, Message], t0: float) -> dict[str, Any]:
    """One explained ledger event of the swimlane: part of its ``--json`` record, and its time."""
    record = event_record(event, messages, t0)
    return {key: record[key] for key in _EVENT_KEYS} | {"at": _iso(event.created_at)}


def _is_arrow(event: LedgerEvent) -> bool:
    return event.action is LedgerAction.ROUTE or (
        event.action is LedgerAction.SEND_REJECTED and bool(event.detail.get("to"))
    )


def _turns(events: list[LedgerEvent], t0: float) -> list[dict[str, Any]]:
    turns: dict[int, dict[str, Any]] = {}
    for e in events:
        t = round(e.created_at.timestamp() - t0, 3)
        if e.action is LedgerAction.TURN_CLAIMED and e.turn_id is not None:
            turns[e.turn_id] = {
                "id": e.turn_id,
                "agent": e.agent_name,
                "trigger": e.detail.get("trigger", "new"),
                "epoch": e.epoch,
                "start": t,
                "end": None,
                "how": "running",
                "lines": [describe(e, {})],
            }
        elif e.turn_id in turns and e.action in _TURN_ENDS:
            turn = turns[e.turn_id]
            d = e.detail
            how = "failed" if d.get("failed") else "suspended" if d.get("suspended") else "ended"
            turn.update(end=t, how="stopped" if e.action is LedgerAction.STOPPED else how)
            turn["lines"].append(describe(e, {}))
        elif e.turn_id in turns:
            turns[e.turn_id]["lines"].append(describe(e, {}))
    return list(turns.values())


def _arrow(event: LedgerEvent, msg: Message | None, t0: float) -> dict[str, Any]:
    d = event.detail
    return {
        "ledger_id": event.id,
        "message_id": event.message_id,
        "t": round(event.created_at.timestamp() - t0, 3),
        "from": msg.source_name if msg else d.get("sender"),
        "to": msg.target_name if msg else d.get("to"),
        "type": msg.type.value if msg else d.get("type") or "message",
        "subtype": msg.subtype.value if msg and msg.subtype else None,
        "outcome": event.outcome.value if event.outcome else "rejected",
        "question_id": msg.question_id if msg else None,
        "wake": msg.wake if msg else None,
        "status": msg.status.value if msg else None,
        "line": describe(event, {msg.id: msg} if msg else {}),
        "content": msg.content if msg else str(d.get("message", "")),
    }


def _asset(name: str) -> str:
    return resources.files("agent_router.ops.web").joinpath("static", name).read_text("utf-8")


def _script_json(data: dict[str, Any]) -> str:
    """JSON that can sit inside a <script> element (no ``</`` to close it early)."""
    return json.dumps(data, default=str).replace("</", "<\\/")


def render_html(data: dict[str, Any], *, title: str | None = None) -> str:
    """A self-contained page of the swimlane: opens from a file, with no network."""
    heading = html.escape(title or f"agent-router team {data['team_id']}")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{heading}</title>
<style>{_asset("swimlane.css")}</style>
</head>
<body>
<h1>{heading}</h1>
<div id="legend"></div>
<div id="swimlane"></div>
<pre id="detail">Hover or click a turn or a message.</pre>
<script type="application/json" id="timeline-data">{_script_json(data)}</script>
<script>{_asset("swimlane.js")}</script>
<script>
Swimlane.draw(document.getElementById("swimlane"),
  JSON.parse(document.getElementById("timeline-data").textContent));
</script>
</body>
</html>
"""


def _mermaid_id(name: str) -> str:
    return "P_" + re.sub(r"\W", "_", name)


def _mermaid_text(text: str) -> str:
    # Mermaid ends a message at a newline, and `;` or `#` start syntax of their own.
    return re.sub(r"[;#\n\r]+", " ", text).strip()[:80]


def render_mermaid(data: dict[str, Any]) -> str:
    """A Mermaid sequence diagram: messages as arrows labelled with type and outcome, turns as
    activations, each answer noted with its question."""
    out = ["sequenceDiagram"]
    for lane in data["lanes"]:
        kind = "actor" if lane["outside"] else "participant"
        out.append(f"    {kind} {_mermaid_id(lane['name'])} as {_mermaid_text(lane['name'])}")
    steps: list[tuple[float, int, str]] = []
    for m in data["messages"]:
        arrow = "-x" if m["outcome"] == "rejected" else "->>"
        kind = m["type"] + (f"/{m['subtype']}" if m["subtype"] else "")
        label = f"{kind}: {m['outcome']}"
        if m["question_id"] is not None:
            label += f" (question {m['question_id']})"
        line = f"    {_mermaid_id(m['from'])}{arrow}{_mermaid_id(m['to'])}: {_mermaid_text(label)}"
        steps.append((m["t"], 1, line))
    for turn in data["turns"]:
        who = _mermaid_id(turn["agent"])
        steps.append((turn["start"], 2, f"    activate {who}"))
        steps.append(
            (turn["start"], 3, f"    Note right of {who}: turn {turn['id']} ({turn['trigger']})")
        )
        if turn["end"] is not None:
            steps.append((turn["end"], 0, f"    deactivate {who}"))
    out.extend(line for _, _, line in sorted(steps, key=lambda s: (s[0], s[1])))
    return "\n".join(out) + "\n"
