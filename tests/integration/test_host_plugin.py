"""The pytest plugin (``agent_router.testing``) in a host's own test suite, run as the host runs
it (a pytest process of its own, in a directory of its own): the router's fixtures wire the
router into the Celery app the host's test uses, or fail at once naming the fixture to
override."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: A host's test with ``celery.contrib.pytest``'s function-scoped app and worker (the plugin
#: Celery ships; pytest-celery's own ``celery_worker`` is a Docker one) and a task bound to that
#: app: the turn it starts runs on the router's worker of that same app.
HOST_TEST_ON_CELERY_APP = """
import pytest
from agent_router.testing import settle


@pytest.fixture
def tell_lead(celery_app):
    @celery_app.task(name="chat.tell_lead", bind=True)
    def tell_lead(self, team_id, text):
        from agent_router.worker import runtime

        router = runtime.current(self.app).router
        return router.send(team_id, to="Team Leader", content=text).outcome.value

    return tell_lead


def test_a_host_task_starts_a_turn(
    celery_app, tell_lead, celery_worker, agent_router_app, agent_router_worker,
    agent_router, agent_router_team,
):
    assert agent_router_app is celery_app
    assert agent_router.publisher.app is celery_app
    told = tell_lead.delay(agent_router_team.id, "Status, please.")
    assert told.get(timeout=30) == "triggered_new_turn"
    settle(agent_router, agent_router_team.id, timeout=30)
    lead = agent_router.agent(agent_router_team.id, "Team Leader")
    assert lead.state.value == "completed"
"""

#: A host whose own app is current, with no Celery fixture the plugin knows.
HOST_TEST_WITHOUT_FIXTURES = """
from celery import Celery

app = Celery("chat_backend", broker="memory://")


def test_the_team(agent_router_worker, agent_router_team):
    pass
"""


def _run_pytest(
    tmp_path: Path, source: str, *args: str, conftest: str = ""
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_host.py").write_text(textwrap.dedent(source))
    (tmp_path / "conftest.py").write_text(conftest)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ROUTER_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--timeout=120", "-o", "addopts=", *args, "test_host.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_hosts_test_on_celery_app_runs_the_turn_its_task_starts(tmp_path: Path) -> None:
    result = _run_pytest(
        tmp_path,
        HOST_TEST_ON_CELERY_APP,
        "-p",
        "no:celery",  # pytest-celery, whose fixtures would shadow celery.contrib.pytest's
        conftest='pytest_plugins = ("celery.contrib.pytest",)\n',
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout


@pytest.mark.parametrize("celery_plugin", [True, False], ids=["pytest-celery", "alone"])
def test_a_host_with_its_own_app_and_no_celery_fixture_is_told_what_to_override(
    tmp_path: Path, celery_plugin: bool
) -> None:
    args = () if celery_plugin else ("-p", "no:celery")
    result = _run_pytest(tmp_path, HOST_TEST_WITHOUT_FIXTURES, *args)
    if celery_plugin:
        # pytest-celery's session app is the one the router is installed in and runs on.
        assert result.returncode == 0, result.stdout[-4000:]
        return
    assert result.returncode == 1, result.stdout[-4000:]
    assert "1 error" in result.stdout
    assert (
        "agent_router_app: the Celery app 'chat_backend' is current but this test has no "
        "celery_app or celery_session_app fixture" in result.stdout
    )
    assert "override the agent_router_app fixture" in result.stdout
    assert "Timeout" not in result.stdout
