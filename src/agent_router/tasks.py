"""The library's Celery tasks, for ``include=["agent_router.tasks"]`` in a host's app.

Importing this module registers them (they are shared tasks); they live in
:mod:`agent_router.worker.tasks`."""

from agent_router.worker.tasks import background_done, run_agent_turn, sweep

__all__ = ["background_done", "run_agent_turn", "sweep"]
