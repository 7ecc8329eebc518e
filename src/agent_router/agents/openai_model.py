"""A model served over the OpenAI Chat Completions protocol (OpenAI, vLLM, Ollama, LiteLLM, ...).

Transport, retries and backoff are the official SDK's: it retries connection errors, timeouts,
408/409/429 and 5xx up to ``openai_max_retries`` times with exponential backoff, honouring a
server's ``Retry-After``. This module adds what the SDK does not do: it maps our transcript to a
request, validates the reply strictly and maps it back, and turns every failure into a
:class:`~agent_router.errors.ModelError`.

It also keeps the request inside the model's context window, a hard limit: a request longer
than the window (less a reserve for the reply) is compacted
(:func:`agent_router.agents.context.compact`), and what still does not fit (an oversize tool
result or message, the newest included) is cut in the middle with a note saying exactly how
much was left out (:func:`agent_router.agents.context.fit`), so that no request is sent over
the window as the router counts tokens (:func:`agent_router.agents.context.token_counter`).
When the server still answers HTTP 400 ``context_length_exceeded`` (its tokenizer counts more),
the request is fitted once more, tighter and below the size the server refused, and sent again;
the smaller limit is kept for this model's later calls. The transcript itself is never changed.
Every reply carries its ``usage``, estimated from the texts when the server sent none.

The request's ``messages`` and ``tools`` are already in the wire format, so they are handed to
the SDK as ``extra_body``, which it merges into the body after its client-side transform (a
walk of the whole request in Python on every call): only the small rest is transformed, and
the body is encoded once, by the SDK's JSON encoder, byte for byte as it would be otherwise.

With ``on_delta`` a call is streamed (``stream=True``, the usage asked for in the last chunk):
each piece of the reply's text goes to the sink as it arrives, and the chunks are added up into
the body the same call would have answered unstreamed, mapped by the same functions.

The SDK is an optional extra and is imported only when an :class:`OpenAIModel` is built; the
mapping functions are pure and need no SDK.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent_router.agents.context import (
    NORMAL,
    TIGHT,
    Compaction,
    compact,
    count_tokens,
    fit,
    message_tokens,
    token_counter,
)
from agent_router.agents.llm import DeltaSink
from agent_router.agents.usage import Completion, Usage, usage_from_body
from agent_router.domain import Delta
from agent_router.errors import (
    ConfigurationError,
    ContextLengthExceededError,
    InvalidTranscriptEntryError,
    MalformedModelResponseError,
    ModelError,
)
from agent_router.logfields import get_logger
from agent_router.settings import Settings
from agent_router.validation import scrub, unique_call_ids

if TYPE_CHECKING:
    import openai

logger = get_logger(__name__)

INSTALL_HINT = "pip install 'agent-router[openai]'"

#: The keys the protocol defines per role. Entries may carry more (a host's bookkeeping), and
#: strict servers reject unknown keys, so only these are sent.
_REQUEST_KEYS: Mapping[str, tuple[str, ...]] = {
    "system": ("content", "name"),
    "developer": ("content", "name"),
    "user": ("content", "name"),
    "assistant": ("content", "name"),  # tool_calls are rebuilt separately
    "tool": ("content", "tool_call_id"),
}

#: The entries, and the characters of their texts, an :class:`OpenAIModel` keeps mapped and
#: counted from its recent requests.
_MEMO_ENTRIES = 8192
_MEMO_CHARS = 16 * 2**20


def _chars(entry: Mapping[str, Any]) -> int:
    content = entry.get("content")
    return 64 + (len(content) if isinstance(content, str) else 0)


#: The request's keys sent as they are, past the SDK's transform.
_WIRE_KEYS = ("messages", "tools")

#: Longest excerpt of a bad body quoted in an error message.
_EXCERPT = 200


# ---------------------------------------------------------------------------- mapping: request


def request_messages(transcript: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Our transcript as the request's ``messages``.

    Keeps only the protocol's keys, drops an empty ``tool_calls`` list (servers reject it) and
    sends tool call arguments as the JSON string the protocol wants (a host may have stored a
    dict); a text no encoding writes is sent with U+FFFD in place of what it cannot. Raises
    :class:`InvalidTranscriptEntryError` on an entry no server could accept.
    """
    return [request_message(i, entry) for i, entry in enumerate(transcript)]


def request_message(i: int, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Transcript entry ``i`` as a request message (see :func:`request_messages`)."""
    role = entry.get("role")
    if not isinstance(role, str) or role not in _REQUEST_KEYS:
        raise InvalidTranscriptEntryError(f"transcript entry {i}: unknown role {role!r}")
    message: dict[str, Any] = {"role": role}
    message.update({k: _sendable(entry[k]) for k in _REQUEST_KEYS[role] if k in entry})
    if role == "tool" and not isinstance(entry.get("tool_call_id"), str):
        raise InvalidTranscriptEntryError(f"transcript entry {i}: tool result without id")
    if role == "assistant":
        calls = [_request_tool_call(i, call) for call in entry.get("tool_calls") or ()]
        if calls:
            message["tool_calls"] = calls
        # The protocol requires the key on an assistant message, even when it is null.
        message.setdefault("content", None)
    return message


def _request_tool_call(i: int, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if (
        not isinstance(function, Mapping)
        or not isinstance(call.get("id"), str)
        or not isinstance(function.get("name"), str)
    ):
        raise InvalidTranscriptEntryError(f"transcript entry {i}: malformed tool call {call!r}")
    arguments = _sendable(function.get("arguments", "{}"))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not _is_json_object(arguments):
        # A repaired call keeps the model's broken string in the transcript; servers that parse
        # arguments (a chat template, a strict validator) get it wrapped in an object instead.
        arguments = json.dumps({UNPARSED_ARGUMENTS: arguments}, ensure_ascii=False)
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _sendable(value: Any) -> Any:
    """A text as a request can carry it: a lone surrogate (in a transcript written before
    replies were made storable) becomes U+FFFD, so that the request encodes."""
    return scrub(value) if isinstance(value, str) else value


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):  # not JSON, a number too long, nested too deep
        return False


# --------------------------------------------------------------------------- mapping: response

#: The name given to a tool call that came without one (the loop answers it with an error
#: result that says so). A valid function name, so that the call can be sent back.
NAMELESS_TOOL = "unnamed_tool_call"
#: The key under which arguments that are not a JSON object are sent back to the server.
UNPARSED_ARGUMENTS = "unparsed_arguments"


def assistant_message(body: Any) -> dict[str, Any]:
    """``choices[0].message`` of a Chat Completions response body as our assistant message:
    ``{"role": "assistant", "content": str | None, "tool_calls": [...]}``, ``tool_calls``
    omitted when there are none.

    What a sloppy model writes is repaired, never discarded: content sent as a list of parts is
    joined into one string; a tool call without an id gets a fresh one;
    arguments sent as an object are written as a JSON string; arguments that are not a JSON
    object are kept as they came (the loop answers that call with an error result the model
    can fix, and runs the rest of the reply); a repeated id is renamed
    (:func:`~agent_router.validation.unique_call_ids`); a call without a function name is named
    :data:`NAMELESS_TOOL`. A reply with neither content nor tool calls is an empty reply
    (``content`` ``""``): the loop asks again. Raises :class:`MalformedModelResponseError` only
    when the body is not a Chat Completions response at all.
    """
    if not isinstance(body, Mapping):
        raise _malformed("the body is not a JSON object", body)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _malformed("no choices", body)
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping):
        raise _malformed("choices[0] has no message", body)
    if message.get("role", "assistant") != "assistant":
        raise _malformed(f"message role is {message.get('role')!r}, not 'assistant'", body)
    content = _content(message.get("content"), body)
    if content is None and isinstance(message.get("refusal"), str):
        # A refusal is the model's answer: the agent (and its lead) should read it.
        content = message["refusal"]
    raw_calls = message.get("tool_calls")
    if isinstance(raw_calls, Mapping):
        raw_calls = [raw_calls]  # one call not wrapped in a list
    if raw_calls is not None and not isinstance(raw_calls, list):
        raise _malformed("tool_calls is not a list", body)
    calls = unique_call_ids([_response_tool_call(raw) for raw in raw_calls or ()])
    if content is None and not calls:
        reason = choice.get("finish_reason") if isinstance(choice, Mapping) else None
        logger.warning(
            "empty model reply", extra={"action": "model_reply_empty", "finish_reason": reason}
        )
        content = ""
    result: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        result["tool_calls"] = calls
    return result


def _content(content: Any, body: Any) -> str | None:
    """A string, ``None``, or a list of parts (``{"type": "text", "text": ...}`` or strings)
    joined into one string."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part if isinstance(part, str) else str(part.get("text") or "")
            for part in content
            if isinstance(part, str | Mapping)
        ]
        return "".join(parts)
    raise _malformed("message content is neither a string, a list of parts nor null", body)


def _fresh_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _response_tool_call(call: Any) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        # Not even an object: kept as a nameless call whose arguments show what came.
        text = json.dumps(call, ensure_ascii=False, default=str)
        return _call(_fresh_id(), NAMELESS_TOOL, text)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id.strip():
        call_id = _fresh_id()
    function = call.get("function")
    if not isinstance(function, Mapping):
        function = call  # some servers put name and arguments on the call itself
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        name = NAMELESS_TOOL
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, default=str)
    # The model's own string is kept: it is what the tool parses and what the model sees again.
    return _call(call_id, name.strip(), arguments)


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def streamed_body(chunks: Iterable[Any], on_text: Callable[[str], None]) -> dict[str, Any]:
    """The Chat Completions response body that streamed ``chunks`` (each a decoded
    ``chat.completion.chunk``) add up to, for :func:`assistant_message`: the pieces of the
    first choice's content, refusal, and each tool call's (by its ``index``) id, name and
    arguments joined in order, its last ``finish_reason``, and the ``usage`` of the last chunk
    that had one. Each non-empty piece of content goes to ``on_text`` as it comes. Raises
    :class:`MalformedModelResponseError` when a chunk is not an object or no chunk had a
    choice."""
    content: list[str] = []
    refusal: list[str] = []
    calls: dict[Any, dict[str, Any]] = {}
    finish: Any = None
    usage: Any = None
    chosen = False
    for chunk in chunks:
        if not isinstance(chunk, Mapping):
            raise _malformed("a streamed chunk is not a JSON object", chunk)
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            chosen = True
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta")
            if not isinstance(delta, Mapping):
                continue
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                content.append(piece)
                on_text(piece)
            if isinstance(delta.get("refusal"), str):
                refusal.append(delta["refusal"])
            for raw in delta.get("tool_calls") or ():
                if isinstance(raw, Mapping):
                    _add_call_piece(calls.setdefault(raw.get("index", len(calls)), {}), raw)
    if not chosen:
        raise _malformed("no streamed chunk had a choice", {"usage": usage})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(content) if content else None,
    }
    if refusal:
        message["refusal"] = "".join(refusal)
    if calls:
        message["tool_calls"] = list(calls.values())
    body: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return body


def _add_call_piece(call: dict[str, Any], piece: Mapping[str, Any]) -> None:
    """One streamed piece of a tool call added to what came of it before: the id and type
    once, the name's and the arguments' texts appended."""
    for key in ("id", "type"):
        if isinstance(piece.get(key), str) and piece[key] and key not in call:
            call[key] = piece[key]
    function = piece.get("function")
    if not isinstance(function, Mapping):
        return
    assembled = call.setdefault("function", {})
    for key in ("name", "arguments"):
        if isinstance(function.get(key), str):
            assembled[key] = assembled.get(key, "") + function[key]


def _malformed(reason: str, body: Any) -> MalformedModelResponseError:
    text = json.dumps(body, ensure_ascii=False, default=str)
    excerpt = text if len(text) <= _EXCERPT else text[: _EXCERPT - 1] + "…"
    return MalformedModelResponseError(f"malformed model response: {reason}: {excerpt}")


# ------------------------------------------------------------------------------------ the model


def _is_transient(status_code: int) -> bool:
    return status_code in (408, 409, 429) or status_code >= 500


#: OpenAI's wording of a context_length_exceeded error (other servers word it their own way).
_WINDOW = re.compile(r"maximum context length is (\d+) tokens")
_ASKED = re.compile(r"resulted in (\d+) tokens")


def tighter_limit(sent_tokens: int, error: str) -> int:
    """A request limit below the one a server refused: its stated window scaled to our count,
    less a tenth, when the error says both numbers (the request is then fitted to it, a hard
    limit), else half of what was sent."""
    window, asked = _WINDOW.search(error), _ASKED.search(error)
    if window and asked and int(asked.group(1)) > 0:
        scale = sent_tokens / int(asked.group(1))
        return max(1, min(sent_tokens - 1, int(int(window.group(1)) * scale * 0.9)))
    return max(1, sent_tokens // 2)


class OpenAIModel:
    """A :class:`~agent_router.agents.llm.Model` calling an OpenAI-compatible Chat Completions
    server.

    Everything comes from :class:`Settings` (``openai_*``). One instance holds one SDK client
    (a connection pool); it is safe to share between threads. Raises
    :class:`ConfigurationError` when the SDK is missing or the model or API key is unset.
    """

    def __init__(self, settings: Settings) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ConfigurationError(
                f"OpenAIModel needs the openai package: {INSTALL_HINT}"
            ) from exc
        if not settings.openai_model:
            raise ConfigurationError("no model name: set openai_model (AGENT_ROUTER_OPENAI_MODEL)")
        if not settings.openai_api_key:
            # Even servers that check no key need one: the SDK refuses to send without it.
            raise ConfigurationError(
                "no API key: set AGENT_ROUTER_OPENAI_API_KEY or OPENAI_API_KEY"
            )
        self.model_name = settings.openai_model
        spec = settings.models.get(self.model_name)
        self.context_window = (spec and spec.context_window) or settings.context_window
        self._reserve = min(settings.context_reserve_tokens, self.context_window // 4)
        self._count = token_counter(self.model_name)
        # Lowered (and compaction made tighter) when the server refuses a request as too long,
        # for this model's later calls too; shared by the threads.
        self._limit = self.context_window - self._reserve
        self._how = NORMAL
        # Entries of recent requests, mapped and counted (see _prepared), by identity.
        # id -> (entry, its content, request message, tokens, characters)
        self._memo: OrderedDict[int, tuple[dict[str, Any], Any, dict[str, Any], int, int]] = (
            OrderedDict()
        )
        self._memo_chars = 0
        self._memo_lock = threading.Lock()
        self._last_tools: tuple[list[dict[str, Any]] | None, int] = (None, 0)
        self.temperature = settings.openai_temperature
        self.timeout_seconds = settings.openai_timeout_seconds
        self.max_retries = settings.openai_max_retries
        self._client: openai.OpenAI = openai.OpenAI(
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url,
            timeout=settings.openai_timeout_seconds,
            max_retries=settings.openai_max_retries,
        )

    def __repr__(self) -> str:
        return f"OpenAIModel(model={self.model_name!r}, base_url={str(self._client.base_url)!r})"

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return self.respond(messages, tools).message

    def respond(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_delta: DeltaSink | None = None,
    ) -> Completion:
        """One call: the reply and its usage. The request is compacted to fit the window, and
        once more (tighter) if the server still finds it too long. With ``on_delta`` the call
        is streamed and each piece of the reply's text goes to it as it arrives (one
        ``stream`` id per call); the reply is the same as unstreamed."""
        mapped, sizes = self._prepared(messages)
        tool_tokens = self._tool_tokens(tools)
        sent, tokens = self._fitted(mapped, sizes, tool_tokens, self._how)
        try:
            body = self._body(self._request(sent, tools), on_delta)
        except ContextLengthExceededError as exc:
            sent_tokens = tokens + tool_tokens
            self._limit = min(self._limit, tighter_limit(sent_tokens, str(exc)))
            self._how = TIGHT
            sent, tokens = self._fitted(mapped, sizes, tool_tokens, TIGHT)
            logger.warning(
                "request too long for the model: compacted tighter and sent again",
                extra={
                    "action": "context_compacted",
                    "model": self.model_name,
                    "refused_tokens": sent_tokens,
                    "limit": self._limit,
                    "messages": len(mapped),
                    "sent": len(sent),
                },
            )
            body = self._body(self._request(sent, tools), on_delta)
        message = assistant_message(body)
        usage = usage_from_body(body) or Usage(
            prompt_tokens=tokens + tool_tokens,
            completion_tokens=count_tokens([message], (), self._count),
            estimated=True,
        )
        return Completion(message=message, usage=usage, model=self.model_name)

    def _prepared(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
        """The messages as the request holds them (:func:`request_message`) and their tokens,
        each entry mapped and counted once while it is in this model's recent requests: a
        loop sends the same entries (the same objects, never changed in place) call after
        call, so a call maps and counts only the entries new since."""
        mapped: list[dict[str, Any]] = []
        sizes: list[int] = []
        memo, get = self._memo, self._memo.get
        with self._memo_lock:
            for i, entry in enumerate(messages):
                known = get(id(entry))
                # The same object with the same text: an entry a host changed in place (its
                # content replaced) is mapped again.
                if known is None or known[0] is not entry or known[1] is not entry.get("content"):
                    if known is not None:
                        self._memo_chars -= known[4]
                    message = request_message(i, entry)
                    size = message_tokens(message, self._count)
                    known = (entry, entry.get("content"), message, size, _chars(entry))
                    memo[id(entry)] = known
                    self._memo_chars += known[4]
                mapped.append(known[2])
                sizes.append(known[3])
            # Bounded in entries and in characters, the oldest mapped let go first: the memo
            # holds its entries alive.
            while memo and (len(memo) > _MEMO_ENTRIES or self._memo_chars > _MEMO_CHARS):
                _key, gone = memo.popitem(last=False)
                self._memo_chars -= gone[4]
        return mapped, sizes

    def _tool_tokens(self, tools: list[dict[str, Any]]) -> int:
        """The tokens of the tool schemas: counted once per list (a loop sends the same list
        at every call of a turn; a list is never changed in place once sent)."""
        last, tokens = self._last_tools
        if tools is not last:
            tokens = count_tokens([], tools, self._count)
            self._last_tools = (tools, tokens)
        return tokens

    def _fitted(
        self, mapped: list[dict[str, Any]], sizes: list[int], tool_tokens: int, how: Compaction
    ) -> tuple[list[dict[str, Any]], int]:
        """The messages sent, within the limit less the tool schemas, and their tokens."""
        limit = self._limit - tool_tokens
        total = sum(sizes)
        if total <= limit:
            return mapped, total
        compacted = compact(mapped, limit=limit, count=self._count, how=how, sizes=sizes)
        return fit(compacted, limit=limit, count=self._count)

    def _request(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.model_name, "messages": messages}
        if tools:  # some servers reject an empty list
            request["tools"] = tools
        if self.temperature is not None:
            request["temperature"] = self.temperature
        return request

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _body(self, request: dict[str, Any], on_delta: DeltaSink | None) -> Any:
        """The decoded response body: sent whole, or streamed into ``on_delta`` and added up."""
        if on_delta is not None:
            return self._streamed(request, on_delta)
        raw = self._send(request)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            excerpt = raw[:_EXCERPT].decode("utf-8", "replace")
            raise MalformedModelResponseError(
                f"malformed model response: the body is not JSON: {excerpt!r}"
            ) from exc

    def _streamed(self, request: dict[str, Any], on_delta: DeltaSink) -> dict[str, Any]:
        """POST the request with ``stream=True`` (the SDK retries its start as any request)
        and add up the chunks (:func:`streamed_body`), each text piece handed on as it comes."""
        import openai

        stream_id, seq = uuid.uuid4().hex, iter(range(2**62))

        def on_text(text: str) -> None:
            on_delta(Delta(stream=stream_id, seq=next(seq), text=text))

        wire = {key: request[key] for key in _WIRE_KEYS if key in request}
        try:
            stream = self._client.chat.completions.create(
                **(request | {key: [] for key in wire}),
                extra_body=wire,
                stream=True,
                stream_options={"include_usage": True},
            )
            with stream:
                return streamed_body((c.to_dict(warnings=False) for c in stream), on_text)
        except openai.OpenAIError as exc:  # a broken stream too (a connection error)
            raise self._failed(self._model_error(exc)) from exc
        except (ValueError, RecursionError) as exc:
            raise MalformedModelResponseError(
                f"malformed model response: a streamed chunk is not JSON: {exc}"
            ) from exc

    def _failed(self, error: ModelError) -> ModelError:
        logger.warning(
            "model call failed: %s",
            error,
            extra={
                "action": "model_call",
                "model": self.model_name,
                "status_code": error.status_code,
                "transient": error.transient,
            },
        )
        return error

    def _send(self, request: dict[str, Any]) -> bytes:
        """POST the request (the SDK retries transient failures); the raw response body.

        The raw body is read rather than the SDK's parsed object: without strict validation
        the SDK builds objects from whatever JSON arrives, so validation happens here once.
        """
        import openai

        # The wire-format lists go round the SDK's transform (see the module docstring): it
        # transforms empty placeholders, which keep the keys' places in the body.
        wire = {key: request[key] for key in _WIRE_KEYS if key in request}
        try:
            response = self._client.chat.completions.with_raw_response.create(
                **(request | {key: [] for key in wire}), extra_body=wire
            )
        except openai.OpenAIError as exc:
            raise self._failed(self._model_error(exc)) from exc
        return response.http_response.content

    def _model_error(self, exc: openai.OpenAIError) -> ModelError:
        import openai

        prefix = f"model {self.model_name!r}"
        tries = f"tried {self.max_retries + 1} times"
        if isinstance(exc, openai.APIStatusError) and _too_long(exc):
            return ContextLengthExceededError(
                f"{prefix}: HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code
            )
        if isinstance(exc, openai.APIStatusError):
            return ModelError(
                f"{prefix}: HTTP {exc.status_code}: {exc.message}",
                status_code=exc.status_code,
                transient=_is_transient(exc.status_code),
            )
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(
                f"{prefix}: no response within {self.timeout_seconds} s ({tries})", transient=True
            )
        if isinstance(exc, openai.APIConnectionError):
            return ModelError(
                f"{prefix}: cannot reach {self._client.base_url} ({tries}): {exc.__cause__ or exc}",
                transient=True,
            )
        return ModelError(f"{prefix}: {exc}")


def _too_long(exc: openai.APIStatusError) -> bool:
    """An HTTP 400 whose error code says the request exceeds the model's context."""
    body = exc.body
    error = body.get("error", body) if isinstance(body, Mapping) else None
    code = error.get("code") if isinstance(error, Mapping) else None
    return exc.status_code == 400 and code == "context_length_exceeded"


__all__ = [
    "INSTALL_HINT",
    "NAMELESS_TOOL",
    "OpenAIModel",
    "assistant_message",
    "request_messages",
    "streamed_body",
    "tighter_limit",
]
