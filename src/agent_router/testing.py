"""A pytest plugin for a host's own tests: a router on a database of the test's own, a team, and
a Celery worker that runs its turns with the scripted model, on the host's Celery app.

Installed with agent-router (entry point ``pytest11``), so a host's suite has these fixtures
without a ``conftest.py`` line. Every name starts with ``agent_router``, none is autouse, and
they work beside pytest-celery's and ``celery.contrib.pytest``'s (``celery_config``,
``celery_includes``, ``celery_app``, ``celery_worker``, ``celery_session_app``,
``celery_session_worker``): when those are there, the router is wired into the app the test uses
(:func:`agent_router.worker.install`), so a turn that a host's task starts and a task that a turn
starts run on the one app the host tests. Without them, the router's own app is used, on
``memory://``; a host whose own app is current then gets an error at once that names the fixture
to override (``agent_router_app``).

- ``agent_router_database_url``: a new SQLite file with the router's schema (override it to
  use PostgreSQL);
- ``agent_router_settings``: :class:`~agent_router.Settings` for it, with short timings;
- ``agent_router_models``: the model factory turns use (the scripted model; override it with
  your own fake);
- ``agent_router_app``: the Celery app turns are published to and run on (the host's; override
  it to return yours when the plugin cannot tell which it is);
- ``agent_router``: the :class:`~agent_router.Router` (the worker runtime's), and
  ``agent_router_team``: a new team on it;
- ``agent_router_worker``: a worker (threads, in this process) that consumes the router's queue
  of ``agent_router_app`` while the test runs; it yields the runtime.

:func:`settle` waits until a team has nothing left to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from celery import Celery

from agent_router.agents.builder import scripted_models
from agent_router.agents.llm import SCRIPTED_MODEL, ModelFactory
from agent_router.broker import create_app
from agent_router.domain import Team
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.worker import runtime
from agent_router.worker.celery_app import install

#: Worker threads of ``agent_router_worker``: every agent of a small team can run at once.
WORKER_CONCURRENCY = 8
#: How long :func:`settle` waits by default.
SETTLE_SECONDS = 60.0


def settle(router: Router, team_id: int, *, timeout: float = SETTLE_SECONDS) -> None:
    """Wait until no agent of the team runs, is scheduled or has an undelivered message (a
    waiting agent waits on a question); raises ``TimeoutError`` past ``timeout``."""
    from agent_router.ops.demo import DemoTimeoutError, wait_quiescent

    try:
        wait_quiescent(router, team_id, timeout=timeout)
    except DemoTimeoutError as exc:
        raise TimeoutError(str(exc)) from exc


@pytest.fixture
def agent_router_database_url(tmp_path: Path) -> str:
    """A new SQLite database with the router's schema, in the test's temporary directory."""
    url = f"sqlite:///{tmp_path / 'agent_router.db'}"
    router = Router(Settings(database_url=url), publisher=None)
    try:
        router.create_schema()
    finally:
        router.close()
    return url


@pytest.fixture
def agent_router_settings(agent_router_database_url: str) -> Settings:
    """Settings on ``agent_router_database_url``: no sweeper in the test's workers, every agent
    on the scripted model (``openai_model="scripted"``, its sub-agents with the ``do_work``
    tool), and its pauses and the work tool at zero."""
    return Settings(
        database_url=agent_router_database_url,
        worker_sweeper=False,
        work_seconds=0.0,
        scripted_write_seconds=0.0,
        openai_model=SCRIPTED_MODEL,
    )


@pytest.fixture
def agent_router_models(agent_router_settings: Settings) -> ModelFactory:
    """The model of each agent's turns: the scripted model, by role."""
    return scripted_models(agent_router_settings)


#: The Celery fixtures of pytest-celery and ``celery.contrib.pytest``: an app, and the worker
#: fixture that runs it (a test that uses the worker uses its app).
_CELERY_FIXTURES = (
    ("celery_app", "celery_worker"),
    ("celery_session_app", "celery_session_worker"),
)


@pytest.fixture
def agent_router_app(
    request: pytest.FixtureRequest, agent_router_settings: Settings
) -> Iterator[Celery]:
    """The host's Celery app with the router installed (:func:`agent_router.worker.install`):
    ``celery_app`` when the test uses it or ``celery_worker``, ``celery_session_app`` when it
    uses that or ``celery_session_worker``; a test that uses neither gets ``celery_session_app``,
    else ``celery_app``, when one is defined. With no such fixture: the router's own app on
    ``memory://``, unless a Celery app of the host's is the process's current app (a host's
    tasks are bound to it, and no worker of a throwaway app would run what they start): then it
    fails at once, naming the fixture to override."""
    used = set(request.fixturenames)
    wanted = [app for app, worker in _CELERY_FIXTURES if {app, worker} & used]
    if len(wanted) > 1:
        pytest.fail(
            "agent_router_app: this test uses both celery_app and celery_session_app; override "
            "the agent_router_app fixture to return the one the router's turns run on",
            pytrace=False,
        )
    for name in wanted or [app for app, _ in reversed(_CELERY_FIXTURES)]:
        try:
            app: Celery = request.getfixturevalue(name)
        except pytest.FixtureLookupError:
            continue
        yield install(app, agent_router_settings)
        return
    host = _host_app()
    if host is not None:
        pytest.fail(
            f"agent_router_app: the Celery app {host.main!r} is current but this test has no "
            "celery_app or celery_session_app fixture, so the router's turns would run on an "
            "app no worker of yours reads; override the agent_router_app fixture to return "
            "your app (or define celery_app), e.g. `return install(app, agent_router_settings)`",
            pytrace=False,
        )
    own = create_app(agent_router_settings.model_copy(update={"broker_url": "memory://"}))
    yield own
    own.close()


def _host_app() -> Celery | None:
    """The process's current Celery app when a host made it (not Celery's default app)."""
    import importlib

    state: Any = importlib.import_module("celery._state")  # where Celery keeps the current app
    current = state._tls.current_app
    if current is None or current is state.default_app:
        return None
    return cast(Celery, current)


@pytest.fixture
def agent_router_runtime(
    agent_router_settings: Settings, agent_router_app: Celery, agent_router_models: ModelFactory
) -> Iterator[runtime.Runtime]:
    """The process's worker runtime for the test: the router publishes to ``agent_router_app``
    and its turns use ``agent_router_models``; reset afterwards."""
    rt = runtime.configure(agent_router_settings, app=agent_router_app, models=agent_router_models)
    try:
        yield rt
    finally:
        runtime.reset()


@pytest.fixture
def agent_router(agent_router_runtime: runtime.Runtime) -> Router:
    """The router of the test's runtime."""
    return agent_router_runtime.router


@pytest.fixture
def agent_router_team(agent_router: Router) -> Team:
    """A new team: its lead, ``Team Leader``, and no sub-agents yet."""
    return agent_router.create_team()


@pytest.fixture
def agent_router_worker(
    agent_router_runtime: runtime.Runtime, agent_router_app: Celery, agent_router_settings: Settings
) -> Iterator[runtime.Runtime]:
    """A Celery worker in this process (threads) that runs the turns of the router's queue on
    ``agent_router_app`` while the test runs; yields the runtime it uses."""
    from agent_router.worker.threaded import thread_worker

    with thread_worker(
        agent_router_app,
        concurrency=WORKER_CONCURRENCY,
        queues=[agent_router_settings.queue],
        shutdown_timeout=60.0,  # a loaded machine stops the threads slowly
    ):
        yield agent_router_runtime
