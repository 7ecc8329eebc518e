"""The example's stand-in for the host's own model client: the library's scripted lead, with
its replies marked ``(chat)`` so that tests can tell the host's loop from the built-in one, and
an optional thinking time (``CHAT_LEAD_THINK_SECONDS``) per call."""

from __future__ import annotations

import os
import time
from typing import Any

from agent_router.agents.llm import ScriptedModel


class ChatLeadModel:
    def __init__(self) -> None:
        self.scripted = ScriptedModel(script=None, name="Team Leader")
        self.think_seconds = float(os.environ.get("CHAT_LEAD_THINK_SECONDS", "0"))

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        time.sleep(self.think_seconds)
        reply = self.scripted.complete(messages, tools)
        if reply.get("content"):
            reply["content"] = f"(chat) {reply['content']}"
        return reply
