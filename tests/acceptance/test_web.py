"""``agent-router web`` in a real headless Chromium, following the demo while it runs: the
swimlane grows as the ledger does and ends drawing every message; an agent's transcript shows
where each entry came from. The demo and the server are the real binaries, in subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import chromium, page_errors, screenshot

CLI = str(Path(sys.executable).parent / "agent-router")
TIMEOUT = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}


def wait_for(check: Any, what: str, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def database(tmp_path: Path) -> str:
    """An empty database with the schema (`agent-router db upgrade`), for the demo to fill."""
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    upgrade = subprocess.run(
        [CLI, "db", "upgrade", "--database-url", url],
        check=False, capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert upgrade.returncode == 0, upgrade.stderr
    return url


@contextlib.contextmanager
def demo_running(url: str, out: Path) -> Iterator[subprocess.Popen[str]]:
    with out.open("w") as sink:
        demo = subprocess.Popen(
            [CLI, "demo", "--json", "--database-url", url],
            stdout=sink, stderr=subprocess.STDOUT, text=True, env=_env(),
        )  # fmt: skip
    try:
        yield demo
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.wait(timeout=60)


@pytest.fixture
def web_server(database: str) -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [CLI, "web", "--database-url", database, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        assert server.stderr is not None
        first = server.stderr.readline()
        assert first.startswith(f"agent-router web on http://127.0.0.1:{port}/"), first
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


#: What the page shows, read in one go (the page redraws every second: no element is kept).
SNAPSHOT = """
const svg = document.getElementById("swimlane-svg");
if (!svg) return null;
const all = (css) => [...document.querySelectorAll(css)];
return {
  last: Number(svg.dataset.lastEvent),
  lanes: all("g.lane").map((g) => g.dataset.agent),
  arrows: all("line.msg").length,
  turns: all("rect.turn").length,
  states: Object.fromEntries(
    all("#agents tbody tr").map((r) => [r.dataset.agent, r.dataset.state])),
  teams: all("nav a").map((a) => a.dataset.team),
};
"""
TRANSCRIPT = """
const heads = [...document.querySelectorAll("#transcript .entry .head")];
return heads.length ? heads.map((h) => h.textContent) : null;
"""


def snapshot(driver: Any) -> dict[str, Any] | None:
    page: dict[str, Any] | None = driver.execute_script(SNAPSHOT)
    return page


def api(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=10) as response:
        return json.loads(response.read())


def test_live_page_follows_the_demo(database: str, web_server: str, tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    with chromium() as driver, demo_running(database, out) as demo:
        # The page is open before the team exists: it shows the team once the demo made it.
        driver.get(web_server + "/#/team/1")
        seen: list[int] = []
        while demo.poll() is None:
            page = snapshot(driver)
            if page:
                seen.append(page["last"])
            time.sleep(0.2)
        assert demo.returncode == 0, out.read_text()[-3000:]
        # The page redrew while the demo ran: it followed the ledger as it grew.
        assert len(set(seen)) >= 3, seen

        final = api(web_server, "/api/teams/1/timeline")
        page = wait_for(
            lambda: (p := snapshot(driver)) and p["last"] == final["last_event_id"] and p,
            "the page to show the last event",
        )
        # A lane for each agent, and for each outside sender: the user, and the system when a
        # notice was sent (a slow run can reach the Team Leader's end of turn with a question
        # open, and the system reminds it).
        assert page["lanes"] == [lane["name"] for lane in final["lanes"]]
        agents = [lane["name"] for lane in final["lanes"] if not lane.get("outside")]
        assert agents == ["Team Leader", "UI Operator_1", "Full-Stack Engineer_1"]
        outside = {m["from"] for m in final["messages"]} - set(agents)
        assert outside >= {"user"}
        assert set(page["lanes"]) == set(agents) | outside
        assert page["arrows"] == len(final["messages"]) > 10
        assert page["turns"] == len(final["turns"])
        assert page["states"]["Team Leader"] == "completed"
        assert page["teams"] == ["1"]
        screenshot(driver, "web_team_swimlane")

        # An agent's transcript, with where each entry came from.
        driver.execute_script(
            "[...document.querySelectorAll('#agents a')]"
            ".find(a => a.textContent === 'UI Operator_1').click()"
        )
        heads = wait_for(lambda: driver.execute_script(TRANSCRIPT), "the transcript")
        assert heads[0].startswith("[0] system")
        assert any("<- task from Team Leader (message" in h for h in heads), heads
        # No script error (requests for team 1 before the demo created it answered 404).
        assert [e for e in page_errors(driver) if e["source"] != "network"] == []
        screenshot(driver, "web_transcript")


def test_web_is_read_only_json(web_server: str) -> None:
    assert api(web_server, "/api/teams") == []
    with pytest.raises(urllib.error.HTTPError) as missing:
        api(web_server, "/api/teams/99")
    assert missing.value.code == 404
    request = urllib.request.Request(web_server + "/api/teams", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as post:
        urllib.request.urlopen(request, timeout=10)
    assert post.value.code == 501  # no handler writes
