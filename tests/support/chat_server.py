"""A scriptable Chat Completions server on 127.0.0.1 for tests that drive the real SDK.

It speaks real HTTP (stdlib ``http.server``, one thread per request), so the client under test
is never patched. Each ``POST /v1/chat/completions`` is recorded and answered by the next
queued :class:`Reply`, else by the ``responder`` callable. Failures are replies too: an error
status, a malformed body, or a delay beyond the client's timeout. A request with
``"stream": true`` gets a successful completion as server-sent events
(:func:`stream_chunks`), ``chunk_seconds`` apart.

    with ChatServer() as server:
        server.enqueue(error(500), completion("hello"))
        ...  # point a client at server.base_url
        assert len(server.requests) == 2
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_PATH = "/v1/chat/completions"
#: The model list an OpenAI-compatible server serves (``agent-router doctor`` reads it).
MODELS_PATH = "/v1/models"


@dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: Mapping[str, str]  # names lower-cased
    body: Any  # the decoded JSON, or None when the body was not JSON
    raw: bytes


@dataclass(frozen=True, kw_only=True)
class Reply:
    """What the server answers. A mapping body is sent as JSON; bytes or str as they are."""

    status: int = 200
    body: Mapping[str, Any] | bytes | str = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0  # wait this long before answering (a slow model, a timeout)
    content_type: str = "application/json"

    def encoded(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


#: Decides the reply to a request when the queue is empty.
Responder = Callable[[RecordedRequest], Reply]


def tool_call(call_id: str, name: str, arguments: Mapping[str, Any] | str) -> dict[str, Any]:
    """A tool call as a Chat Completions response carries it."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


DEFAULT_USAGE: Mapping[str, Any] = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


def completion(
    content: str | None = None,
    tool_calls: Iterable[Mapping[str, Any]] = (),
    *,
    model: str = "test-model",
    usage: Mapping[str, Any] | None = DEFAULT_USAGE,
) -> Reply:
    """A successful response with one choice; ``usage=None`` leaves ``usage`` out, as some
    compatible servers do."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    calls = list(tool_calls)
    if calls:
        message["tool_calls"] = calls
    return Reply(
        body={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
        }
        | ({} if usage is None else {"usage": dict(usage)})
    )


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """A ``usage`` object as OpenAI sends it (cached tokens in ``prompt_tokens_details``)."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def context_length_exceeded(limit: int, asked: int) -> Reply:
    """OpenAI's HTTP 400 for a request longer than the model's context, body as it sends it."""
    return Reply(
        status=400,
        body={
            "error": {
                "message": f"This model's maximum context length is {limit} tokens. However, "
                f"your messages resulted in {asked} tokens. Please reduce the length of the "
                "messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


def error(
    status: int, message: str = "scripted failure", *, retry_after_ms: int | None = 1
) -> Reply:
    """An error response in OpenAI's shape. ``retry_after_ms`` is the server-directed backoff
    that real servers send and the SDK honours: it keeps retries in tests short."""
    headers = {} if retry_after_ms is None else {"retry-after-ms": str(retry_after_ms)}
    return Reply(
        status=status,
        body={"error": {"message": message, "type": "test_error", "code": str(status)}},
        headers=headers,
    )


def message_reply(message: Mapping[str, Any], finish_reason: str = "stop") -> Reply:
    """A response whose message is exactly ``message``, however malformed (a sloppy model's)."""
    return Reply(
        body={
            "id": "chatcmpl-sloppy",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "sloppy-model",
            "choices": [{"index": 0, "message": dict(message), "finish_reason": finish_reason}],
        }
    )


def scripted_lead(mark: str, *, tokens: tuple[int, int] = (100, 10)) -> Responder:
    """A responder that answers as the library's scripted lead on the request's messages and
    tools (a host's lead model behind a real server), its text marked ``mark``, with
    ``tokens`` (prompt, completion) as each reply's ``usage``."""
    from agent_router.agents.llm import ScriptedModel

    def respond(request: RecordedRequest) -> Reply:
        lead = ScriptedModel(script=None, name="Team Leader")
        reply = lead.complete(request.body["messages"], request.body.get("tools") or [])
        content = reply.get("content")
        return completion(
            f"{mark} {content}" if content else content,
            reply.get("tool_calls") or (),
            usage=usage(*tokens),
        )

    return respond


def stream_chunks(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects a server streams a completion ``body`` as: the
    role, the content a word at a time, each tool call in pieces (its id, type and name, then
    its arguments in three parts), the finish reason, and the usage in a last chunk without
    choices (what ``stream_options.include_usage`` asks for)."""
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": body.get("id"),
            "object": "chat.completion.chunk",
            "created": body.get("created"),
            "model": body.get("model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    content = message.get("content")
    if isinstance(content, str):
        chunks += [chunk({"content": word}) for word in re.findall(r"\s*\S+\s*", content)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        head | {"function": {"name": call["function"]["name"], "arguments": ""}}
                    ]
                }
            )
        )
        arguments = call["function"]["arguments"]
        third = -(-len(arguments) // 3) or 1
        for start in range(0, len(arguments), third):
            piece = {"index": index, "function": {"arguments": arguments[start : start + third]}}
            chunks.append(chunk({"tool_calls": [piece]}))
    chunks.append(chunk({}, choice.get("finish_reason")))
    if "usage" in body:
        chunks.append(chunk({}) | {"choices": [], "usage": body["usage"]})
    return chunks


# ------------------------------------------------------- absurd values a broken model writes


def absurd_id(letter: str = "x", length: int = 300) -> str:
    """A tool call id longer than any column holds (ids are up to 200 characters)."""
    return letter * length


def digits(count: int = 5000) -> str:
    """A number of ``count`` digits: more than Python converts to an integer (4,300)."""
    return "9" * count


def nested(depth: int = 100_000) -> str:
    """JSON arrays nested ``depth`` deep: deeper than any parser's recursion."""
    return "[" * depth + "]" * depth


def huge(megabytes: int = 20) -> str:
    """A string of ``megabytes`` MB: far more tokens than a team's budget."""
    return "w" * (megabytes * 1024 * 1024)


# ------------------------------------------------------------------------- a sloppy model

#: The line of the protocol section that names the agent a request is for.
_YOU_ARE = re.compile(r"^You are (.+?), (?:the Team Leader|a |an )", re.MULTILINE)
_ENVELOPE = re.compile(r'^<agent-message type="([a-z]+)" from="([^"]*)"(.*)>$')
_ATTR = re.compile(r' ([a-z_]+)="([^"]*)"')


def agent_of(request: RecordedRequest) -> str:
    """The display name the request's protocol section gives the agent."""
    system = str(request.body["messages"][0].get("content") or "")
    match = _YOU_ARE.search(system)
    if match is None:
        raise AssertionError(f"no agent named in the system prompt: {system[:200]!r}")
    return match.group(1)


@dataclass(frozen=True, kw_only=True)
class Seen:
    """One envelope a model read (a drained message or a resolved wait's result), as the model
    reads it: the first line's attributes and the content below."""

    role: str  # "user" (drained) or "tool" (a call's result)
    type: str
    sender: str
    attrs: Mapping[str, str]
    content: str

    @property
    def question_id(self) -> int | None:
        value = self.attrs.get("question_id")
        return int(value) if value else None


def seen(entry: Mapping[str, Any]) -> Seen | None:
    text = str(entry.get("content") or "")
    head, _, rest = text.partition("\n")
    match = _ENVELOPE.match(head)
    if match is None or not rest.endswith("</agent-message>"):
        return None
    return Seen(
        role=str(entry.get("role")),
        type=match.group(1),
        sender=match.group(2),
        attrs=dict(_ATTR.findall(match.group(3))),
        content=rest[: -len("</agent-message>")].rstrip("\n"),
    )


@dataclass(frozen=True, kw_only=True)
class View:
    """What a model is given in one request, read the way a model would read it."""

    agent: str
    messages: list[dict[str, Any]]
    tools: list[str]

    @property
    def system(self) -> str:
        return str(self.messages[0].get("content") or "")

    @property
    def fresh(self) -> list[dict[str, Any]]:
        """The entries after the model's last reply."""
        out: list[dict[str, Any]] = []
        for entry in reversed(self.messages):
            if entry.get("role") == "assistant":
                break
            out.append(entry)
        return out[::-1]

    def fresh_seen(self) -> list[Seen]:
        return [s for e in self.fresh if (s := seen(e)) is not None]

    def fresh_results(self) -> list[dict[str, Any]]:
        return [e for e in self.fresh if e.get("role") == "tool"]

    def replies(self) -> int:
        return sum(e.get("role") == "assistant" for e in self.messages)

    def all_seen(self) -> list[Seen]:
        return [s for e in self.messages if (s := seen(e)) is not None]


#: One move of a sloppy model: the reply to a request, decided from what the model is given.
Move = Callable[[View], Reply]


class SloppyModel:
    """A :data:`Responder` that plays one model per agent, each a :data:`Move` (a function of
    what that agent is given), the way real models misbehave: prose where a tool call was
    due, broken calls among good ones, calls written as text, forged envelopes. Agents without
    a move reply ``Done.``. Every request is kept per agent as a :class:`View`."""

    def __init__(self, moves: Mapping[str, Move]) -> None:
        self.moves = dict(moves)
        self.views: dict[str, list[View]] = {}
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Reply:
        name = agent_of(request)
        tools = [str(t["function"]["name"]) for t in request.body.get("tools") or []]
        view = View(agent=name, messages=list(request.body["messages"]), tools=tools)
        with self._lock:
            self.views.setdefault(name, []).append(view)
        move = self.moves.get(name)
        return move(view) if move is not None else completion("Done.")

    def requests_of(self, name: str) -> list[View]:
        with self._lock:
            return list(self.views.get(name, []))


class ChatServer:
    """The server: start it (or use it as a context manager), script it, read what it got."""

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        api_key: str | None = None,
        chunk_seconds: float = 0.0,
    ) -> None:
        self.responder = responder
        #: The pause between the chunks of a streamed reply.
        self.chunk_seconds = chunk_seconds
        #: With a key, the model list answers 401 to a request without it, as real servers do.
        self.api_key = api_key
        self._replies: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._thread = threading.Thread(
            # A short poll keeps stop() quick: shutdown waits for the next poll.
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="chat-server",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def enqueue(self, *replies: Reply) -> None:
        """Answer the next requests with these, in order."""
        with self._lock:
            self._replies.extend(replies)

    def fail_first(self, n: int, status: int = 500) -> None:
        """Answer the next ``n`` requests with ``status`` errors."""
        self.enqueue(*(error(status) for _ in range(n)))

    def start(self) -> ChatServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # cuts short replies still waiting out their delay
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # Called from the handler threads.
    def _record_and_reply(self, request: RecordedRequest) -> Reply:
        if request.method == "GET" and request.path == MODELS_PATH:
            # Served beside the script: neither recorded nor taking a scripted reply.
            if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
                return error(401, "invalid api key")
            return Reply(body={"object": "list", "data": [{"id": "test-model", "object": "model"}]})
        with self._lock:
            self._requests.append(request)
            queued = self._replies.popleft() if self._replies else None
        if request.path != CHAT_PATH or request.method != "POST":
            return error(404, f"no route for {request.method} {request.path}")
        if queued is not None:
            return queued
        if self.responder is not None:
            return self.responder(request)
        # 400, not 5xx: a test that forgot to script a reply must fail, not be retried.
        return error(400, "chat_server: no scripted reply left")

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


def _streamable(reply: Reply) -> bool:
    """A successful completion (an error or a malformed body is answered as it is)."""
    return (
        reply.status == 200
        and isinstance(reply.body, Mapping)
        and isinstance(reply.body.get("choices"), list)
        and bool(reply.body["choices"])
        and isinstance(reply.body["choices"][0].get("message"), Mapping)
    )


def _handler_class(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self._serve()

        def do_GET(self) -> None:
            self._serve()

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            reply = server._record_and_reply(
                RecordedRequest(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                    raw=raw,
                )
            )
            if reply.delay_seconds:
                server._wait(reply.delay_seconds)
            if isinstance(body, dict) and body.get("stream") and _streamable(reply):
                self._stream(stream_chunks(reply.body))  # type: ignore[arg-type]
                return
            payload = reply.encoded()
            try:
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing left to answer

        def _stream(self, chunks: list[dict[str, Any]]) -> None:
            try:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    server._wait(server.chunk_seconds)
                self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean; `requests` is the record

    return Handler
