"""The example live chat page (examples/live_chat) in a real headless Chromium: the user's
message, the lead's progress note and its answer appear in order, streamed by server-sent
events from ``Router.events``; the page's stream ends every second and the browser reconnects
with its cursor (``Last-Event-ID``), and nothing is shown twice. Real processes: the example's
web server and ``agent-router worker`` on PostgreSQL and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from agent_router import Router, Settings
from agent_router.agents.llm import SCRIPTED_MODEL, directive
from agent_router.agents.roles import ROLES_FILE_ENV
from tests.support.browser import chromium, page_errors, screenshot
from tests.support.chat_server import ChatServer, scripted_lead

from .test_web import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "live_chat" / "app.py"
BIN = Path(sys.executable).parent


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def live_chat(own_pg_schema_url: str, redis_url: str, tmp_path: Path) -> Iterator[str]:
    """The example's server and a worker on a database of the test's own; its base URL."""
    with _serving(own_pg_schema_url, redis_url, tmp_path) as base:
        yield base


@contextmanager
def _serving(
    database_url: str,
    redis_url: str,
    tmp_path: Path,
    more_env: Mapping[str, str] | None = None,
    stream_seconds: float = 1.0,
) -> Iterator[str]:
    """The example's server and a worker on ``database_url`` (the scripted model unless
    ``more_env`` says otherwise); its base URL."""
    Router(Settings(database_url=database_url)).create_schema()
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
        | {
            "AGENT_ROUTER_DATABASE_URL": database_url,
            "AGENT_ROUTER_BROKER_URL": redis_url,
            "AGENT_ROUTER_REDIS_URL": redis_url,
            "AGENT_ROUTER_QUEUE": f"agent_router.live.{uuid.uuid4().hex[:8]}",
            "AGENT_ROUTER_OPENAI_MODEL": SCRIPTED_MODEL,
            "AGENT_ROUTER_WORKER_SWEEPER": "false",
            ROLES_FILE_ENV: os.environ[ROLES_FILE_ENV],
            "PYTHONPATH": str(ROOT / "src"),
        }
        | dict(more_env or {})
    )
    port = free_port()
    procs = []
    with (tmp_path / "worker.log").open("wb") as wlog, (tmp_path / "web.log").open("wb") as log:
        procs.append(subprocess.Popen(
            [str(BIN / "agent-router"), "worker", "--concurrency=2"],
            env=env, stdout=wlog, stderr=subprocess.STDOUT,
        ))  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, str(APP), "--port", str(port),
             "--stream-seconds", str(stream_seconds)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        ))  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/nothing", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False

        wait_for(up, "the example's server")
        yield base
    finally:
        for proc in procs:
            _stop(proc)


def test_the_page_streams_the_conversation_once_across_reconnections(live_chat: str) -> None:
    with chromium() as driver:
        driver.get(f"{live_chat}/")
        wait_for(lambda: int(driver.find_element(By.TAG_NAME, "body").get_attribute(
            "data-connections") or 0) >= 1, "the stream to open")  # fmt: skip
        text = "Plan the release.\n" + directive("tell_user", text="Looking into it.")
        driver.execute_script("document.getElementById('text').value = arguments[0];", text)
        driver.find_element(By.ID, "send").click()

        def shown() -> list[tuple[str, str]]:
            lines = driver.find_elements(By.CSS_SELECTOR, "#chat li")
            return [(li.get_attribute("class") or "", li.text) for li in lines]

        wait_for(lambda: len(shown()) >= 3, "the lead's answer")
        first = shown()
        assert [kind for kind, _ in first] == ["user", "progress", "answer"]
        assert first[0][1] == text
        assert first[1][1] == "Looking into it."
        connections = int(driver.find_element(By.TAG_NAME, "body").get_attribute(
            "data-connections") or 0)  # fmt: skip
        # Every stream lasts a second: the browser reconnects with its cursor, again and again.
        body = driver.find_element(By.TAG_NAME, "body")
        wait_for(
            lambda: int(body.get_attribute("data-connections") or 0) >= connections + 3,
            "three reconnections",
        )
        time.sleep(1.0)
        assert shown() == first
        assert page_errors(driver) == []
        screenshot(driver, "live_chat")


def test_the_page_shows_the_answer_as_it_is_written_then_the_answer_stored(
    own_pg_schema_url: str, redis_url: str, tmp_path: Path
) -> None:
    # The lead on a model served over HTTP that streams its replies a word at a time.
    with ChatServer(scripted_lead("Lead:"), chunk_seconds=0.3) as model:
        streamed = {
            "AGENT_ROUTER_OPENAI_MODEL": "test-model",
            "AGENT_ROUTER_OPENAI_BASE_URL": model.base_url,
            "AGENT_ROUTER_OPENAI_API_KEY": "sk-test",
            "AGENT_ROUTER_STREAM_TO_USER": "true",
        }
        with (
            _serving(own_pg_schema_url, redis_url, tmp_path, streamed, 60.0) as base,
            chromium() as driver,
        ):
            driver.get(f"{base}/")
            body = driver.find_element(By.TAG_NAME, "body")
            wait_for(lambda: int(body.get_attribute("data-connections") or 0) >= 1, "the stream")
            driver.execute_script("document.getElementById('text').value = 'Plan the release.';")
            driver.find_element(By.ID, "send").click()
            growing = wait_for(
                lambda: driver.find_elements(By.CSS_SELECTOR, "#chat li.streaming"),
                "the answer being written",
            )
            assert growing[0].text.startswith("Lead:")
            wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#chat li.answer"), "answer")
            lines = driver.find_elements(By.CSS_SELECTOR, "#chat li")
            answer = lines[-1].text
            assert [li.get_attribute("class") for li in lines] == ["user", "answer"]
            assert answer.startswith("Lead:")
            # The text was shown as it was written, before the answer took its place.
            assert (body.get_attribute("data-seen") or "").split() == ["user", "delta", "answer"]
            assert all(r.body.get("stream") is True for r in model.requests)
            assert page_errors(driver) == []
            screenshot(driver, "live_chat_streamed")
