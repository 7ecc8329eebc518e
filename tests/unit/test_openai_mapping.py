"""The pure mapping between our transcript and the Chat Completions protocol (no SDK, no HTTP)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_router.agents.openai_model import NAMELESS_TOOL, assistant_message, request_messages
from agent_router.errors import InvalidTranscriptEntryError, MalformedModelResponseError


def call(call_id: str, name: str = "do_work", arguments: Any = '{"step": "x"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def body(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}


# --------------------------------------------------------------------------------- request


def test_protocol_entries_pass_unchanged() -> None:
    transcript: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi", "name": "lead"},
        {"role": "assistant", "content": "ok", "tool_calls": [call("c1"), call("c2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": "done"},
    ]

    assert request_messages(transcript) == transcript


def test_extra_keys_and_empty_tool_calls_are_dropped() -> None:
    transcript: list[dict[str, Any]] = [
        {"role": "user", "content": "hi", "meta": {"message_id": 7}},
        {"role": "assistant", "content": "ok", "tool_calls": [], "turn_id": 3},
        {"role": "tool", "tool_call_id": "c1", "content": "r", "name": "do_work", "extra": 1},
    ]

    assert request_messages(transcript) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]


def test_assistant_tool_calls_are_normalized() -> None:
    stored = {"id": "c1", "function": {"name": "f", "arguments": {"k": "välue"}}, "x": 1}

    [message] = request_messages([{"role": "assistant", "tool_calls": [stored]}])

    # A stored dict is sent as the JSON string the protocol wants; unknown keys are dropped.
    assert message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("c1", "f", '{"k": "välue"}')],
    }


def test_input_is_not_mutated() -> None:
    entry = {"role": "assistant", "tool_calls": [call("c1")], "meta": 1}
    snapshot = json.dumps(entry)

    request_messages([entry])

    assert json.dumps(entry) == snapshot


@pytest.mark.parametrize(
    "entry",
    [
        {"content": "no role"},
        {"role": "robot", "content": "x"},
        {"role": "tool", "content": "no id"},
        {"role": "assistant", "tool_calls": [{"id": "c1"}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]},
        {"role": "assistant", "tool_calls": ["c1"]},
    ],
)
def test_entries_no_server_accepts_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(InvalidTranscriptEntryError, match="transcript entry 1"):
        request_messages([{"role": "user", "content": "hi"}, entry])


# -------------------------------------------------------------------------------- response


def test_text_reply() -> None:
    reply = assistant_message(body({"role": "assistant", "content": "hi", "refusal": None}))

    assert reply == {"role": "assistant", "content": "hi"}


def test_tool_calls_keep_the_models_argument_string() -> None:
    arguments = '{ "step" : "ünïcode",\n "n": 1 }'
    raw = {"role": "assistant", "content": None, "tool_calls": [call("c1", "f", arguments)]}

    reply = assistant_message(body(raw, "tool_calls"))

    assert reply["tool_calls"] == [call("c1", "f", arguments)]


def test_tool_call_without_type_is_a_function_call() -> None:
    raw_call = {"id": "c1", "function": {"name": "f", "arguments": "{}"}}

    reply = assistant_message(body({"role": "assistant", "tool_calls": [raw_call]}))

    assert reply["tool_calls"] == [call("c1", "f", "{}")]
    assert reply["content"] is None


def test_refusal_becomes_the_content() -> None:
    reply = assistant_message(body({"role": "assistant", "content": None, "refusal": "I can't."}))

    assert reply == {"role": "assistant", "content": "I can't."}


def test_empty_string_content_is_a_reply() -> None:
    assert assistant_message(body({"role": "assistant", "content": ""}))["content"] == ""


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("text", "not a JSON object"),
        ([], "not a JSON object"),
        ({}, "no choices"),
        ({"choices": None}, "no choices"),
        ({"choices": []}, "no choices"),
        ({"choices": ["x"]}, "no message"),
        ({"choices": [{"message": None}]}, "no message"),
        (body({"role": "user", "content": "hi"}), "role is 'user'"),
        (body({"role": "assistant", "content": 5}), "neither a string"),
        (body({"role": "assistant", "tool_calls": "c"}), "not a list"),
    ],
)
def test_bodies_that_are_no_chat_completion_are_refused(response: Any, reason: str) -> None:
    with pytest.raises(MalformedModelResponseError, match=reason):
        assistant_message(response)


def test_content_as_a_list_of_parts_is_joined() -> None:
    parts = [{"type": "text", "text": "Use "}, "the ", {"type": "text", "text": "reset API."}]

    assert assistant_message(body({"role": "assistant", "content": parts}))["content"] == (
        "Use the reset API."
    )


def test_missing_and_duplicate_ids_are_made() -> None:
    raw = [
        call("", "f"),
        {"function": {"name": "g", "arguments": "{}"}},
        call("c", "f"),
        call("c", "f"),
    ]

    calls = assistant_message(body({"role": "assistant", "tool_calls": raw}))["tool_calls"]

    ids = [c["id"] for c in calls]
    assert len(set(ids)) == 4 and all(ids) and ids[2] == "c"
    assert [c["function"]["name"] for c in calls] == ["f", "g", "f", "f"]


def test_object_arguments_become_a_json_string() -> None:
    raw = [call("c", "f", {"step": "x"})]

    [repaired] = assistant_message(body({"role": "assistant", "tool_calls": raw}))["tool_calls"]

    assert json.loads(repaired["function"]["arguments"]) == {"step": "x"}


def test_broken_calls_are_kept_for_the_loop_to_answer() -> None:
    raw = [call("ok", "f", "{}"), call("cut", "f", '{"a": '), {"id": "anon"}, "junk"]

    calls = assistant_message(body({"role": "assistant", "tool_calls": raw}))["tool_calls"]

    assert [c["function"]["name"] for c in calls] == ["f", "f", NAMELESS_TOOL, NAMELESS_TOOL]
    assert calls[1]["function"]["arguments"] == '{"a": '  # the model's own string, to fix
    # Sent back, broken arguments are wrapped in an object so that strict servers accept them.
    [_, sent, _, _] = request_messages([{"role": "assistant", "tool_calls": calls}])[0][
        "tool_calls"
    ]
    assert json.loads(sent["function"]["arguments"]) == {"unparsed_arguments": '{"a": '}


def test_an_empty_reply_is_empty_content() -> None:
    reply = assistant_message(body({"role": "assistant", "content": None}, "length"))

    assert reply == {"role": "assistant", "content": ""}


def test_error_quotes_a_bounded_excerpt() -> None:
    with pytest.raises(MalformedModelResponseError) as raised:
        assistant_message({"choices": [], "padding": "x" * 10_000})

    assert len(str(raised.value)) < 300
