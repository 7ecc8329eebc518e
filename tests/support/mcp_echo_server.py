"""An MCP server over stdio whose output a test chooses: ``echo`` returns its text unchanged.
Built with the SDK's ``MCPServer``; run as ``python -m tests.support.mcp_echo_server`` (with the
repository as the working directory)."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field


def build_server() -> MCPServer:
    server = MCPServer("echo")

    @server.tool(structured_output=False)  # the text alone, even when it is empty
    def echo(text: Annotated[str, Field(description="What to return.")]) -> str:
        """Returns ``text`` unchanged."""
        return text

    return server


if __name__ == "__main__":
    build_server().run("stdio")
