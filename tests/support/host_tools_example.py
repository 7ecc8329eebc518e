"""A host tools module, as ``--host-tools`` / ``AGENT_ROUTER_HOST_TOOLS`` names one: importing
it registers its functions."""

from __future__ import annotations

from agent_router.agents.host_tools import host_tool


@host_tool
def shout(text: str, times: int = 1) -> str:
    """Upper-case a text, repeated ``times`` times."""
    return " ".join([text.upper()] * times)
