"""OpenAIModel with the real openai SDK over real HTTP, against a local Chat Completions server:
replies and tool calls mapped both ways, the request as sent, retries, refusals, malformed
bodies and timeouts. Backoff stays short through settings (few retries, short timeouts) and
the server's ``retry-after-ms``; no test asserts wall-clock times."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent_router import Settings
from agent_router.agents.context import count_tokens, estimate_tokens, pairing_holds
from agent_router.agents.openai_model import (
    NAMELESS_TOOL,
    OpenAIModel,
    request_messages,
    tighter_limit,
)
from agent_router.agents.usage import Usage
from agent_router.errors import (
    ConfigurationError,
    ContextLengthExceededError,
    MalformedModelResponseError,
    ModelError,
)
from tests.support.chat_server import (
    CHAT_PATH,
    ChatServer,
    RecordedRequest,
    Reply,
    completion,
    context_length_exceeded,
    tool_call,
    usage,
)

API_KEY = "sk-test-123"
MODEL = "test-model"
WORK_TOOL = {
    "type": "function",
    "function": {
        "name": "do_work",
        "description": "Do one step of work.",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "string"}},
            "required": ["step"],
        },
    },
}
HELLO = [{"role": "user", "content": "hello"}]

MakeModel = Callable[..., OpenAIModel]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatServer]:
    # httpx honours HTTP(S)_PROXY: a developer's proxy must not sit between client and server.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with ChatServer() as s:
        yield s


@pytest.fixture
def make_model(server: ChatServer) -> Iterator[MakeModel]:
    """Builds models on the test server; ``overrides`` are Settings fields."""
    models: list[OpenAIModel] = []

    def make(**overrides: Any) -> OpenAIModel:
        fields: dict[str, Any] = {
            "openai_model": MODEL,
            "openai_base_url": server.base_url,
            "openai_api_key": API_KEY,
            "openai_timeout_seconds": 5.0,
            "openai_max_retries": 2,
        }
        fields.update(overrides)
        model = OpenAIModel(Settings(**fields))
        models.append(model)
        return model

    yield make
    for model in models:
        model.close()


def only_request(server: ChatServer) -> RecordedRequest:
    [request] = server.requests
    return request


# ------------------------------------------------------------------------------- replies


def test_plain_text_reply(server: ChatServer, make_model: MakeModel) -> None:
    server.enqueue(completion("Hello there."))

    reply = make_model().complete(HELLO, [])

    assert reply == {"role": "assistant", "content": "Hello there."}
    request = only_request(server)
    assert (request.method, request.path) == ("POST", CHAT_PATH)
    assert request.body["model"] == MODEL
    assert request.body["messages"] == HELLO
    assert "tools" not in request.body  # an empty list is left out: some servers reject it


def test_two_tool_calls_are_mapped_to_our_format(server: ChatServer, make_model: MakeModel) -> None:
    server.enqueue(
        completion(
            "Working on it.",
            [
                tool_call("call_a", "do_work", {"step": "survey"}),
                tool_call("call_b", "ask_master", {"question": "Which API? ✓"}),
            ],
        )
    )

    reply = make_model().complete(HELLO, [WORK_TOOL])

    assert reply == {
        "role": "assistant",
        "content": "Working on it.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "do_work", "arguments": '{"step": "survey"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {
                    "name": "ask_master",
                    "arguments": json.dumps({"question": "Which API? ✓"}),
                },
            },
        ],
    }


def test_tool_calls_without_content(server: ChatServer, make_model: MakeModel) -> None:
    server.enqueue(completion(None, [tool_call("call_a", "do_work", {"step": "x"})]))

    reply = make_model().complete(HELLO, [WORK_TOOL])

    assert reply["content"] is None
    assert [c["id"] for c in reply["tool_calls"]] == ["call_a"]


def test_transcript_with_tool_calls_and_results_is_sent_as_is(
    server: ChatServer, make_model: MakeModel
) -> None:
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "do_work", "arguments": '{"step": "survey"}'},
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "do_work", "arguments": '{"step": "design"}'},
        },
    ]
    transcript: list[dict[str, Any]] = [
        {"role": "system", "content": "You are UI Operator_1."},
        {"role": "user", "content": "Build the login form."},
        {"role": "assistant", "content": "Next I will survey the code.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "surveyed"},
        {"role": "tool", "tool_call_id": "call_2", "content": "designed"},
        {"role": "user", "content": "[message from Team Leader] use the new API"},
        {"role": "assistant", "content": None, "tool_calls": [calls[0] | {"id": "call_3"}]},
        {"role": "tool", "tool_call_id": "call_3", "content": "done"},
    ]
    server.enqueue(completion("Done."))

    reply = make_model(openai_temperature=0.2).complete(transcript, [WORK_TOOL])

    assert reply == {"role": "assistant", "content": "Done."}
    request = only_request(server)
    assert request.body["messages"] == transcript
    assert request.body["tools"] == [WORK_TOOL]
    assert request.body["model"] == MODEL
    assert request.body["temperature"] == 0.2
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["content-type"] == "application/json"


def test_api_key_falls_back_to_openai_api_key(
    server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_ROUTER_OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-standard-env")
    server.enqueue(completion("ok"))

    model = OpenAIModel(Settings(openai_model=MODEL, openai_base_url=server.base_url))
    try:
        model.complete(HELLO, [])
    finally:
        model.close()

    assert only_request(server).headers["authorization"] == "Bearer sk-from-standard-env"


def test_our_api_key_variable_wins_over_the_standard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "standard")
    monkeypatch.setenv("AGENT_ROUTER_OPENAI_API_KEY", "ours")

    assert Settings().openai_api_key == "ours"
    assert Settings(openai_api_key="explicit").openai_api_key == "explicit"
    assert "ours" not in repr(Settings())


def test_missing_model_or_key_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_ROUTER_OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("AGENT_ROUTER_OPENAI_MODEL", raising=False)

    with pytest.raises(ConfigurationError, match="AGENT_ROUTER_OPENAI_MODEL"):
        OpenAIModel(Settings(openai_api_key=API_KEY))
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        OpenAIModel(Settings(openai_model=MODEL))


# ------------------------------------------------------------------------------- failures


@pytest.mark.parametrize("status", [500, 429, 503])
def test_transient_errors_are_retried_until_success(
    server: ChatServer, make_model: MakeModel, status: int
) -> None:
    server.fail_first(2, status)
    server.enqueue(completion("Recovered."))

    reply = make_model(openai_max_retries=2).complete(HELLO, [])

    assert reply["content"] == "Recovered."
    assert len(server.requests) == 3
    # The retries resend the same request.
    assert len({r.raw for r in server.requests}) == 1


def test_persistent_server_error_fails_after_max_retries(
    server: ChatServer, make_model: MakeModel
) -> None:
    server.fail_first(10, 500)

    with pytest.raises(ModelError, match="HTTP 500") as raised:
        make_model(openai_max_retries=2).complete(HELLO, [])

    assert len(server.requests) == 3
    assert raised.value.status_code == 500
    assert raised.value.transient
    assert raised.value.__cause__ is not None


@pytest.mark.parametrize("status", [401, 400])
def test_refusal_is_not_retried(server: ChatServer, make_model: MakeModel, status: int) -> None:
    server.fail_first(3, status)

    with pytest.raises(ModelError, match=f"HTTP {status}") as raised:
        make_model(openai_max_retries=2).complete(HELLO, [])

    assert type(raised.value) is ModelError
    assert len(server.requests) == 1
    assert raised.value.status_code == status
    assert not raised.value.transient


def test_timeout_is_retried_then_a_model_error(server: ChatServer, make_model: MakeModel) -> None:
    slow = Reply(body=completion("too late").body, delay_seconds=30)
    server.enqueue(slow, slow)

    with pytest.raises(ModelError, match="no response within") as raised:
        make_model(openai_timeout_seconds=0.2, openai_max_retries=1).complete(HELLO, [])

    assert len(server.requests) == 2
    assert raised.value.transient
    assert raised.value.status_code is None


def test_unreachable_server_is_a_transient_model_error(make_model: MakeModel) -> None:
    closed = ChatServer()
    url = closed.base_url
    closed.start()
    closed.stop()  # the port is free again: nothing listens

    with pytest.raises(ModelError, match="cannot reach") as raised:
        make_model(openai_base_url=url, openai_max_retries=0).complete(HELLO, [])

    assert raised.value.transient


def _body(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}


MALFORMED = {
    "not JSON": Reply(body=b"<html>502 Bad Gateway</html>"),
    "not JSON, text/html": Reply(body="<html>oops</html>", content_type="text/html"),
    "a JSON list": Reply(body=b"[1, 2]"),
    "no choices": Reply(body={"id": "x", "choices": []}),
    "choices missing": Reply(body={"id": "x"}),
    "no message": Reply(body={"choices": [{"index": 0}]}),
    "wrong role": Reply(body=_body({"role": "user", "content": "hi"})),
    "content a number": Reply(body=_body({"role": "assistant", "content": 5})),
}


def test_sloppy_replies_are_repaired_not_refused(server: ChatServer, make_model: MakeModel) -> None:
    """Over the real SDK: what a sloppy model writes reaches the loop repaired, every call kept."""
    server.enqueue(
        Reply(
            body=_body(
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Two calls."}],
                    "tool_calls": [
                        {"type": "function", "function": {"name": "do_work", "arguments": "{}"}},
                        tool_call("c2", "do_work", {"step": "as an object"}),
                        {"id": "c3", "type": "function", "function": {"arguments": "{}"}},
                        tool_call("c4", "do_work", '{"step": "trunc'),
                    ],
                }
            )
        ),
        Reply(body=_body({"role": "assistant", "content": None})),
    )
    model = make_model()

    reply = model.complete(HELLO, [WORK_TOOL])
    empty = model.complete(HELLO, [WORK_TOOL])

    assert reply["content"] == "Two calls."
    calls = reply["tool_calls"]
    assert [c["function"]["name"] for c in calls] == [
        "do_work",
        "do_work",
        NAMELESS_TOOL,
        "do_work",
    ]
    assert calls[0]["id"] and calls[0]["id"] not in {"c2", "c3", "c4"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"step": "as an object"}
    assert calls[3]["function"]["arguments"] == '{"step": "trunc'
    assert empty == {"role": "assistant", "content": ""}


@pytest.mark.parametrize("reply", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_response_is_a_typed_error(
    server: ChatServer, make_model: MakeModel, reply: Reply
) -> None:
    server.enqueue(reply)

    with pytest.raises(MalformedModelResponseError, match="malformed model response"):
        make_model().complete(HELLO, [WORK_TOOL])

    assert len(server.requests) == 1  # a 200 with a bad body is not retried


def test_server_error_with_a_body_that_is_not_json(
    server: ChatServer, make_model: MakeModel
) -> None:
    server.enqueue(Reply(status=502, body=b"<html>Bad Gateway</html>", content_type="text/html"))

    with pytest.raises(ModelError, match="HTTP 502") as raised:
        make_model(openai_max_retries=0).complete(HELLO, [])

    assert type(raised.value) is ModelError


# ------------------------------------------------------------------------ usage and context


def test_usage_comes_from_the_response(server: ChatServer, make_model: MakeModel) -> None:
    server.enqueue(completion("Hi.", usage=usage(1500, 40, cached=1024)))

    result = make_model().respond(HELLO, [])

    assert result.message == {"role": "assistant", "content": "Hi."}
    assert result.usage == Usage(prompt_tokens=1500, completion_tokens=40, cached_tokens=1024)
    assert result.model == MODEL


def test_a_response_without_usage_gets_an_estimate(
    server: ChatServer, make_model: MakeModel
) -> None:
    server.enqueue(completion("Hi there, all done.", usage=None))

    result = make_model().respond([{"role": "user", "content": "x" * 400}], [])

    assert result.usage is not None and result.usage.estimated
    assert result.usage.prompt_tokens == count_tokens([{"role": "user", "content": "x" * 400}])
    assert result.usage.completion_tokens == count_tokens([result.message])
    assert result.usage.cached_tokens == 0


def long_transcript(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an engineer."},
        {"role": "user", "content": "Build it."},
    ]
    for n in range(steps):
        messages += [
            {"role": "assistant", "content": None,
             "tool_calls": [tool_call(f"c{n}", "do_work", {"step": n})]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"result {n} " + "y" * 2000},
        ]  # fmt: skip
    return messages


def test_a_request_over_the_window_is_compacted_before_it_is_sent(
    server: ChatServer, make_model: MakeModel
) -> None:
    transcript = long_transcript(30)
    server.enqueue(completion("ok"))

    make_model(context_window=8000, context_reserve_tokens=1000).complete(transcript, [WORK_TOOL])

    sent = only_request(server).body
    assert count_tokens(sent["messages"], sent["tools"]) <= 7000
    assert sent["messages"][-16:] == transcript[-16:]  # the newest turns verbatim
    assert pairing_holds(sent["messages"])
    assert len(transcript) == 62  # the caller's list is untouched


def test_context_length_exceeded_is_compacted_tighter_and_sent_again(
    server: ChatServer, make_model: MakeModel
) -> None:
    transcript = long_transcript(30)
    full = count_tokens(request_messages(transcript), [WORK_TOOL])
    server.enqueue(context_length_exceeded(4096, 20_000), completion("ok"), completion("again"))
    model = make_model(openai_max_retries=0)

    assert model.complete(transcript, [WORK_TOOL])["content"] == "ok"
    assert model.complete(transcript, [WORK_TOOL])["content"] == "again"

    first, retry, later = server.requests
    assert count_tokens(first.body["messages"], [WORK_TOOL]) == full  # it fit our window
    # The window the server stated, scaled to our count of what it refused, with a margin.
    limit = int(4096 * full / 20_000 * 0.9)
    for request in (retry, later):
        assert count_tokens(request.body["messages"], [WORK_TOOL]) <= limit
        assert pairing_holds(request.body["messages"])
        assert request.body["messages"][-1] == transcript[-1]
    assert len(transcript) == 62


def test_a_second_context_length_exceeded_is_a_typed_error(
    server: ChatServer, make_model: MakeModel
) -> None:
    server.enqueue(context_length_exceeded(1000, 2000), context_length_exceeded(1000, 1500))

    with pytest.raises(ContextLengthExceededError, match="maximum context length") as raised:
        make_model(openai_max_retries=2).complete(long_transcript(3), [])

    assert len(server.requests) == 2  # one tighter retry, never a loop; a 400 is not retried
    assert raised.value.status_code == 400 and not raised.value.transient


def test_a_window_no_request_fits_is_a_typed_error_without_a_second_request(
    server: ChatServer, make_model: MakeModel
) -> None:
    # The server says its window is 10 tokens: not even the system prompt fits in that.
    server.enqueue(context_length_exceeded(10, 20_000))

    with pytest.raises(ContextLengthExceededError, match="every message cut") as raised:
        make_model(openai_max_retries=2).complete(long_transcript(3), [])

    assert len(server.requests) == 1
    assert not raised.value.transient


def test_tighter_limit_without_numbers_halves_the_request() -> None:
    assert tighter_limit(10_000, "input too long") == 5000
    assert tighter_limit(10_000, "maximum context length is 4096 tokens, resulted in 8192 "
                         "tokens") == int(4096 * 10_000 / 8192 * 0.9)  # fmt: skip
    # Just over the window: the window scaled to our count, less a tenth, not half the request.
    assert tighter_limit(3400, "maximum context length is 3000 tokens, resulted in 3043 "
                         "tokens") == int(3000 * 3400 / 3043 * 0.9)  # fmt: skip


def test_the_request_on_the_wire_is_the_one_the_sdk_would_send_whole(
    server: ChatServer, make_model: MakeModel
) -> None:
    # messages and tools go past the SDK's transform (as extra_body): the body the server
    # receives is byte for byte the one the SDK builds when it is given them itself.
    transcript: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an engineer. Ünïcödé, \u2028 and \"quotes\"."},
        {"role": "user", "content": "Build it.", "name": "lead"},
        {"role": "assistant", "content": None,
         "tool_calls": [tool_call("c1", "do_work", {"step": "é"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "done \U0001f600"},
    ]  # fmt: skip
    server.enqueue(completion("ok"), completion("ok"))
    model = make_model(openai_temperature=0.3)

    model.complete(transcript, [WORK_TOOL])
    request = model._request(request_messages(transcript), [WORK_TOOL])
    model._client.chat.completions.with_raw_response.create(**request)

    ours, whole = (r.raw for r in server.requests)
    assert json.loads(ours) == json.loads(whole)
    assert ours == whole
    assert set(json.loads(ours)) == {"messages", "model", "temperature", "tools"}


def test_each_entry_is_mapped_and_counted_once_while_it_is_sent_again(
    server: ChatServer, make_model: MakeModel
) -> None:
    model = make_model()
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return estimate_tokens(text)

    model._count = count
    transcript = long_transcript(3)
    server.enqueue(completion("a"), completion("b"), completion("c"))
    model.complete(transcript, [])
    first = len(counted)
    transcript = [*transcript, {"role": "user", "content": "more"}]
    model.complete(transcript, [])

    assert counted[first:] == ["more"]  # the entries sent before are not counted again
    # An entry changed in place is mapped and counted again: the request says what it says.
    transcript[-1]["content"] = "changed"
    model.complete(transcript, [])
    assert counted[-1] == "changed"
    assert server.requests[-1].body["messages"][-1]["content"] == "changed"
    assert [m["content"] for m in server.requests[-1].body["messages"][:-1]] == [
        m["content"] for m in server.requests[0].body["messages"]
    ]
