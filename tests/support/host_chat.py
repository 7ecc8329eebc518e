"""A chat backend's Celery app, as a host writes it, for ``celery -A tests.support.host_chat
worker``: its broker from ``CHAT_BROKER_URL`` (not an AGENT_ROUTER_* variable), its own route for
its tasks (``chat.*`` to ``CHAT_QUEUE``), the router wired in with ``install``, and a task that
runs the lead's turns through the turn API with the scripted lead, its replies marked ``(host)``,
each of its model calls counted with ``turn.model_call`` (a client other than the OpenAI SDK's).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from agent_router.agents import hosted
from agent_router.agents.llm import ScriptedModel
from agent_router.worker import install

app = Celery("chat", broker=os.environ["CHAT_BROKER_URL"])
app.conf.task_routes = {"chat.*": {"queue": os.environ.get("CHAT_QUEUE", "chat")}}
install(app)


class HostLead:
    """The host's model for its lead: the scripted lead, replies marked ``(host)``."""

    def __init__(self) -> None:
        self.scripted = ScriptedModel(script=None, name="Team Leader")

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        reply = self.scripted.complete(messages, tools)
        if reply.get("content"):
            reply["content"] = f"(host) {reply['content']}"
        return reply


@app.task(name="chat.lead_turn", acks_late=True, reject_on_worker_lost=True)
def lead_turn(agent_id: int, epoch: int) -> str:
    with hosted.claim(agent_id, epoch) as turn:
        if turn is None:
            return "refused"
        model = HostLead()
        while True:
            with turn.model_call(model="host-lead") as call:
                reply = model.complete(call.messages, call.tools)
                call.usage(None, reply=reply)  # the scripted lead reports no usage: estimated
            if turn.step(reply) is not None:
                break
    return str(turn.outcome)
