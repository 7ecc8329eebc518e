"""The MCP client of a worker process, on the official ``mcp`` SDK.

The agent loop is synchronous (Celery worker threads) and the SDK is asynchronous, so each process
runs one event loop on a daemon thread (:class:`McpHub`) and calls into it with a timeout. The
hub keeps one session per server and reuses it across turns and threads: a stdio server is one
child process of the worker process, an HTTP server one MCP session. Tool lists are fetched once
and cached. A call that finds the connection gone (the server died or restarted) answers with an
error and drops the session; the next call opens a new one.

Every call answers with a string for the transcript, never an exception: a server that is down,
slow or failing is an ``{"ok": false, "reason": ...}`` result the model can read (``reason``:
``server_unavailable``, ``timeout``, ``tool_error``, ``protocol_error``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import hashlib
import os
import re
import sys
import threading
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agent_router.agents.tool_config import NAMESPACE_SEPARATOR, McpServerSpec
from agent_router.agents.tools import fail
from agent_router.logfields import get_logger
from agent_router.validation import tool_output

logger = get_logger(__name__)

T = TypeVar("T")

#: The longest tool name models accept.
MAX_TOOL_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
#: Seconds the hub waits for a session to shut down (a stdio server to exit) on close.
CLOSE_SECONDS = 5.0


class McpUnavailableError(Exception):
    """Raised inside the hub when a server cannot be reached (not started, died, refused)."""


@dataclass(frozen=True, kw_only=True)
class RemoteTool:
    """A tool as a server lists it, under the name the model sees."""

    server: str
    name: str  # the server's own name
    exposed_name: str  # namespaced: ``{server}__{name}``
    description: str
    input_schema: dict[str, Any]


def namespaced(server: str, names: list[str]) -> dict[str, str]:
    """Exposed name -> the server's tool name. Exposed names are ``{server}__{tool}`` with
    characters models refuse replaced, cut to 64 characters; two tools that would still share a
    name get a short hash of their own name, so no two ever collide."""
    exposed: dict[str, str] = {}
    for name in names:
        candidate = f"{server}{NAMESPACE_SEPARATOR}{_UNSAFE.sub('_', name)}"
        if len(candidate) > MAX_TOOL_NAME or candidate in exposed:
            digest = hashlib.sha256(name.encode()).hexdigest()[:8]
            candidate = f"{candidate[: MAX_TOOL_NAME - 9]}_{digest}"
        exposed[candidate] = name
    return exposed


def result_text(result: types.CallToolResult) -> str:
    """A tool result for the transcript: the text the server wrote (structured content as JSON
    when there is no text), or an ``{"ok": false}`` object when the server flagged an error."""
    parts = [_block_text(block) for block in result.content]
    text = "\n".join(p for p in parts if p)
    if result.is_error:
        return fail(text or "the tool reported an error", "tool_error")
    if not text and result.structured_content is not None:
        return tool_output(result.structured_content)
    return text


def _block_text(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return f"[binary resource {resource.uri} ({resource.mime_type or 'unknown type'})]"
    if isinstance(block, types.ResourceLink):
        return f"[resource {block.uri}]"
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type} ({block.mime_type}) not shown]"
    return ""


class _Connection:
    """One server's session, owned by a task of the hub's loop (the SDK's context managers
    must be entered and left by one task)."""

    def __init__(self, spec: McpServerSpec, connect_timeout: float) -> None:
        self.spec = spec
        self.connect_timeout = connect_timeout
        self._session: ClientSession | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def session(self) -> ClientSession:
        async with self._lock:
            if self._session is not None and self._owner is not None and not self._owner.done():
                return self._session
            await self._shutdown()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._owner = asyncio.create_task(self._own(ready, self._stop))
            try:
                async with asyncio.timeout(self.connect_timeout):
                    self._session = await asyncio.shield(ready)
            except Exception as exc:
                await self._shutdown()
                raise McpUnavailableError(f"cannot connect: {_describe(exc)}") from exc
            return self._session

    async def reset(self) -> None:
        async with self._lock:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._session = None
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(owner, CLOSE_SECONDS)
        except (TimeoutError, asyncio.CancelledError):
            owner.cancel()
        except Exception:
            logger.debug("MCP session ended with an error", exc_info=True)

    async def _own(self, ready: asyncio.Future[ClientSession], stop: asyncio.Event) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await self._open_transport(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                ready.set_result(session)
                await stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.info(
                    "MCP session closed",
                    extra={"action": "mcp_session_closed", "server": self.spec.name},
                )
        finally:
            if not ready.done():
                ready.cancel()

    async def _open_transport(self, stack: AsyncExitStack) -> Any:
        spec = self.spec
        if spec.command:
            params = StdioServerParameters(
                command=spec.command[0],
                args=list(spec.command[1:]),
                env=spec.resolved_env() or None,
                cwd=spec.cwd,
            )
            return await stack.enter_async_context(stdio_client(params, errlog=_errlog()))
        assert spec.url is not None
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=spec.resolved_headers(),
                timeout=httpx2.Timeout(self.connect_timeout, read=None),
            )
        )
        return await stack.enter_async_context(streamable_http_client(spec.url, http_client=http))

    async def list_tools(self) -> list[types.Tool]:
        session = await self.session()
        tools: list[types.Tool] = []
        cursor: str | None = None
        try:
            while True:
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                async with asyncio.timeout(self.connect_timeout):
                    page = await session.list_tools(params=params)
                tools.extend(page.tools)
                if not page.next_cursor:
                    return tools
                cursor = page.next_cursor
        except Exception as exc:
            await self.reset()
            raise McpUnavailableError(f"cannot list tools: {_describe(exc)}") from exc

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> str:
        try:
            session = await self.session()
        except McpUnavailableError as exc:
            return fail(
                f"MCP server {self.spec.name!r} is unavailable: {exc}", "server_unavailable"
            )
        try:
            async with asyncio.timeout(timeout):
                result = await session.call_tool(name, arguments)
        except TimeoutError:
            return fail(f"{self.spec.name}: {name} did not answer within {timeout:g}s", "timeout")
        except MCPError as exc:
            if exc.code != types.CONNECTION_CLOSED:  # the server refused this call only
                return fail(f"{self.spec.name}: {exc.message}", "protocol_error", code=exc.code)
            await self.reset()
            return fail(
                f"MCP server {self.spec.name!r} closed the connection; a later call reconnects",
                "server_unavailable",
            )
        except Exception as exc:
            await self.reset()
            return fail(
                f"MCP server {self.spec.name!r} failed: {_describe(exc)}; a later call reconnects",
                "server_unavailable",
            )
        return result_text(result)


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: this process's stderr if it is a file (a Celery
    worker replaces ``sys.stderr`` by a logging proxy without one), else the original stderr,
    else nowhere."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return _Process.devnull()


def _describe(exc: BaseException) -> str:
    """The innermost useful message of an exception (task groups wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:500]


class McpHub:
    """The process's MCP client: an event loop thread and one connection per server name."""

    def __init__(self, *, connect_timeout: float = 20.0) -> None:
        self.connect_timeout = connect_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mcp-client", daemon=True
        )
        self._thread.start()
        self._lock = threading.Lock()
        self._connections: dict[str, _Connection] = {}
        self._tools: dict[str, list[RemoteTool]] = {}
        self._closed = False

    def tools(self, spec: McpServerSpec) -> list[RemoteTool]:
        """The server's tools, fetched on first use and cached for the process's life.
        Raises :class:`McpUnavailableError` when they cannot be fetched (nothing is cached)."""
        connection = self._connection(spec)
        with self._lock:
            cached = self._tools.get(spec.name)
        if cached is not None:
            return cached
        listed = self._run(connection.list_tools(), self.connect_timeout * 3)
        names = namespaced(spec.name, [t.name for t in listed])
        by_name = {t.name: t for t in listed}
        remote = [
            RemoteTool(
                server=spec.name,
                name=original,
                exposed_name=exposed,
                description=by_name[original].description or by_name[original].title or "",
                input_schema=by_name[original].input_schema,
            )
            for exposed, original in names.items()
        ]
        with self._lock:
            self._tools[spec.name] = remote
        return remote

    def call(
        self, spec: McpServerSpec, name: str, arguments: dict[str, Any], timeout: float
    ) -> str:
        """Call a tool; always a result string (see the module's docstring)."""
        try:
            return self._run(
                self._connection(spec).call(name, arguments, timeout),
                timeout + self.connect_timeout + CLOSE_SECONDS,
            )
        except concurrent.futures.TimeoutError:
            return fail(f"{spec.name}: {name} did not answer within {timeout:g}s", "timeout")
        except Exception as exc:  # the hub itself failed: still a result, never a lost call
            logger.exception("MCP call failed", extra={"action": "mcp_call_failed"})
            return fail(f"MCP call failed: {_describe(exc)}", "server_unavailable")

    def close(self) -> None:
        """Close every session (stdio servers exit) and stop the loop thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._connections.values())
        if self._loop.is_running():
            for connection in connections:
                try:
                    self._run(connection.reset(), CLOSE_SECONDS * 2)
                except Exception:
                    logger.debug("MCP session did not close cleanly", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_SECONDS)

    def _connection(self, spec: McpServerSpec) -> _Connection:
        with self._lock:
            if self._closed:
                raise McpUnavailableError("the MCP client is closed")
            old = self._connections.get(spec.name)
            if old is not None and old.spec == spec:
                return old
            # A new declaration under a known name: a new session and a fresh tool list.
            connection = self._connections[spec.name] = _Connection(spec, self.connect_timeout)
            self._tools.pop(spec.name, None)
        if old is not None:
            asyncio.run_coroutine_threadsafe(old.reset(), self._loop)
        return connection

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise


class _Process:
    lock = threading.Lock()
    hub: McpHub | None = None
    pid = 0
    _devnull: TextIO | None = None

    @classmethod
    def devnull(cls) -> TextIO:
        with cls.lock:
            if cls._devnull is None:
                cls._devnull = open(os.devnull, "w")  # noqa: SIM115 - kept for the process
            return cls._devnull


def process_hub(connect_timeout: float = 20.0) -> McpHub:
    """The hub of this process, started on first use (a forked child starts its own: threads
    and pipes do not survive a fork)."""
    with _Process.lock:
        if _Process.hub is None or _Process.pid != os.getpid():
            _Process.hub = McpHub(connect_timeout=connect_timeout)
            _Process.pid = os.getpid()
        return _Process.hub


def close_process_hub() -> None:
    with _Process.lock:
        hub, _Process.hub = _Process.hub, None
        mine = _Process.pid == os.getpid()
    if hub is not None and mine:
        hub.close()


atexit.register(close_process_hub)
