"""The example's stand-in for the host's model client, shaped as the OpenAI SDK's client the task
calls (``client.chat.completions.create(model=..., messages=..., tools=..., stream=...)``, a Chat
Completions response with its ``usage``, or with ``stream=True`` its chunks): the library's
scripted lead, its replies marked ``(chat)`` so that tests can tell the host's loop from the
built-in one, an optional thinking time (``CHAT_LEAD_THINK_SECONDS``) per call and, streamed, a
word at a time (``CHAT_LEAD_CHUNK_SECONDS`` apart). A deployment passes ``openai.OpenAI()``."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any

from agent_router.agents.context import count_tokens
from agent_router.agents.llm import ScriptedModel


class ChatLeadClient:
    def __init__(self) -> None:
        self.chat = self.completions = self  # client.chat.completions.create
        self.scripted = ScriptedModel(script=None, name="Team Leader")
        self.think_seconds = float(os.environ.get("CHAT_LEAD_THINK_SECONDS", "0"))
        self.chunk_seconds = float(os.environ.get("CHAT_LEAD_CHUNK_SECONDS", "0"))

    def create(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: Any = (),
        stream: bool = False,
        **_: Any,
    ) -> Any:
        time.sleep(self.think_seconds)
        reply = self.scripted.complete(messages, list(tools))
        if reply.get("content"):
            reply["content"] = f"(chat) {reply['content']}"
        usage = {"prompt_tokens": count_tokens(messages, tools), "completion_tokens": 10}
        if stream:
            return self._chunks(model, reply, usage)
        return {"model": model, "choices": [{"index": 0, "message": reply}], "usage": usage}

    def _chunks(
        self, model: str, reply: dict[str, Any], usage: dict[str, int]
    ) -> Iterator[dict[str, Any]]:
        """The reply as the SDK streams it (each chunk's JSON body): its text a word at a
        time, its tool calls whole, the usage in a last chunk without choices."""
        for word in re.findall(r"\S+\s*|\s+", reply.get("content") or ""):
            time.sleep(self.chunk_seconds)
            yield {"model": model, "choices": [{"index": 0, "delta": {"content": word}}]}
        calls = [dict(call, index=i) for i, call in enumerate(reply.get("tool_calls") or [])]
        finish = "tool_calls" if calls else "stop"
        delta = {"tool_calls": calls} if calls else {}
        yield {"model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        yield {"model": model, "choices": [], "usage": usage}
