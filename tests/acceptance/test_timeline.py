"""``agent-router timeline``: the swimlane page opened from a file in a real headless Chromium.

A small team with every kind of arrow (each kind its own colour, the outcome its tip; an ask
linked to its answer, highlighted together on a click, with the wait); a team of 30 agents and
about 2,000 messages over 80 s, whose whole activity fits the first screen at 1400x900 (idle
gaps compressed, bursts bundled), zoomed, filtered by kind and focused on one agent; hostile
names and contents drawn as text with no script of theirs run; and the Mermaid diagram, split
in parts past Mermaid's limit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from agent_router import MessageType, Router, Settings
from agent_router.domain import BudgetName
from agent_router.outbox import RecordingPublisher
from tests.acceptance.test_web import HOSTILE_CONTENT, HOSTILE_NAMES, HOSTILE_PAGE, hostile_team
from tests.integration.helpers import assistant, start_running, start_waiting
from tests.support.browser import chromium, page_errors, screenshot
from tests.support.teams import BusyTeam, blocked_team, busy_team, slow_model_team

CLI = str(Path(sys.executable).parent / "agent-router")
KIND_COLOURS = """
return Object.fromEntries([...document.querySelectorAll("g.arrow line.msg")]
  .map((l) => [l.dataset.kind, l.getAttribute("stroke")]));
"""


@pytest.fixture
def story(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A team whose ledger holds every kind of arrow: a new turn, an inline injection, an ask
    and its answer (resolved), a coalesced and a queued message, and a rejected send."""
    url = f"sqlite:///{tmp_path / 'team.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team().id
    router.create_agent(team, role="UI Operator")
    router.create_agent(team, role="Full-Stack Engineer")
    ui = start_running(router, team, "UI Operator_1", "Build the login page.")
    start_waiting(router, team, "Full-Stack Engineer_1", "Team Leader")
    router.send(team, to="UI Operator_1", content="Use the blue theme.", sender="Team Leader")
    ask = next(m for m in router.messages(team) if m.type is MessageType.ASK)
    router.send(team, to="Team Leader", content="And the logo?", sender="user")  # coalesced
    router.send(
        team, to="Full-Stack Engineer_1", content="Use auth v2.", sender="Team Leader",
        type=MessageType.ANSWER, question_id=ask.question_id,
    )  # fmt: skip
    ui.drain()  # the injected message: no follow-up turn
    ui.append_assistant(assistant("The login page is done."))
    ui.end()
    router.send(team, to="UI Operator_1", content="For later.", wake=False)  # queued
    router.terminate(team, "UI Operator_1", reason="done")
    with pytest.raises(Exception, match="terminated"):
        # From a sender of its own: the page bundles crowded arrows of one pair and kind, and
        # this one must stay an arrow of its own beside the queued message.
        router.send(team, to="UI Operator_1", content="Too late.", sender="Full-Stack Engineer_1")
    yield url, team
    router.close()


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BusyTeam]]:
    """A team of 30 agents routing about 2,000 messages over 80 s, for the tests that read it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('busy') / 'team.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = busy_team(router, agents=30, messages=2000, seconds=80.0)
    router.close()
    yield url, team


def timeline(url: str, team: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    return subprocess.run(
        [CLI, "timeline", str(team), "--database-url", url, *args],
        check=False, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def page_of(url: str, team: int, tmp_path: Path) -> Path:
    page = tmp_path / f"team-{team}.html"
    proc = timeline(url, team, "-o", str(page))
    assert proc.returncode == 0, proc.stderr
    return page


def embedded(driver: Any) -> dict[str, Any]:
    """The data the page was written with, as the page itself parses it."""
    data: dict[str, Any] = driver.execute_script(
        "return JSON.parse(document.getElementById('timeline-data').textContent)"
    )
    return data


def click(driver: Any, css: str) -> None:
    driver.execute_script(
        "document.querySelector(arguments[0])"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}))",
        css,
    )


def waited(detail: str) -> float:
    """The wait the side panel tells, in seconds."""
    found = re.search(r"waited (\d+(?:\.\d+)?) (ms|s)\b", detail)
    assert found, detail
    return float(found.group(1)) / (1000 if found.group(2) == "ms" else 1)


def test_swimlane_page_in_a_browser(story: tuple[str, int], tmp_path: Path) -> None:
    url, team = story
    page = page_of(url, team, tmp_path)
    text = page.read_text()
    # Self-contained: nothing is fetched when the page is viewed, and its policy says so.
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    assert "default-src 'none'" in text

    with chromium() as driver:
        driver.get(page.as_uri())
        lanes = [
            g.get_attribute("data-agent")
            for g in driver.find_elements(By.CSS_SELECTOR, "g.lane[data-agent]")
        ]
        assert lanes == ["user", "Team Leader", "UI Operator_1", "Full-Stack Engineer_1"]
        turns = driver.find_elements(By.CSS_SELECTOR, "rect.turn")
        assert {t.get_attribute("data-trigger") for t in turns} == {"new"}
        assert len(turns) == 2  # the UI Operator's (ended) and the Full-Stack Engineer's
        arrows = driver.find_elements(By.CSS_SELECTOR, "g.arrow")
        assert {a.get_attribute("data-outcome") for a in arrows} == {
            "triggered_new_turn", "injected_inline", "coalesced", "resolved", "queued", "rejected"
        }  # fmt: skip
        assert {a.get_attribute("data-kind") for a in arrows} == {"message", "ask", "answer"}
        # The colour tells the kind: each kind its own; the outcome is the tip.
        colours = driver.execute_script(KIND_COLOURS)
        assert len(set(colours.values())) == len(colours) == 3
        tips = {
            line.get_attribute("data-outcome"): line.get_attribute("marker-end")
            for line in driver.find_elements(By.CSS_SELECTOR, "line.msg[data-kind='message']")
        }
        assert tips["queued"] != tips["coalesced"] != tips["rejected"]

        # Clicking the ask highlights its answer and the asker's wait, and says how long.
        data = embedded(driver)
        [question] = data["questions"]
        ask = f"g.arrow[data-kind='ask'][data-question='{question['id']}']"
        click(driver, ask)
        selected = driver.find_elements(By.CSS_SELECTOR, "#swimlane-svg .sel")
        kinds = {s.get_attribute("data-kind") for s in selected if s.get_attribute("data-kind")}
        assert kinds == {"ask", "answer"}
        assert driver.find_elements(By.CSS_SELECTOR, ".wait.sel")
        answer = driver.find_element(By.CSS_SELECTOR, "line.msg[data-kind='answer']")
        assert "sel" in (answer.get_attribute("class") or "").split()
        others = driver.find_element(By.CSS_SELECTOR, "g.arrow[data-kind='message']")
        assert float(others.value_of_css_property("opacity")) < 0.5
        detail = driver.find_element(By.ID, "detail").text
        assert waited(detail) == pytest.approx(question["wait"], abs=0.001)
        assert "which auth module?" in detail and "Use auth v2." in detail
        assert "Full-Stack Engineer_1 → Team Leader" in detail

        # A turn: its ledger lines.
        click(driver, "rect.turn")
        assert "> turn" in driver.find_element(By.ID, "detail").text

        loaded = driver.execute_script("return performance.getEntriesByType('resource').length")
        assert loaded == 0
        assert page_errors(driver) == []  # no script error
        screenshot(driver, "timeline_swimlane")


LAYOUT = """
const svg = document.getElementById("swimlane-svg");
const lanes = [...document.querySelectorAll("g.lane")];
const last = lanes[lanes.length - 1].getBoundingClientRect();
return {
  lanes: lanes.map((g) => g.dataset.agent),
  lastLaneBottom: last.bottom, height: window.innerHeight,
  width: svg.getBoundingClientRect().right, windowWidth: window.innerWidth,
  breaks: document.querySelectorAll("g.break").length,
  bundles: [...document.querySelectorAll("g.arrow.bundle")].map((g) => Number(g.dataset.count)),
  messages: [...document.querySelectorAll("g.arrow")]
    .reduce((n, g) => n + Number(g.dataset.count), 0),
  kinds: [...new Set([...document.querySelectorAll("g.arrow")].map((g) => g.dataset.kind))],
  from: Number(svg.dataset.from), to: Number(svg.dataset.to),
  arrows: [...document.querySelectorAll("g.arrow")].map((g) => [g.dataset.from, g.dataset.to]),
  stubs: [...document.querySelectorAll("g.arrow.stub")]
    .reduce((n, g) => n + Number(g.dataset.count), 0),
};
"""


def test_a_team_of_thirty_on_one_screen(busy: tuple[str, BusyTeam], tmp_path: Path) -> None:
    url, team = busy
    page = page_of(url, team.team_id, tmp_path)
    with chromium() as driver:
        driver.get(page.as_uri())
        data = embedded(driver)
        layout = driver.execute_script(LAYOUT)
        # The first screen holds every lane, and the whole team's 80 s, across its width.
        assert layout["lanes"] == ["system", "user", *team.agents]
        assert layout["lastLaneBottom"] <= layout["height"]
        assert layout["width"] <= layout["windowWidth"]
        assert (layout["from"], layout["to"]) == (0, data["end"])
        assert layout["messages"] == len(data["messages"]) == team.messages
        # The idle stretches between the waves are compressed, each with a marked break.
        assert layout["breaks"] >= 2
        # Bursts between one pair are bundles with their count.
        assert layout["bundles"] and max(layout["bundles"]) >= 5
        # Each kind in its own colour.
        assert sorted(layout["kinds"]) == sorted(
            ["task", "ask", "answer", "report", "message", "notice"]
        )
        colours = driver.execute_script(KIND_COLOURS)
        assert len(set(colours.values())) == 6
        # The overview strip counts every message of the team, by kind.
        counted = sum(sum(row[1]) for row in data["overview"]["counts"])
        assert counted == len([m for m in data["messages"] if m["message_id"] is not None])
        screenshot(driver, "timeline_team_of_30")

        # Click an ask: its answer is highlighted with it, and the wait is told.
        question = max(data["questions"], key=lambda q: q["wait"])
        click(driver, f"g.arrow[data-kind='ask'][data-question='{question['id']}']")
        selected = driver.find_elements(By.CSS_SELECTOR, "g.arrow.sel, .sel[data-kind]")
        assert {s.get_attribute("data-kind") for s in selected} >= {"ask", "answer"}
        detail = driver.find_element(By.ID, "detail").text
        assert waited(detail) == pytest.approx(question["wait"], abs=0.01)
        screenshot(driver, "timeline_team_of_30_ask")

        # Zoom in: a narrower window; the whole team again.
        driver.find_element(By.CSS_SELECTOR, "button[title^='Zoom in']").click()
        zoomed = wait_until(driver, lambda p: p["messages"] < layout["messages"])
        assert zoomed["to"] - zoomed["from"] < (layout["to"] - layout["from"]) / 1.9
        driver.find_element(By.CSS_SELECTOR, "button[title^='Show the team']").click()
        wait_until(driver, lambda p: p["messages"] == layout["messages"])

        # The overview strip: drag across a stretch of it to show that stretch.
        strip = driver.find_element(By.CSS_SELECTOR, ".sl-overview .ov-bg")
        strip_box = strip.rect
        ActionChains(driver).move_to_element_with_offset(
            strip, -strip_box["width"] * 0.3, 0
        ).click_and_hold().move_by_offset(strip_box["width"] * 0.2, 0).release().perform()
        picked = wait_until(driver, lambda p: p["to"] - p["from"] < layout["to"] * 0.3)
        assert picked["from"] == pytest.approx(layout["to"] * 0.2, abs=layout["to"] * 0.02)
        assert picked["to"] == pytest.approx(layout["to"] * 0.4, abs=layout["to"] * 0.02)
        # Drag the lanes to the left: later time comes into view; D pans on, S zooms out.
        lanes = driver.find_element(By.ID, "swimlane-svg")
        ActionChains(driver).move_to_element(lanes).click_and_hold().move_by_offset(
            -200, 0
        ).release().perform()
        panned = wait_until(driver, lambda p: p["from"] > picked["from"] + 1)
        assert panned["to"] - panned["from"] == pytest.approx(picked["to"] - picked["from"])
        ActionChains(driver).send_keys("d").perform()
        wait_until(driver, lambda p: p["from"] > panned["from"] + 1)
        ActionChains(driver).send_keys("s").perform()
        wait_until(driver, lambda p: p["to"] - p["from"] > (panned["to"] - panned["from"]) * 1.5)
        ActionChains(driver).send_keys("0").perform()
        wait_until(driver, lambda p: p["messages"] == layout["messages"])

        # Filter by kind: the reports go, the rest stays.
        driver.find_element(By.CSS_SELECTOR, ".kind-chip[data-kind='report']").click()
        filtered = wait_until(driver, lambda p: "report" not in p["kinds"])
        assert len(filtered["kinds"]) == 5
        driver.find_element(By.CSS_SELECTOR, ".kind-chip[data-kind='report']").click()
        wait_until(driver, lambda p: "report" in p["kinds"])

        # Filter by agent name.
        box = driver.find_element(By.CSS_SELECTOR, ".sl-filter")
        box.send_keys("qa engineer")
        named = wait_until(driver, lambda p: len(p["lanes"]) < 10)
        assert [n for n in named["lanes"] if n not in ("system", "user")] == [
            n for n in team.agents if n.startswith("QA Engineer")
        ]
        box.clear()
        box.send_keys(" ")
        wait_until(driver, lambda p: len(p["lanes"]) == len(layout["lanes"]))

        # Focus one agent: its lane, its partners' lanes, its own messages only.
        focus = "Backend Engineer_2"
        click(driver, f"g.lane[data-agent='{focus}'] .lane-label")
        focused = wait_until(driver, lambda p: len(p["lanes"]) < len(layout["lanes"]))
        partners = {
            m["from"] if m["to"] == focus else m["to"]
            for m in data["messages"]
            if focus in (m["from"], m["to"])
        }
        assert set(focused["lanes"]) == partners | {focus}
        assert focused["arrows"] and all(focus in pair for pair in focused["arrows"])
        assert driver.find_element(By.CSS_SELECTOR, ".focus-chip").text == f"focus: {focus} ✕"
        screenshot(driver, "timeline_team_of_30_focus")
        driver.find_element(By.CSS_SELECTOR, ".focus-chip").click()
        wait_until(driver, lambda p: p["lanes"] == layout["lanes"])
        assert page_errors(driver) == []


def wait_until(driver: Any, check: Any, timeout: float = 10.0) -> dict[str, Any]:
    """The page's layout once ``check`` holds for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        layout: dict[str, Any] = driver.execute_script(LAYOUT)
        if check(layout):
            return layout
        time.sleep(0.1)
    pytest.fail("the page did not change as expected")


def test_hostile_names_and_contents_in_the_exported_page(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = hostile_team(router)
    contents = sorted(m.content for m in router.messages(team))
    router.close()
    page = page_of(url, team, tmp_path)
    text = page.read_text()
    # Nothing of the contents can end the data's script element or start another.
    data_element = text.split('id="timeline-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data_element and "\u2028" not in data_element
    with chromium() as driver:
        driver.get(page.as_uri())
        shown = driver.execute_script(HOSTILE_PAGE)
        assert shown["pwned"] is None and shown["title"] == f"agent-router team {team}"
        assert shown["lanes"] == ["job:__proto__", "Team Leader", *HOSTILE_NAMES]
        assert shown["messages"] == len(contents)
        assert shown["protoPolluted"] is False
        # The data reads back exactly as it was stored.
        assert sorted(m["content"] for m in embedded(driver)["messages"]) == contents
        for content in HOSTILE_CONTENT:
            assert content in contents
        assert page_errors(driver) == []


def test_mermaid_sequence_diagram(story: tuple[str, int]) -> None:
    url, team = story
    proc = timeline(url, team, "--format", "mermaid")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # one diagram, well under Mermaid's limit: nothing to say
    lines = proc.stdout.splitlines()
    assert lines[0] == "sequenceDiagram"
    assert "    actor P_user as user" in lines
    assert "    participant P_UI_Operator_1 as UI Operator_1" in lines
    assert any(
        line.startswith("    P_Team_Leader->>P_Full_Stack_Engineer_1: answer: resolved (question")
        for line in lines
    )
    assert any("-xP_UI_Operator_1: message: rejected" in line for line in lines)
    assert lines.count("    activate P_UI_Operator_1") == 1
    assert lines.count("    deactivate P_UI_Operator_1") == 1


def test_mermaid_past_its_limit_is_summarised_and_split(
    busy: tuple[str, BusyTeam], tmp_path: Path
) -> None:
    url, team = busy
    proc = timeline(url, team.team_id, "--format", "mermaid", "--by-agent")
    assert proc.returncode == 0, proc.stderr
    [said] = proc.stderr.splitlines()
    assert "past Mermaid's 50,000-character limit" in said and "parts" in said
    parts = re.split(r"\n(?=%% part )", proc.stdout)
    assert len(parts) >= 2
    arrows = 0
    for i, part in enumerate(parts, start=1):
        assert len(part) <= 50_000
        lines = part.splitlines()
        assert lines[0].startswith(f"%% part {i} of {len(parts)}: ")
        assert lines[1] == "sequenceDiagram"
        declared = {re.split(r"\s+", line.strip())[1] for line in lines if " as " in line}
        used = set(re.findall(r"P_\w+", "\n".join(lines[2:]))) - {"P_"}
        assert used <= declared  # each part declares its own participants
        for line in lines:
            found = re.match(r"\s+P_\w+(?:->>|-x)P_\w+: (?:(\d+) x )?", line)
            if found:
                arrows += int(found.group(1) or 1)
    # Summarised, not cut: every message is in an arrow.
    assert arrows == team.messages

    out = tmp_path / "team.mmd"
    written = timeline(url, team.team_id, "--format", "mermaid", "--by-agent", "-o", str(out))
    assert written.returncode == 0, written.stderr
    files = sorted(tmp_path.glob("team-*.mmd"))
    assert [f.name for f in files] == [f"team-{i}.mmd" for i in range(1, len(parts) + 1)]
    assert [f.read_text() for f in files] == [p if p.endswith("\n") else p + "\n" for p in parts]


def test_mermaid_of_a_large_team_is_summarised_by_role(busy: tuple[str, BusyTeam]) -> None:
    """30 agents as 30 participants is a diagram thousands of pixels wide: the team is drawn
    by role instead, every message in one arrow, and stderr names the command that draws
    every agent."""
    url, team = busy
    proc = timeline(url, team.team_id, "--format", "mermaid")
    assert proc.returncode == 0, proc.stderr
    [said] = proc.stderr.splitlines()
    assert "summarised by role" in said
    assert f"agent-router timeline {team.team_id} --format mermaid --by-agent" in said
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"%% team {team.team_id}: 30 agents summarised by role")
    assert lines[1] == "sequenceDiagram"
    participants = [line.split(" as ", 1)[1] for line in lines if " as " in line]
    assert participants == [
        "system", "user", "Team Leader", "Frontend Engineer (6)", "Backend Engineer (6)",
        "QA Engineer (6)", "Data Engineer (6)", "Tech Writer (5)",
    ]  # fmt: skip
    counted = 0
    for line in lines[2:]:
        found = re.match(r"\s+P_\w+(?:->>|-x)P_\w+: (\d+) x ", line)
        if found:
            counted += int(found.group(1))
    assert counted == team.messages
    assert len(proc.stdout) < 20_000


def test_unknown_team_is_one_line(story: tuple[str, int]) -> None:
    url, _ = story
    proc = timeline(url, 999)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith("agent-router: error:") and "999" in line


def test_timeline_json_is_the_page_data(story: tuple[str, int], tmp_path: Path) -> None:
    """The page's data parses back (through the script escaping) to what team_timeline built."""
    url, team = story
    from agent_router.ops.timeline import team_timeline

    router = Router(Settings(database_url=url))
    expected = json.loads(json.dumps(team_timeline(router, team), default=str))
    router.close()
    text = page_of(url, team, tmp_path).read_text()
    raw = text.split('id="timeline-data">', 1)[1].split("</script>", 1)[0]
    written = json.loads(raw)
    # Now is when each was read; who is blocked is the same.
    assert written["now"].pop("at") >= expected["now"].pop("at")
    assert written == expected


def test_long_lane_labels_fit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'long.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team().id
    role = "Senior Distributed Systems Reliability Engineer for Payments and Billing"
    name = router.create_agent(team, role=role).display_name
    router.send(team, to=name, content="Check the ledger.", sender="Team Leader")
    router.close()
    with chromium() as driver:
        driver.get(page_of(url, team, tmp_path).as_uri())
        label = driver.execute_script(
            """
            const g = [...document.querySelectorAll("g.lane")].find(
              (l) => l.dataset.agent === arguments[0]);
            const text = g.querySelector(".lane-label");
            const rule = document.querySelector(".label-rule");
            return {text: text.firstChild.nodeValue, title: text.querySelector("title").textContent,
                    right: text.getBBox().x + text.getBBox().width,
                    column: Number(rule.getAttribute("x1"))};
            """,
            name,
        )
        # Shortened in the middle, its number kept, within the label column; whole in its title.
        assert label["text"] != name and "…" in label["text"]
        assert label["text"].endswith("_1") and label["right"] <= label["column"]
        assert label["title"].startswith(name)


def test_a_big_team_is_drawn_a_page_of_lanes_at_a_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'big.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = router.create_team(budget={BudgetName.SUB_AGENTS_CREATED: None,
                                      BudgetName.SUB_AGENTS_ACTIVE: None}).id  # fmt: skip
    names = [router.create_agent(team, role="Worker").display_name for _ in range(130)]
    for name in names:
        router.send(team, to=name, content="Go.", sender="Team Leader", type=MessageType.TASK)
    # Worker_61 (page 2) tells Worker_1 (page 1).
    router.send(team, to=names[0], content="Rebase on mine.", sender=names[60], wake=False)
    router.close()
    with chromium() as driver:
        driver.get(page_of(url, team, tmp_path).as_uri())
        first = driver.execute_script(LAYOUT)
        assert first["lanes"] == ["Team Leader", *names[:59]]
        # The lead's tasks to the page's agents; Worker_61's message as a stub into Worker_1's
        # lane (the lead's tasks to other pages are theirs).
        assert first["messages"] == 59 + 1 and first["stubs"] == 1
        assert "agents 1\u201360 of 131" in driver.find_element(By.CSS_SELECTOR, ".sl-pager").text
        driver.find_element(By.CSS_SELECTOR, "button[title='Next agents']").click()
        second = wait_until(driver, lambda p: p["lanes"] != first["lanes"])
        # Page 2: the lead again, with its tasks to the page's agents; the stub out of
        # Worker_61's lane.
        assert second["lanes"] == ["Team Leader", *names[59:119]]
        assert second["messages"] == 60 + 1 and second["stubs"] == 1
        assert ["Team Leader", names[59]] in second["arrows"]
        [stub] = driver.find_elements(By.CSS_SELECTOR, "g.arrow.stub")
        assert stub.get_attribute("data-stub") == names[0]
        assert "agents 61\u2013120 of 131" in driver.find_element(By.CSS_SELECTOR, ".sl-pager").text
        assert page_errors(driver) == []
        screenshot(driver, "timeline_big_team_page_2")


CALLS = """
return [...document.querySelectorAll("g.call")].map((g) => {
  const bar = g.querySelector(".call-bar").getBBox();
  return {kind: g.dataset.kind, agent: g.dataset.agent, name: g.dataset.name,
          ms: g.dataset.ms, width: bar.width, label: (g.querySelector("text") || {}).textContent};
});
"""


def test_model_and_tool_calls_inside_turns(busy: tuple[str, BusyTeam], tmp_path: Path) -> None:
    url, team = busy
    with chromium() as driver:
        driver.get(page_of(url, team.team_id, tmp_path).as_uri())
        data = embedded(driver)
        drawn = driver.execute_script(CALLS)
        assert len(drawn) == len(data["calls"]) > 100
        assert {c["kind"] for c in drawn} == {"model", "tool"}
        # Zoomed into nine seconds: each span wide enough to say what it is.
        driver.execute_script("window.swimlane.setWindow(6, 15)")
        zoomed = [c for c in driver.execute_script(CALLS) if c["width"] > 60]
        assert any(c["label"] and c["label"].startswith("gpt-4.1-mini") for c in zoomed)
        model = next(c for c in data["calls"] if c["kind"] == "model" and 6 < c["end"] < 15)
        click(driver, f"g.call[data-kind='model'][data-agent='{model['agent']}']"
                      f"[data-ms='{model['ms']}']")  # fmt: skip
        detail = driver.find_element(By.ID, "detail").text
        assert detail.startswith("model call · gpt-4.1-mini")
        assert f"{model['agent']}, turn {model['turn']}" in detail
        assert "prompt" in detail and "completion" in detail and "price unknown" in detail
        tool = next(c for c in data["calls"] if c["kind"] == "tool" and c["outcome"] == "error")
        driver.execute_script("window.swimlane.setWindow(0, null)")
        click(driver, f"g.call.error[data-agent='{tool['agent']}'][data-ms='{tool['ms']}']")
        detail = driver.find_element(By.ID, "detail").text
        assert f"tool call · {tool['name']}" in detail and "error" in detail
        assert page_errors(driver) == []


def test_a_slow_model_call_is_drawn_as_work(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'slow.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = slow_model_team(router, seconds=25.0)
    router.close()
    with chromium() as driver:
        driver.get(page_of(url, team, tmp_path).as_uri())
        layout = driver.execute_script(LAYOUT)
        assert layout["breaks"] == 0  # nothing compressed: the model was working
        [slow] = [c for c in driver.execute_script(CALLS) if c["ms"] == "25000"]
        plot = driver.execute_script(
            "return Number(document.querySelector('#sl-plot rect').getAttribute('width'))"
        )
        # 25 s of about 27.3: most of the plot's width.
        assert slow["width"] > plot * 0.85
        screenshot(driver, "timeline_slow_model_call")


def test_now_names_who_is_blocked_on_whom(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'blocked.db'}"
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    router.create_schema()
    team = blocked_team(router, blocked_for=40.0)
    router.close()
    with chromium() as driver:
        driver.get(page_of(url, team, tmp_path).as_uri())
        data = embedded(driver)
        [item] = driver.find_elements(By.CSS_SELECTOR, "#now li.now-item")
        # Asked 40 s before the page was written (or more, the time it took to write it).
        found = re.match(
            r"Backend Engineer_1 blocked on Team Leader for (?:(\d+) min )?(\d+(?:\.\d)?) s",
            item.text,
        )
        assert found and 60 * int(found.group(1) or 0) + float(found.group(2)) >= 40.0, item.text
        [open_ask] = [q for q in data["questions"] if q["status"] == "open"]
        assert item.get_attribute("data-question") == str(open_ask["id"])
        # The open ask is drawn up to now, past the team's last event.
        svg = driver.find_element(By.ID, "swimlane-svg")
        assert float(svg.get_attribute("data-to") or "nan") == pytest.approx(
            data["now"]["at"], abs=0.01
        )
        band = driver.find_element(By.CSS_SELECTOR, f".wait.open[data-question='{open_ask['id']}']")
        label = driver.find_element(
            By.CSS_SELECTOR, f".wait-label[data-question='{open_ask['id']}']"
        )
        found = re.match(r"blocked (?:(\d+) min )?(\d+(?:\.\d)?) s", label.text)
        assert found and 60 * int(found.group(1) or 0) + float(found.group(2)) >= 40.0, label.text
        assert band.rect["x"] + band.rect["width"] > svg.rect["width"] * 0.6
        # One word for it: the lane's dot, the table and the legend say "blocked".
        row = driver.find_element(By.CSS_SELECTOR, "#agents tr[data-agent='Backend Engineer_1']")
        assert "blocked" in row.text and f"Team Leader (question {open_ask['id']})" in row.text
        legend = driver.find_element(By.ID, "detail").text
        assert "blocked" in legend and "waiting" not in legend
        # A click on it shows the wait.
        item.click()
        assert f"question {open_ask['id']}" in driver.find_element(By.ID, "detail").text
        assert page_errors(driver) == []
        screenshot(driver, "timeline_now_blocked")


ROWS = """
return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)].map((r) =>
  [...r.cells].map((c) => c.textContent));
"""


def test_asks_and_agents_tables_sort(busy: tuple[str, BusyTeam], tmp_path: Path) -> None:
    url, team = busy
    with chromium() as driver:
        driver.get(page_of(url, team.team_id, tmp_path).as_uri())
        data = embedded(driver)
        asks = driver.execute_script(ROWS, "asks")
        assert len(asks) == len(data["questions"]) == team.questions
        # Sorted by how long they waited, longest first (a second click turns it around).
        click(driver, "#asks th button[data-key='waited']")
        click(driver, "#asks th button[data-key='waited']")
        longest = max(data["questions"], key=lambda q: q["wait"])
        first = driver.execute_script(ROWS, "asks")[0]
        assert first[0] == str(longest["id"]) and first[1:3] == [
            longest["asker"],
            longest["target"],
        ]
        assert first[6] == "answered"
        th = driver.find_element(By.CSS_SELECTOR, "#asks th:has(button[data-key='waited'])")
        assert th.get_attribute("aria-sort") == "descending"
        # By asker: in the order of their names.
        click(driver, "#asks th button[data-key='asker']")
        askers = [row[1] for row in driver.execute_script(ROWS, "asks")]
        assert askers == sorted(askers)
        # A row lights its ask and its answer in the lanes.
        click(driver, f"#asks tr[data-question='{longest['id']}']")
        lit = driver.find_elements(
            By.CSS_SELECTOR, f"#swimlane-svg g.arrow.sel[data-question='{longest['id']}']"
        )
        assert {g.get_attribute("data-kind") for g in lit} == {"ask", "answer"}

        # The agents: sorted by model calls, most first; the counts say what they count.
        click(driver, "#agents th button[data-key='model']")
        click(driver, "#agents th button[data-key='model']")
        agents = driver.execute_script(ROWS, "agents")
        calls = [int(row[7]) for row in agents]
        assert calls == sorted(calls, reverse=True) and calls[0] > 0
        caption = driver.find_element(By.CSS_SELECTOR, "#agents caption").text
        assert "whole history" in caption
        # An ask names the other agent, not only its question's number.
        assert all("(question " in row[3] for row in agents if row[3] != "-")
        driver.execute_script("window.swimlane.setWindow(6, 15)")
        caption = driver.find_element(By.CSS_SELECTOR, "#agents caption").text
        assert "the window 6.000 s \u2013 15.00 s" in caption
        # A name focuses the lanes on its agent.
        name = agents[0][0]
        driver.execute_script(
            "[...document.querySelectorAll('#agents a')]"
            ".find((a) => a.textContent === arguments[0]).click()",
            name,
        )
        focused = wait_until(driver, lambda p: len(p["lanes"]) < 30)
        assert name in focused["lanes"]
        assert page_errors(driver) == []
        screenshot(driver, "timeline_asks_table")
