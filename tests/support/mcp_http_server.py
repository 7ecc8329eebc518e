"""An MCP server over streamable HTTP for tests, built with the SDK's ``MCPServer`` (the SDK's
FastMCP). Run it as a process (``python -m tests.support.mcp_http_server PORT``) so that a test
can kill it and start it again on the same port.

Its tools keep state in the process (a list of notes), which shows what a restart loses; one
tool checks a request header, one fails, one is slow.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from types import TracebackType
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

#: The header ``whoami`` reports, so tests can check the headers a client sends.
TOKEN_HEADER = "x-notes-token"


def build_server() -> MCPServer:
    server = MCPServer("notes")
    notes: list[str] = []

    @server.tool()
    def add_note(text: Annotated[str, Field(description="The note.")]) -> dict[str, object]:
        """Add a note; returns how many notes this server process holds."""
        notes.append(text)
        return {"count": len(notes), "notes": list(notes)}

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails with ``reason``."""
        raise ValueError(reason)

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answers after ``seconds``."""
        await anyio.sleep(seconds)
        return "slept"

    @server.tool()
    def whoami(ctx: Context) -> str:
        """The value of the token header of the request."""
        request = ctx.request_context.request
        headers = getattr(request, "headers", {}) or {}
        return str(headers.get(TOKEN_HEADER, "")) or "anonymous"

    return server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NotesServer:
    """The server as a child process on a fixed port: start, kill, start again."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, timeout: float = 30.0) -> NotesServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.mcp_http_server", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the notes server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> NotesServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()


if __name__ == "__main__":
    build_server().run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
