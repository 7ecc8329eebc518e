"""Small builders shared by the integration tests."""

from __future__ import annotations

from typing import Any

from agent_router import Router, Turn


def tool_call(call_id: str, name: str = "do_work", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = list(calls)
    return msg


def start_running(router: Router, team_id: int, name: str, content: str = "start") -> Turn:
    """Wake ``name`` and claim its turn: the agent is then ``running``."""
    router.send(team_id, to=name, content=content, sender="user")
    turn = router.claim_turn(team_id, name)
    assert turn is not None
    turn.drain()
    return turn


def start_waiting(
    router: Router, team_id: int, name: str, target: str, call_id: str = "ask-1"
) -> Turn:
    """Put ``name`` in ``waiting``: blocked in an ask to ``target``."""
    turn = start_running(router, team_id, name)
    turn.append_assistant(assistant(None, tool_call(call_id, "ask_master")))
    turn.ask(target, "which auth module?", tool_call_id=call_id)
    return turn
