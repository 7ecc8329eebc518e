"""``agent-router timeline``: the swimlane page opened from a file in a real headless Chromium
(lanes, turn bars, message arrows, the ask linked to its answer, click-to-read, no network), and
the Mermaid diagram of the same story."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from agent_router import MessageType, Router, Settings
from agent_router.outbox import RecordingPublisher
from tests.integration.helpers import assistant, start_running, start_waiting
from tests.support.browser import chromium, page_errors, screenshot

CLI = str(Path(sys.executable).parent / "agent-router")


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
        router.send(team, to="UI Operator_1", content="Too late.")
    yield url, team
    router.close()


def timeline(url: str, team: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    return subprocess.run(
        [CLI, "timeline", str(team), "--database-url", url, *args],
        check=False, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def test_swimlane_page_in_a_browser(story: tuple[str, int], tmp_path: Path) -> None:
    url, team = story
    page = tmp_path / "team.html"
    proc = timeline(url, team, "-o", str(page))
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    # Self-contained: nothing is fetched when the page is viewed.
    assert "<script src" not in text and "<link" not in text and "@import" not in text

    with chromium() as driver:
        driver.get(page.as_uri())
        lanes = [
            g.get_attribute("data-agent") for g in driver.find_elements(By.CSS_SELECTOR, "g.lane")
        ]
        assert lanes == ["user", "Team Leader", "UI Operator_1", "Full-Stack Engineer_1"]
        turns = driver.find_elements(By.CSS_SELECTOR, "rect.turn")
        assert {t.get_attribute("data-trigger") for t in turns} == {"new"}
        assert len(turns) == 2  # the UI Operator's (ended) and the Full-Stack Engineer's
        arrows = driver.find_elements(By.CSS_SELECTOR, "line.msg")
        outcomes = {a.get_attribute("data-outcome") for a in arrows}
        assert outcomes == {
            "triggered_new_turn", "injected_inline", "coalesced", "resolved", "queued", "rejected"
        }  # fmt: skip
        assert len(driver.find_elements(By.CSS_SELECTOR, "path.qa-link")) == 1
        # Colours come from the outcome: two arrows of different outcomes differ.
        colours = {a.get_attribute("data-outcome"): a.get_attribute("stroke") for a in arrows}
        assert colours["resolved"] != colours["rejected"]

        # Clicking the answer shows its ledger line and its content.
        answer = next(a for a in arrows if a.get_attribute("data-outcome") == "resolved")
        hits = driver.find_elements(By.CSS_SELECTOR, "line.msg-hit")
        hits[arrows.index(answer)].click()
        detail = driver.find_element(By.ID, "detail").text
        assert "Team Leader -> Full-Stack Engineer_1 (answer)" in detail
        assert "Use auth v2." in detail and "resolved" in detail
        turns[0].click()
        assert "turn" in driver.find_element(By.ID, "detail").text

        loaded = driver.execute_script("return performance.getEntriesByType('resource').length")
        assert loaded == 0
        assert page_errors(driver) == []  # no script error
        screenshot(driver, "timeline_swimlane")


def test_mermaid_sequence_diagram(story: tuple[str, int]) -> None:
    url, team = story
    proc = timeline(url, team, "--format", "mermaid")
    assert proc.returncode == 0, proc.stderr
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


def test_unknown_team_is_one_line(story: tuple[str, int]) -> None:
    url, _ = story
    proc = timeline(url, 999)
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith("agent-router: error:") and "999" in line
