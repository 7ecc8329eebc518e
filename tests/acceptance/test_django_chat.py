"""The example host, examples/django_chat, run as its users run it: Django's server takes the chat
messages, the host's Celery workers (real processes on Redis) run the lead's turns in the
host's own task and the sub-agents' turns on the built-in loop, all on one PostgreSQL database
migrated by Django and by ``agent-router db upgrade``; the room's live page in a real headless
Chromium, fed by the example's event stream (``Router.events`` in a Django streaming view).

The example's lead model marks its replies ``(chat)``: a lead reply without the mark would have
come from the built-in loop, which must never run a turn the host owns."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from selenium.webdriver.common.by import By

from agent_router import AgentState, LedgerAction, Router, Settings, TurnTrigger
from agent_router.agents.llm import directive
from agent_router.ops.checks import check_team
from tests.conftest import _new_database
from tests.support.browser import chromium, page_errors, screenshot

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_chat"
BIN = Path(sys.executable).parent
TIMEOUT = 90.0
LEAD_RUNNER_TASK = "chat.lead_turn"
#: The default catalogue's roles: the example ships no roles file.
CREATE_RESEARCHER = '@create_sub_agent {"role": "Researcher", "task": "Compare the top 3 CRMs."}'


@dataclass
class ChatHost:
    url: str  # the router's (and Django's) database
    env: dict[str, str]
    web: str  # the Django server's base URL
    tmp: Path

    def worker(self, queue: str, name: str, **extra_env: str) -> subprocess.Popen[bytes]:
        """``celery -A chat_site worker`` on ``queue`` (the host's app, router installed)."""
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "chat_site",
                "worker",
                "-Q",
                queue,
                "--pool=threads",
                "--concurrency=8",
                f"--hostname={name}-{uuid.uuid4().hex[:6]}@localhost",
                "--loglevel=INFO",
            ],
            cwd=EXAMPLE,
            env={**self.env, **extra_env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        _wait(lambda: b"ready." in (self.tmp / f"{name}.log").read_bytes(), f"{name} ready")
        return proc

    def post(self, path: str, **form: str) -> dict[str, Any]:
        data = urllib.parse.urlencode(form).encode()
        with urllib.request.urlopen(f"{self.web}{path}", data=data, timeout=30) as resp:
            result: dict[str, Any] = json.loads(resp.read())
        return result

    def chat(self, room: int) -> list[tuple[str, str]]:
        """The host's chat table, read as the host's own page would show it."""
        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    sa.text(
                        "SELECT author, text FROM chat_chatmessage WHERE room_id = :r ORDER BY id"
                    ),
                    {"r": room},
                ).all()
        finally:
            engine.dispose()
        return [(a, t) for a, t in rows]

    def lead_replies(self, room: int) -> list[str]:
        return [text for author, text in self.chat(room) if author == "Team Leader"]


def _wait(cond: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def host(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatHost]:
    tmp = tmp_path_factory.mktemp("django_chat")
    chat_queue, router_queue = (f"{n}.{uuid.uuid4().hex[:8]}" for n in ("chat", "ar"))
    with _new_database("ar_chat") as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
        env.update(
            # The example, and the library from this checkout (not whichever is installed).
            PYTHONPATH=os.pathsep.join((str(EXAMPLE), str(EXAMPLE.parents[1] / "src"))),
            DJANGO_SETTINGS_MODULE="chat_site.settings",
            CHAT_QUEUE=chat_queue,
            AGENT_ROUTER_DATABASE_URL=url,
            AGENT_ROUTER_BROKER_URL=redis_url,
            AGENT_ROUTER_REDIS_URL=redis_url,
            AGENT_ROUTER_QUEUE=router_queue,
            AGENT_ROUTER_LEASE_SECONDS="3",
            AGENT_ROUTER_HEARTBEAT_SECONDS="0.5",
            AGENT_ROUTER_SWEEP_SECONDS="0.5",
            AGENT_ROUTER_WORK_SECONDS="0.05",
            AGENT_ROUTER_SCRIPTED_WRITE_SECONDS="0.1",
            # The live page's event streams end every two seconds: the browser reconnects.
            CHAT_STREAM_SECONDS="2",
        )
        for args in (
            [str(BIN / "python"), "manage.py", "migrate", "--noinput"],
            [str(BIN / "agent-router"), "db", "upgrade"],
        ):
            done = subprocess.run(
                args, cwd=EXAMPLE, env=env, capture_output=True, text=True, check=False
            )
            assert done.returncode == 0, done.stderr
        port = _free_port()
        web = subprocess.Popen(
            [str(BIN / "python"), "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=EXAMPLE,
            env=env,
            stdout=(tmp / "web.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        chat = ChatHost(url=url, env=env, web=f"http://127.0.0.1:{port}", tmp=tmp)
        # The sub-agents' worker: the host's app on the router's queue (built-in loop).
        agents = chat.worker(router_queue, "agents")
        try:
            _wait(lambda: _answers(chat.web), "the Django server")
            yield chat
        finally:
            for proc in (agents, web):
                _stop(proc)


def _answers(web: str) -> bool:
    try:
        urllib.request.urlopen(f"{web}/rooms/0/", timeout=1)
    except urllib.error.HTTPError:
        return True  # 404: the server is up
    except OSError:
        return False
    return True


@pytest.fixture
def host_worker(host: ChatHost) -> Iterator[subprocess.Popen[bytes]]:
    """The host's worker for its own queue: the lead's turns run here."""
    proc = host.worker(host.env["CHAT_QUEUE"], "chat")
    yield proc
    _stop(proc)


def _router(host: ChatHost) -> Router:
    return Router(Settings(database_url=host.url))


def test_a_chat_message_reaches_the_hosts_lead_and_its_reply_the_chat_table(
    host: ChatHost, host_worker: subprocess.Popen[bytes]
) -> None:
    room = host.post("/rooms/")
    host.post(f"/rooms/{room['room']}/", text=f"Please compare CRMs for us.\n{CREATE_RESEARCHER}")
    _wait(lambda: len(host.lead_replies(room["room"])) >= 2, "the lead's two replies")
    staffed, reported = host.lead_replies(room["room"])[:2]
    assert staffed == "(chat) Done: 1 tool call(s), 0 refused."
    # The sub-agent's completion report (with its progress output, if it came first) woke the
    # lead: the host's task wrote the reply.
    assert re.fullmatch(r"\(chat\) Noted [12] update\(s\) from Researcher_1\.", reported)
    router = _router(host)
    try:
        team = room["team"]
        lead, sub = (router.agent(team, n) for n in ("Team Leader", "Researcher_1"))
        assert lead.runner == f"{LEAD_RUNNER_TASK}@{host.env['CHAT_QUEUE']}"
        assert sub.runner is None
        lead_texts = [
            e["content"]
            for e in router.transcript(team, "Team Leader")
            if e["role"] == "assistant" and e.get("content")
        ]
        assert lead_texts and all(t.startswith("(chat) ") for t in lead_texts)
        sub_texts = [
            e["content"]
            for e in router.transcript(team, "Researcher_1")
            if e["role"] == "assistant" and e.get("content")
        ]
        assert sub_texts and not any(t.startswith("(chat)") for t in sub_texts)
        _wait(lambda: _at_rest(router, team), "the team to come to rest")
        # Every model call of the host's loop was counted: one per reply of the lead's, with the
        # tokens its client reported.
        replies = [e for e in router.transcript(team, "Team Leader") if e["role"] == "assistant"]
        used = router.store.reads.usage_by_agent(team)[lead.id]
        assert used.model_calls == len(replies) >= 2
        assert used.completion_tokens == 10 * len(replies) and used.prompt_tokens > 0
        assert check_team(router, team, quiescent=True).violations == []
    finally:
        router.close()


def _at_rest(router: Router, team: int) -> bool:
    resting = (AgentState.IDLE, AgentState.COMPLETED)
    return all(a.state in resting for a in router.agents(team))


def test_cli_send_to_the_lead_runs_the_hosts_task(
    host: ChatHost, host_worker: subprocess.Popen[bytes]
) -> None:
    room = host.post("/rooms/")
    done = subprocess.run(
        [str(BIN / "agent-router"), "send", str(room["team"]), "Team Leader", "Status, please."],
        env=host.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    _wait(lambda: host.lead_replies(room["room"]) != [], "the lead's reply")
    assert host.lead_replies(room["room"]) == ["(chat) Noted 1 update(s) from user."]


def test_a_lead_turn_killed_with_its_worker_is_recovered_by_the_hosts_task(
    host: ChatHost,
) -> None:
    # A lead that thinks for a while, so that its worker dies mid-turn.
    slow = host.worker(host.env["CHAT_QUEUE"], "chat-slow", CHAT_LEAD_THINK_SECONDS="30")
    router = _router(host)
    try:
        room = host.post("/rooms/")
        team = room["team"]
        host.post(f"/rooms/{room['room']}/", text="Plan the release.")
        _wait(
            lambda: router.agent(team, "Team Leader").state is AgentState.RUNNING,
            "the lead's turn to start",
        )
        slow.send_signal(signal.SIGKILL)
        slow.wait()
        assert host.lead_replies(room["room"]) == []
        fresh = host.worker(host.env["CHAT_QUEUE"], "chat-fresh")
        try:
            _wait(lambda: host.lead_replies(room["room"]) != [], "the recovered lead's reply")
        finally:
            _stop(fresh)
        assert host.lead_replies(room["room"]) == ["(chat) Noted 1 update(s) from user."]
        ledger = router.ledger(team)
        assert any(e.action is LedgerAction.TAKE_OVER for e in ledger)
        turns = router.store.reads.turns(router.agent(team, "Team Leader").id)
        assert [t.trigger for t in turns] == [TurnTrigger.NEW, TurnTrigger.RECOVERY]
    finally:
        _stop(slow)
        router.close()


def test_the_live_page_streams_the_room_once_across_reconnections(host: ChatHost) -> None:
    # The host's lead streams its replies through its turn (turn.complete with
    # stream_to_user), a word at a time.
    streaming = host.worker(
        host.env["CHAT_QUEUE"],
        "chat-streaming",
        AGENT_ROUTER_STREAM_TO_USER="true",
        CHAT_LEAD_CHUNK_SECONDS="0.3",
    )
    room = host.post("/rooms/")
    try:
        with chromium() as driver:
            driver.get(f"{host.web}/rooms/{room['room']}/live")
            body = driver.find_element(By.TAG_NAME, "body")

            def connections() -> int:
                return int(body.get_attribute("data-connections") or 0)

            def shown() -> list[tuple[str, str]]:
                # Read in one script: a line the page redraws between two reads of elements
                # found before would be gone (stale) at the second.
                lines = driver.execute_script(
                    "return Array.from(document.querySelectorAll('#chat li'),"
                    " (li) => [li.className, li.innerText.trim()]);"
                )
                return [(kind, text) for kind, text in lines]

            _wait(lambda: connections() >= 1, "the stream to open")
            text = "Plan the release.\n" + directive("tell_user", text="Looking into it.")
            driver.execute_script("document.getElementById('text').value = arguments[0];", text)
            driver.find_element(By.ID, "send").click()
            _wait(lambda: any(kind == "answer" for kind, _ in shown()), "the lead's answer")
            first = shown()
            assert [kind for kind, _ in first] == ["user", "progress", "answer"]
            assert first[0][1] == text and first[1][1] == "Looking into it."
            assert first[2][1] == host.lead_replies(room["room"])[-1]
            assert first[2][1].startswith("(chat) ")
            # The answer was shown as it was written, then in its place once stored.
            seen = (body.get_attribute("data-seen") or "").split()
            assert "streaming" in seen
            assert seen.index("progress") < seen.index("streaming") < seen.index("answer")
            # Every stream ends: the browser reconnects with its cursor, again and again.
            now = connections()
            _wait(lambda: connections() >= now + 3, "three reconnections")
            assert shown() == first
            assert (body.get_attribute("data-seen") or "").split() == seen
            assert page_errors(driver) == []
            screenshot(driver, "django_chat_live")
    finally:
        _stop(streaming)
