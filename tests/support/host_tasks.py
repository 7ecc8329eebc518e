"""A chat backend's own Celery tasks, for ``celery_includes``: one that has nothing to do with
the router, and one that hands a user's message to a team's lead through the router."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task


@shared_task(name="chat.add")
def add(x: int, y: int) -> int:
    return x + y


@shared_task(bind=True, name="chat.tell_lead")
def tell_lead(self: Task[Any, Any], team_id: int, text: str) -> str:
    """Route ``text`` to the team's lead; the turn it starts is published through this app."""
    from agent_router.worker import runtime

    delivery = runtime.current(self.app).router.send(team_id, to="Team Leader", content=text)
    return delivery.outcome.value
