"""The swimlane's data as it is written into a page and into Mermaid, without a database: the
JSON in a <script> element survives any string, idle gaps are found from the activity counts,
and a diagram past Mermaid's limit is summarised and split with every message kept."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent_router.ops.timeline import gaps, render_mermaid, script_json


@given(st.recursive(st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_script_json_cannot_end_or_open_an_element(data: Any) -> None:
    text = script_json(data)
    assert json.loads(text) == data
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}


def test_script_json_of_the_known_breakouts() -> None:
    for hostile in ("</script><script>alert(1)</script>", "<!--<script>", "a\u2028b\u2029c"):
        text = script_json({"content": hostile})
        assert "</script" not in text.lower() and "<!--" not in text and "\u2028" not in text
        assert json.loads(text) == {"content": hostile}


def test_gaps_are_the_long_idle_runs_of_buckets() -> None:
    # 100 buckets of 1 s: busy 0-9, idle 10-39, busy 40-41, idle 42-42 (1 s), busy 43-99.
    busy = [*range(10), 40, 41, *range(43, 100)]
    assert gaps(busy, 1.0, 100.0) == [[10.0, 40.0]]
    # A short team: a pause of a second or more is compressed, a half-second one is not.
    assert gaps([0, 1, 3, 4], 0.5, 2.5) == []
    assert gaps([0, 5, 9], 0.5, 5.0) == [[0.5, 2.5], [3.0, 4.5]]
    assert gaps([], 1.0, 10.0) == []


def _message(i: int, sender: str, target: str, kind: str = "report") -> dict[str, Any]:
    return {
        "id": i, "message_id": i, "t": i * 0.01, "from": sender, "from_agent": True,
        "to": target, "kind": kind, "type": "output" if kind == "report" else kind,
        "subtype": None, "outcome": "queued", "question_id": None,
    }  # fmt: skip


def _team(messages: list[dict[str, Any]]) -> dict[str, Any]:
    names = sorted({m["from"] for m in messages} | {m["to"] for m in messages})
    return {
        "team_id": 7,
        "end": messages[-1]["t"] if messages else 0.0,
        "lanes": {"items": [{"name": n} for n in names]},
        "messages": messages,
        "turns": [],
    }


def test_a_small_diagram_is_one_part() -> None:
    data = _team([_message(i, "Worker_1", "Team Leader") for i in range(1, 30)])
    [diagram] = render_mermaid(data)
    assert (diagram.part, diagram.parts, diagram.summarised) == (1, 1, False)
    assert diagram.text.startswith("sequenceDiagram\n")
    assert diagram.text.count("->>") == 29


def test_a_long_diagram_is_summarised_and_split_keeping_every_message() -> None:
    messages = []
    for i in range(1, 6001):
        # Runs of a few reports between one pair, then a task the other way.
        worker = f"Worker_{i // 7 % 40}"
        if i % 7:
            messages.append(_message(i, worker, "Team Leader"))
        else:
            messages.append(_message(i, "Team Leader", worker, "task"))
    diagrams = render_mermaid(_team(messages), max_chars=20_000, by_agent=True)
    assert len(diagrams) > 1
    counted = 0
    for d in diagrams:
        assert len(d.text) <= 20_000 and d.summarised and d.parts == len(diagrams)
        head, first, *lines = d.text.splitlines()
        assert head.startswith(f"%% part {d.part} of {d.parts}: ") and first == "sequenceDiagram"
        declared = {line.split()[1] for line in lines if " as " in line}
        for line in lines:
            arrow = re.match(r"\s+(P_\w+)->>(P_\w+): (?:(\d+) x )?", line)
            if arrow:
                assert {arrow.group(1), arrow.group(2)} <= declared
                counted += int(arrow.group(3) or 1)
    assert counted == len(messages)
    starts = [d.start for d in diagrams]
    assert starts == sorted(starts)
