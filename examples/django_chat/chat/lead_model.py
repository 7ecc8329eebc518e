"""The example's stand-in for the host's model client, shaped as the OpenAI SDK's client the task
calls (``client.chat.completions.create(model=..., messages=..., tools=...)``, a Chat
Completions response with its ``usage``): the library's scripted lead, its replies marked
``(chat)`` so that tests can tell the host's loop from the built-in one, and an optional
thinking time (``CHAT_LEAD_THINK_SECONDS``) per call. A deployment passes ``openai.OpenAI()``."""

from __future__ import annotations

import os
import time
from typing import Any

from agent_router.agents.context import count_tokens
from agent_router.agents.llm import ScriptedModel


class ChatLeadClient:
    def __init__(self) -> None:
        self.chat = self.completions = self  # client.chat.completions.create
        self.scripted = ScriptedModel(script=None, name="Team Leader")
        self.think_seconds = float(os.environ.get("CHAT_LEAD_THINK_SECONDS", "0"))

    def create(
        self, *, model: str, messages: list[dict[str, Any]], tools: Any = (), **_: Any
    ) -> dict[str, Any]:
        time.sleep(self.think_seconds)
        reply = self.scripted.complete(messages, list(tools))
        if reply.get("content"):
            reply["content"] = f"(chat) {reply['content']}"
        usage = {"prompt_tokens": count_tokens(messages, tools), "completion_tokens": 10}
        return {"model": model, "choices": [{"index": 0, "message": reply}], "usage": usage}
