"""``agent-router web``, the real binary in a subprocess: in a real headless Chromium following
the demo while it runs (the swimlane grows as the ledger does; each agent's row and its lane
agree); safe to leave running (only its own Host names, a token, 4xx for bad ids with no
driver text, half-open connections holding no thread); hostile names and contents drawn as
text; and a team of 70,000 agents read in pages of lanes and pieces of time, its first data
timed and printed."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from selenium.webdriver.common.by import By

from agent_router import MessageType, Router, Settings
from agent_router.constants import feed_channel
from agent_router.ops.web.server import access, make_server
from agent_router.outbox import RecordingPublisher
from tests.support.browser import chromium, page_errors, screenshot
from tests.support.teams import fill_huge_team

CLI = str(Path(sys.executable).parent / "agent-router")
TIMEOUT = 240.0
TOKEN = "a-token-of-more-than-16-characters"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    return env | extra


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


@contextlib.contextmanager
def serving(url: str, *args: str, **env: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``agent-router web`` on a free port of 127.0.0.1, its address once it listens."""
    port = free_port()
    server = subprocess.Popen(
        [CLI, "web", "--database-url", url, "--port", str(port), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(**env),
    )  # fmt: skip
    try:
        assert server.stderr is not None
        first = server.stderr.readline()
        assert first.startswith(f"agent-router web on http://127.0.0.1:{port}/"), first
        yield f"127.0.0.1:{port}", server
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def web_server(database: str) -> Iterator[str]:
    with serving(database) as (address, _):
        yield f"http://{address}"


def request(
    address: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    method: str = "GET",
    timeout: float = 30,
) -> tuple[int, dict[str, str], bytes]:
    """One request, with exactly the headers given (and Host: the address unless given)."""
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        given = {"Host": address} | (headers or {})
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in given.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def api(base: str, path: str, **headers: str) -> Any:
    status, _, body = request(base.removeprefix("http://"), path, headers=headers)
    assert status == 200, (path, status, body)
    return json.loads(body)


#: What the page shows, read in one go (the page redraws as it polls: no element is kept).
SNAPSHOT = """
const svg = document.getElementById("swimlane-svg");
if (!svg) return null;
const all = (css) => [...document.querySelectorAll(css)];
return {
  last: Number(svg.dataset.lastEvent),
  lanes: all("g.lane[data-agent]").map((g) => g.dataset.agent),
  laneStates: Object.fromEntries(
    all("g.lane[data-state]").map((g) => [g.dataset.agent, g.dataset.state])),
  messages: all("g.arrow").reduce((n, g) => n + Number(g.dataset.count), 0),
  turns: all("rect.turn").length,
  states: Object.fromEntries(
    all("#agents tbody tr").map((r) => [r.dataset.agent, r.dataset.state])),
};
"""
TRANSCRIPT = """
const heads = [...document.querySelectorAll("#transcript .entry .head")];
return heads.length ? heads.map((h) => h.textContent) : null;
"""


def snapshot(driver: Any) -> dict[str, Any] | None:
    page: dict[str, Any] | None = driver.execute_script(SNAPSHOT)
    return page


def test_live_page_follows_the_demo(database: str, web_server: str, tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    with chromium() as driver, demo_running(database, out) as demo:
        # The page opens once the team exists (a team it does not find, it stops asking for).
        wait_for(lambda: request(web_server.removeprefix("http://"), "/api/teams/1")[0] == 200,
                 "the demo's team")  # fmt: skip
        driver.get(web_server + "/#/team/1")
        seen: list[int] = []
        while demo.poll() is None:
            page = snapshot(driver)
            if page:
                seen.append(page["last"])
                # Each row of the table and its lane come from one response: they agree.
                assert page["states"] == page["laneStates"], page
            time.sleep(0.2)
        assert demo.returncode == 0, out.read_text()[-3000:]
        # The page redrew while the demo ran: it followed the ledger as it grew.
        assert len(set(seen)) >= 3, seen

        final = api(web_server, "/api/teams/1/view")
        page = wait_for(
            lambda: (p := snapshot(driver)) and p["last"] == final["last_event_id"] and p,
            "the page to show the last event",
        )
        agents = [lane["name"] for lane in final["lanes"]["items"]]
        assert agents == ["Team Leader", "UI Operator_1", "Full-Stack Engineer_1"]
        # A lane for each agent, and one for each outside sender: the user, and the system
        # when a notice was sent.
        outside = {m["from"] for m in final["messages"] if not m["from_agent"]}
        assert outside >= {"user"}
        assert page["lanes"] == sorted(outside) + agents
        assert page["messages"] == len(final["messages"]) > 10
        assert page["turns"] == len(final["turns"])
        assert page["states"]["Team Leader"] == "completed"
        assert page["states"] == page["laneStates"]
        screenshot(driver, "web_team_swimlane")

        # UI Operator_1 asked Full-Stack Engineer_1: a click on the ask lights its answer and
        # the asker's wait, and the side panel tells how long it waited.
        [question] = [q for q in final["questions"] if q["asker"] == "UI Operator_1"]
        driver.execute_script(
            "document.querySelector(`g.arrow[data-kind='ask'][data-question='${arguments[0]}']`)"
            ".dispatchEvent(new MouseEvent('click', {bubbles: true}))",
            question["id"],
        )
        lit = driver.execute_script(
            "return [...document.querySelectorAll('#swimlane-svg .sel')]"
            ".map((n) => n.dataset.kind || n.getAttribute('class'))"
        )
        assert {"ask", "answer"} <= set(lit) and any("wait" in n for n in lit)
        detail = driver.find_element(By.ID, "detail").text
        assert "waited" in detail and "Full-Stack Engineer_1" in detail
        screenshot(driver, "web_team_ask")

        # An agent's transcript, with where each entry came from.
        driver.execute_script(
            "[...document.querySelectorAll('#agents a')]"
            ".find(a => a.textContent === 'UI Operator_1').click()"
        )
        heads = wait_for(lambda: driver.execute_script(TRANSCRIPT), "the transcript")
        assert heads[0].startswith("[0] system")
        assert any("<- task from Team Leader (message" in h for h in heads), heads
        # No script error.
        assert [e for e in page_errors(driver) if e["source"] != "network"] == []
        screenshot(driver, "web_transcript")

        # "#/" is the list of teams: their agents by state, and no team's heading.
        driver.get(web_server + "/#/")
        # Read at once in the page: the table is drawn again as the page refreshes, and an
        # element found before a redraw is gone after it.
        rows = wait_for(
            lambda: driver.execute_script(
                "return Array.from(document.querySelectorAll('#teams tbody tr'),"
                " r => [r.getAttribute('data-team'), r.innerText])"
            ),
            "the teams",
        )
        assert [team for team, _text in rows] == ["1"]
        assert "3" in rows[0][1] and "completed" in rows[0][1]
        assert driver.find_element(By.ID, "where").text == "· teams"
        assert not driver.find_element(By.ID, "team-view").is_displayed()


MISSING_TEAM = """
const box = document.getElementById("team-error");
const asked = performance.getEntriesByType("resource")
  .filter((e) => new URL(e.name).pathname.startsWith("/api/teams/" + arguments[0])).length;
return box && !box.hidden ? { text: box.textContent, asked: asked } : null;
"""


def test_an_unknown_team_is_said_on_the_page_and_not_polled(database: str, web_server: str) -> None:
    """A team id the server does not have: the page says so in place of the lanes, with a way
    back to the teams, and asks the server nothing more about it until told to try again."""
    with chromium() as driver:
        driver.get(f"{web_server}/#/team/1")
        said = wait_for(lambda: driver.execute_script(MISSING_TEAM, 1), "the error")
        assert said["text"].startswith("unknown team 1"), said
        time.sleep(3)  # three polls' time
        assert driver.execute_script(MISSING_TEAM, 1)["asked"] == said["asked"]
        # The team is made since: "try again" shows it.
        router = Router(Settings(database_url=database), publisher=RecordingPublisher())
        router.create_team()
        router.close()
        driver.find_element(By.CSS_SELECTOR, "#team-error button").click()
        page = wait_for(lambda: snapshot(driver), "the team's swimlane")
        assert page["lanes"] == ["Team Leader"], page
        assert not driver.find_element(By.ID, "team-error").is_displayed()
        driver.get(f"{web_server}/#/team/999")
        said = wait_for(lambda: driver.execute_script(MISSING_TEAM, 999), "the error")
        assert said["text"].startswith("unknown team 999"), said
        back = driver.find_element(By.CSS_SELECTOR, "#team-error a").get_attribute("href")
        assert back is not None and back.endswith("#/"), back
        time.sleep(3)  # three polls' time
        assert driver.execute_script(MISSING_TEAM, 999)["asked"] == said["asked"]
        driver.find_element(By.CSS_SELECTOR, "#team-error a").click()
        wait_for(
            lambda: driver.find_element(By.ID, "teams-view").is_displayed(), "the list of teams"
        )
        assert not driver.find_element(By.ID, "team-error").is_displayed()


def test_web_is_read_only_json(web_server: str) -> None:
    assert api(web_server, "/api/teams") == {"offset": 0, "limit": 50, "total": 0, "items": []}
    address = web_server.removeprefix("http://")
    status, headers, body = request(address, "/api/teams/99")
    assert (status, json.loads(body)) == (404, {"error": "unknown team 99"})
    assert headers["cache-control"] == "no-store"
    assert headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    status, headers, _ = request(address, "/api/teams", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"  # nothing writes


# ---------------------------------------------------------------- safe to leave running


@pytest.fixture
def team_database(database_url: str) -> Iterator[tuple[str, int]]:
    """A team (on SQLite, and on PostgreSQL) with a message and a question."""
    router = Router(Settings(database_url=database_url), publisher=RecordingPublisher())
    team = router.create_team().id
    router.create_agent(team, role="Engineer")
    router.send(team, to="Engineer_1", content="Build it.", sender="Team Leader",
                type=MessageType.TASK)  # fmt: skip
    router.close()
    yield database_url, team


#: What no response may hold: a driver's words, a traceback, SQL.
DRIVER_WORDS = ("psycopg", "sqlite", "sqlalchemy", "traceback", "select ", "postgres", "error:")


def test_only_its_own_host_names_and_a_token(team_database: tuple[str, int]) -> None:
    url, team = team_database
    transcript = f"/api/teams/{team}/agents/Engineer_1/transcript"
    with serving(url, "--token", TOKEN, "--allow-host", "router.internal") as (address, _):
        port = address.split(":")[1]
        # DNS rebinding: a page of another site reaches the port under its own name.
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.2", ""):
            status, _, body = request(address, transcript, headers={"Host": host})
            assert status == 400, host
            assert json.loads(body) == {"error": "this server does not answer to that Host"}
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        for host in (address, f"localhost:{port}", f"[::1]:{port}", "router.internal"):
            status, _, _ = request(address, transcript, headers={"Host": host} | bearer)
            assert status == 200, host
        # No token, a wrong one: 401, for the page and for the data.
        for path in ("/", transcript, f"/api/teams/{team}/view", "/api/teams"):
            assert request(address, path)[0] == 401, path
            wrong = {"Authorization": "Bearer " + TOKEN[:-1] + "x"}
            assert request(address, path, headers=wrong)[0] == 401, path
        # Opening /?token= once sets the cookie and sends the browser on without the token.
        status, headers, _ = request(address, f"/?token={TOKEN}")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"].split(";")[0]
        assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
        assert request(address, transcript, headers={"Cookie": cookie})[0] == 200
        assert request(address, "/?token=wrong-token-wrong-token")[0] == 401
        # Team ids are sequential: without the token, none can be read, known or not.
        assert request(address, "/api/teams/1/view")[0] == 401
        assert request(address, "/api/teams/2/view")[0] == 401

        with chromium() as driver:  # the page itself, entered with the token
            driver.get(f"http://{address}/?token={TOKEN}#/team/{team}")
            assert "token" not in driver.current_url
            page = wait_for(lambda: snapshot(driver), "the swimlane")
            assert page["lanes"] == ["Team Leader", "Engineer_1"]


def test_listening_off_loopback_needs_a_token(team_database: tuple[str, int]) -> None:
    url, _ = team_database
    refused = subprocess.run(
        [CLI, "web", "--database-url", url, "--host", "0.0.0.0", "--port", str(free_port())],
        check=False, capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert refused.returncode == 1
    [line] = refused.stderr.splitlines()
    assert line.startswith("agent-router: error:") and "token" in line
    short = subprocess.run(
        [CLI, "web", "--database-url", url, "--token", "short"],
        check=False, capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert short.returncode == 1 and "16 characters" in short.stderr


def test_bad_ids_are_4xx_without_driver_text(team_database: tuple[str, int]) -> None:
    url, team = team_database
    with serving(url) as (address, _):
        cases = {
            "/api/teams/abc/view": 400,
            "/api/teams/1%00/view": 400,
            "/api/teams/%00": 400,
            "/api/teams/-1/view": 400,
            "/api/teams/1.5/view": 400,
            "/api/teams/99999999999999999999999/view": 404,
            "/api/teams/9223372036854775808/view": 404,
            "/api/teams/9223372036854775807/view": 404,
            f"/api/teams/{team}/agents/%00/transcript": 400,
            f"/api/teams/{team}/agents/{'x' * 5000}/transcript": 400,
            f"/api/teams/{team}/agents/Nobody_1/transcript": 404,
            f"/api/teams/{team}/agents/%FF%FE/transcript": 400,
            # A position is a 32-bit column on both databases.
            f"/api/teams/{team}/agents/Engineer_1/transcript?start=2147483648": 400,
            f"/api/teams/{team}/agents/Engineer_1/transcript?start=9223372036854775807": 400,
            f"/api/teams/{team}/messages/%00": 400,
            f"/api/teams/{team}/messages/99999999999999999999": 404,
            f"/api/teams/{team}/messages/424242": 404,
            f"/api/teams/{team}/turns/abc": 400,
            f"/api/teams/{team}/turns/424242": 404,
            f"/api/teams/{team}/view?from=nan": 400,
            f"/api/teams/{team}/view?from=1e400": 400,
            f"/api/teams/{team}/view?from=5&to=1": 400,
            f"/api/teams/{team}/view?limit=99999999999999999999": 400,
            f"/api/teams/{team}/view?offset=-3": 400,
            f"/api/teams/{team}/view?agent=%00": 400,
            f"/api/teams/{team}/view?focus={'y' * 500}": 400,
            f"/api/teams/{team}/view?focus=Nobody_1": 404,
            "/api/teams?limit=abc": 400,
            "/nothing/here": 404,
        }
        for path, expected in cases.items():
            status, headers, body = request(address, path)
            assert status == expected, (path, status, body)
            assert headers["content-type"] == "application/json", path
            error = json.loads(body)["error"]
            assert "\n" not in error and len(error) <= 300, path
            assert not [w for w in DRIVER_WORDS if w in error.lower()], (path, error)
        # The message of another team is not this team's.
        assert request(address, f"/api/teams/{team + 1000}/messages/1")[0] == 404
        last = api(
            f"http://{address}", f"/api/teams/{team}/agents/Engineer_1/transcript?start=2147483647"
        )
        assert (last["start"], last["entries"]) == (2147483647, [])


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(60)
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_half_open_connections_hold_no_thread(team_database: tuple[str, int]) -> None:
    """300 connections that stop halfway through their request (and one that sends a byte at a
    time) hold no thread: the server's thread count stays what it was, a whole request is
    answered meanwhile, and the server closes the idle ones after its timeout."""
    url, team = team_database
    env = {"AGENT_ROUTER_WEB_TIMEOUT_SECONDS": "3", "AGENT_ROUTER_WEB_THREADS": "4"}
    with serving(url, **env) as (address, server):
        host, port = address.split(":")
        assert request(address, "/api/teams")[0] == 200
        before = _threads(server.pid)
        half_open = []
        for _ in range(300):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(f"GET /api/teams/{team}/view HTTP/1.1\r\nHost: {address}\r\n".encode())
            half_open.append(s)
        trickle = socket.create_connection((host, int(port)), timeout=10)
        try:
            for byte in b"GET /api/teams HTT":
                trickle.sendall(bytes([byte]))
                time.sleep(0.02)
            during = _threads(server.pid)
            status, _, body = request(address, f"/api/teams/{team}/view")
            print(f"\nthreads before {before}, with 301 half-open connections {during}")
            assert status == 200 and json.loads(body)["team_id"] == team
            assert during <= before
            # Idle past the timeout, each is closed by the server.
            for s in half_open[:20]:
                assert _closed_by_server(s)
        finally:
            for s in [*half_open, trickle]:
                s.close()
        assert _threads(server.pid) <= before


def _send_quietly(s: socket.socket, data: bytes) -> bool:
    """Send ``data`` without waiting; ``False`` once the server has closed the connection."""
    try:
        s.send(data, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return True


def test_a_slowloris_neither_starves_the_page_nor_keeps_its_connections(database: str) -> None:
    """1,500 connections (past the server's limit of 1,000) that each send a header line every
    second and never end their request, from a thread that goes on all along: whole requests
    sent meanwhile are all answered, and every slow connection is closed by the server (its
    request is past its deadline however the bytes trickle in, or it made room for a newer
    connection)."""
    env = {"AGENT_ROUTER_WEB_TIMEOUT_SECONDS": "4", "AGENT_ROUTER_WEB_THREADS": "4"}
    with serving(database, **env) as (address, _):
        host, port = address.split(":")
        slow: list[socket.socket] = []
        done = threading.Event()

        def trickle() -> None:
            line = 0
            while not done.wait(1.0):
                line += 1
                for s in slow:
                    _send_quietly(s, f"X-Slow-{line}: a\r\n".encode())

        trickling = threading.Thread(target=trickle, daemon=True)
        answered = 0
        try:
            for _ in range(1500):
                s = socket.create_connection((host, int(port)), timeout=30)
                s.sendall(f"GET /api/teams HTTP/1.1\r\nHost: {address}\r\n".encode())
                slow.append(s)
            trickling.start()
            for _ in range(5):
                with contextlib.suppress(TimeoutError):
                    status, _, body = request(address, "/api/teams", timeout=20)
                    answered += status == 200 and json.loads(body)["total"] == 0
                time.sleep(1)
            done.set()
            trickling.join()
            assert answered == 5
            assert sum(_closed_by_server(s) for s in slow) == len(slow)
        finally:
            done.set()
            for s in slow:
                s.close()


# ---------------------------------------------------------------- hostile names and contents

HOSTILE_NAMES = ("__proto__", "constructor", "toString", "hasOwnProperty")
HOSTILE_CONTENT = (
    "<!--<script>",
    "</script><script>window.pwned = 1; document.title = 'pwned'</script>",
    '<img src=x onerror="window.pwned = 2">',
    "line\u2028separator\u2029paragraph",
    "{{constructor.constructor('window.pwned = 3')()}}",
)


def hostile_team(router: Router) -> int:
    """A team whose agents are named like Object.prototype's properties and whose messages
    hold what would break out of a script element or an attribute."""
    team = router.create_team().id
    for name in HOSTILE_NAMES:
        router.create_agent(team, role="Engineer", display_name=name)
    for i, content in enumerate(HOSTILE_CONTENT):
        router.send(team, to=HOSTILE_NAMES[i % 4], content=content, sender="Team Leader",
                    type=MessageType.TASK)  # fmt: skip
    router.send(team, to="__proto__", content=HOSTILE_CONTENT[1], sender="job:__proto__",
                type=MessageType.NOTICE, wake=False)  # fmt: skip
    return team


HOSTILE_PAGE = """
const all = (css) => [...document.querySelectorAll(css)];
return {
  pwned: window.pwned === undefined ? null : window.pwned,
  title: document.title,
  lanes: all("g.lane[data-agent]").map((g) => g.dataset.agent),
  labels: all("g.lane .lane-label").map((t) => t.textContent),
  messages: all("g.arrow").reduce((n, g) => n + Number(g.dataset.count), 0),
  rows: all("#agents tbody tr").map((r) => r.dataset.agent),
  protoPolluted: Object.getOwnPropertyNames(Object.prototype).some(
    (k) => ["Team Leader", "Engineer_1", "job:__proto__"].includes(k)) ||
    Object.keys(Object.prototype).length > 0,
};
"""


def test_hostile_names_and_contents_on_the_live_page(database: str) -> None:
    router = Router(Settings(database_url=database), publisher=RecordingPublisher())
    team = hostile_team(router)
    contents = {m.id: m.content for m in router.messages(team)}
    router.close()
    with serving(database) as (address, _), chromium() as driver:
        driver.get(f"http://{address}/#/team/{team}")
        page = wait_for(
            lambda: (p := driver.execute_script(HOSTILE_PAGE)) and p["rows"] and p, "the page"
        )
        assert page["pwned"] is None and page["title"] == f"agent-router · team {team}"
        assert page["lanes"] == ["job:__proto__", "Team Leader", *HOSTILE_NAMES]
        assert page["rows"] == ["Team Leader", *HOSTILE_NAMES]
        assert page["messages"] == len(contents)
        assert page["protoPolluted"] is False
        # Each message reads back exactly as it was sent, as text.
        for message_id, content in contents.items():
            driver.execute_script(
                "document.querySelector(`g.arrow[data-message='${arguments[0]}']`)"
                ".dispatchEvent(new MouseEvent('click', {bubbles: true}))",
                message_id,
            )
            shown = wait_for(
                lambda: (t := driver.execute_script(
                    "return document.querySelector('#detail pre.content').textContent"
                )) != "…" and t,
                "the message's content",
            )  # fmt: skip
            assert shown == content
        assert driver.execute_script("return window.pwned === undefined") is True
        assert [e for e in page_errors(driver) if e["source"] != "network"] == []
        screenshot(driver, "web_hostile_names")


# ---------------------------------------------------------------- a team of 70,000 agents


@pytest.fixture(params=["sqlite", "postgresql"])
def huge_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of the test's own holding a team of a lead and 70,000 sub-agents."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'huge.db'}"
    else:
        url = str(request.getfixturevalue("fresh_pg_url"))
    router = Router(Settings(database_url=url))
    router.create_schema()
    started = time.perf_counter()
    fill_huge_team(router.store.engine, 70_000)
    print(
        f"\n{request.param}: team of 70,001 agents written in {time.perf_counter() - started:.1f} s"
    )
    router.close()
    return url


def test_a_team_of_70000_agents_comes_in_pages(huge_database: str) -> None:
    with serving(huge_database) as (address, _):
        started = time.perf_counter()
        status, _, body = request(address, "/api/teams/1/view")
        first = time.perf_counter() - started
        assert status == 200
        view = json.loads(body)
        print(f"first data: {first * 1000:.0f} ms, {len(body):,} bytes")
        lanes = view["lanes"]
        assert (lanes["offset"], lanes["total"], len(lanes["items"])) == (0, 70_001, 60)
        assert len(body) < 200_000
        # The window is read in pieces: each complete up to where the next one starts.
        window = view["window"]
        assert window["to"] == view["end"] > 80 and window["complete_to"] < window["to"]
        messages = {m["id"]: m for m in view["messages"]}
        pieces = [len(body)]
        while view["window"]["complete_to"] < view["window"]["to"]:
            view = api(address, f"/api/teams/1/view?from={view['window']['complete_to']}")
            messages |= {m["id"]: m for m in view["messages"]}
            pieces.append(len(json.dumps(view)))
        took = time.perf_counter() - started
        print(f"whole window: {len(pieces)} pieces, {took:.2f} s, largest {max(pieces):,} bytes")
        # Page 1: the lead and Worker_1..59, each handed a task and reporting back.
        names = {lane["name"] for lane in lanes["items"]}
        assert len(messages) == 2 * 59
        assert all(m["from"] in names and m["to"] in names for m in messages.values())
        assert {m["kind"] for m in messages.values()} == {"task", "report"}
        # The next page, a name, the teams.
        page = api(address, "/api/teams/1/view?offset=69990&to=5")
        # The lead is on every page, first.
        assert [lane["name"] for lane in page["lanes"]["items"]] == [
            "Team Leader",
            *(f"Worker_{k}" for k in range(69990, 70001)),
        ]
        named = api(address, "/api/teams/1/view?agent=worker_6999&to=1")
        assert named["lanes"]["total"] == 11
        focused = api(address, "/api/teams/1/view?focus=Worker_69999")
        assert [lane["name"] for lane in focused["lanes"]["items"]] == [
            "Team Leader",
            "Worker_69999",
        ]
        while focused["window"]["complete_to"] < focused["window"]["to"]:  # its task, its report
            more = api(
                address,
                f"/api/teams/1/view?focus=Worker_69999&from={focused['window']['complete_to']}",
            )
            focused = more | {"messages": focused["messages"] + more["messages"]}
        assert sorted(m["kind"] for m in focused["messages"]) == ["report", "task"]
        teams = api(address, "/api/teams")
        assert teams["items"][0]["agents"] == 70_001
        started = time.perf_counter()
        overview = api(address, "/api/teams/1/overview")
        print(f"overview: {(time.perf_counter() - started) * 1000:.0f} ms")
        assert sum(sum(row[1]) for row in overview["counts"]) == 140_000

        with chromium() as driver:
            driver.get(f"http://{address}/#/team/1")
            drawn = wait_for(
                lambda: driver.execute_script(
                    "return document.getElementById('swimlane-svg') && performance.now()"
                ),
                "the lanes",
                timeout=60,
            )
            print(f"the page drew its first lanes {drawn:.0f} ms after it was asked for")
            page_ = wait_for(lambda: snapshot(driver), "the swimlane")
            assert len(page_["lanes"]) == 60 and page_["lanes"][0] == "Team Leader"
            pager = driver.find_element(By.CSS_SELECTOR, ".sl-pager").text
            assert "agents 1\u201360 of 70,001" in pager
            wait_for(lambda: (p := snapshot(driver)) and p["messages"] == 2 * 59, "every piece")
            screenshot(driver, "web_team_of_70000")

    # Every lane at once (the exported page), and every lane a name keeps: more agents than a
    # statement holds parameters (65,535), read alike on both databases.
    from agent_router.store.timeline import TimelineQuery

    router = Router(Settings(database_url=huge_database))
    try:
        for query in (TimelineQuery(end=1.0), TimelineQuery(end=1.0, name="Worker_")):
            whole = router.store.reads.team_window(1, query)
            assert len(whole.lanes) == (70_001 if query.name is None else 70_000)
            assert len({t.agent_id for t in whole.turns}) > 100
    finally:
        router.close()


# ---------------------------------------------------------------- following a quiet team


@contextlib.contextmanager
def serving_in_process(router: Router, **options: Any) -> Iterator[str]:
    """The web server over ``router`` in a thread of the test; its address."""
    rules = access("127.0.0.1", 0, token=None)
    server = make_server(router, "127.0.0.1", 0, rules=rules, **options)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.effective_port}"
    finally:
        server.close()
        thread.join(timeout=30)


@contextlib.contextmanager
def statements_sent(router: Router) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    sa.event.listen(router.store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(router.store.engine, "before_cursor_execute", record)


def test_a_quiet_team_is_followed_by_a_long_poll_its_feed_wakes(
    team_database: tuple[str, int], redis_url: str
) -> None:
    url, team = team_database
    settings = Settings(database_url=url, redis_url=redis_url)
    router = Router(settings, publisher=RecordingPublisher())
    writer = Router(settings, publisher=RecordingPublisher())
    try:
        # A wait far longer than the test may take: a poll that returns was woken.
        with serving_in_process(router, longest_wait=3600.0) as address:
            base = f"http://{address}"
            latest = api(base, f"/api/teams/{team}")["last_event_id"]
            assert latest > 0
            # The first wait reads the database's installation id (the feed channel's name),
            # once for the process: read it first, so that both polls below cost the same.
            router.store.installation_id()
            # Quiet: a poll waits out its time and reads nothing while it waits.
            with statements_sent(router) as short:
                found = api(base, f"/api/teams/{team}?after={latest}&wait=0.1")
            with statements_sent(router) as long:
                assert api(base, f"/api/teams/{team}?after={latest}&wait=1") == found
            assert found == {"team_id": team, "last_event_id": latest, "waited": True}
            assert short and len(long) == len(short)
            # A page behind the latest event is answered at once, without waiting.
            assert api(base, f"/api/teams/{team}?after={latest - 1}&wait=3600") == {
                "team_id": team,
                "last_event_id": latest,
                "waited": False,
            }
            got: list[dict[str, Any]] = []
            poll = threading.Thread(
                target=lambda: got.append(api(base, f"/api/teams/{team}?after={latest}&wait=3600"))
            )
            poll.start()
            channel = feed_channel(router.store.installation_id(), team)
            listening = redis.Redis.from_url(redis_url)
            wait_for(
                lambda: dict(listening.pubsub_numsub(channel)).get(channel.encode(), 0),
                "the long poll to listen",
            )
            listening.close()
            writer.send(team, to="Team Leader", content="Status, please.")
            poll.join(timeout=120)
            assert not poll.is_alive()
            assert got[0]["waited"] is True and got[0]["last_event_id"] > latest
    finally:
        router.close()
        writer.close()


def test_without_redis_the_page_polls(team_database: tuple[str, int]) -> None:
    """In-process signals never hear of another process's commit: no long poll waits."""
    url, team = team_database
    router = Router(Settings(database_url=url), publisher=RecordingPublisher())
    try:
        with serving_in_process(router, longest_wait=3600.0) as address:
            base = f"http://{address}"
            latest = api(base, f"/api/teams/{team}")["last_event_id"]
            answer = api(base, f"/api/teams/{team}?after={latest}&wait=3600")
            assert answer == {"team_id": team, "last_event_id": latest, "waited": False}
    finally:
        router.close()


def test_the_page_follows_a_quiet_team_by_long_polls(
    team_database: tuple[str, int], redis_url: str
) -> None:
    """Quiet for a minute, the page asks the server to wait on the team's feed: it is listening
    (a Redis subscriber on the team's channel) when the user's message comes, and draws it."""
    url, team = team_database
    settings = Settings(database_url=url, redis_url=redis_url)
    router = Router(settings, publisher=RecordingPublisher())
    writer = Router(settings, publisher=RecordingPublisher())
    channel = feed_channel(router.store.installation_id(), team)
    listening = redis.Redis.from_url(redis_url)
    try:
        with serving_in_process(router) as address, chromium() as driver:
            driver.get(f"http://{address}/#/team/{team}")
            before = wait_for(lambda: snapshot(driver), "the team's swimlane")
            wait_for(
                lambda: dict(listening.pubsub_numsub(channel)).get(channel.encode(), 0),
                "the page's long poll",
                timeout=TIMEOUT,
            )
            writer.send(team, to="Team Leader", content="Status, please.")
            after = wait_for(
                lambda: (p := snapshot(driver)) and p["messages"] > before["messages"] and p,
                "the user's message on the page",
            )
            assert "user" in after["lanes"]
            assert page_errors(driver) == []
    finally:
        listening.close()
        router.close()
        writer.close()
