"""Compaction of a request and token counting: what is kept verbatim, what is shortened or left
out, the tool-call pairing rule on any transcript, and the input never modified."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_router import formats
from agent_router.agents.context import (
    LOW_WATER,
    NORMAL,
    OPEN_QUESTIONS_KEPT,
    TIGHT,
    WINDOW_NOTE,
    ContextWindow,
    compact,
    count_tokens,
    estimate_tokens,
    fit,
    pairing_holds,
    token_counter,
)
from agent_router.agents.usage import Usage, cost_of, usage_from_body
from agent_router.domain import MessageSubtype, MessageType
from agent_router.errors import ContextLengthExceededError
from agent_router.settings import ModelSpec

BIG = "x" * 4000


def env(kind: MessageType, content: str, *, mid: int, **extra: Any) -> dict[str, Any]:
    text = formats.render(
        formats.Envelope(type=kind, sender="Team Leader", message_id=mid, content=content, **extra)
    )
    return {"role": "user", "content": text}


def work(n: int, result: str = BIG) -> list[dict[str, Any]]:
    call = {"id": f"c{n}", "type": "function",
            "function": {"name": "do_work", "arguments": json.dumps({"step": n})}}  # fmt: skip
    return [
        {"role": "assistant", "content": f"step {n}", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": result},
    ]


def transcript(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an engineer."},
        env(MessageType.TASK, "Build it. " + BIG, mid=1),
    ]
    for n in range(steps):
        messages += work(n)
    return messages


def test_estimate_counts_ascii_by_four_and_other_characters_one_each() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("中文") == 2
    # Without tiktoken installed (or for a model it does not know) the estimate is used.
    assert token_counter("no-such-model")("abcdefgh") == 2


def test_a_request_that_fits_is_sent_unchanged() -> None:
    messages = transcript(3)
    assert compact(messages, limit=count_tokens(messages)) == messages


def test_older_tool_results_are_shortened_first_newest_stay_verbatim() -> None:
    messages = transcript(20)
    before = copy.deepcopy(messages)
    total = count_tokens(messages)

    sent = compact(messages, limit=total * 2 // 3)

    assert messages == before  # the input (the stored transcript) is never changed
    assert count_tokens(sent) <= total * 2 // 3
    assert len(sent) == len(messages)  # shortening was enough: nothing left out
    assert sent[:2] == messages[:2]  # system prompt and first task verbatim
    assert sent[-16:] == messages[-16:]  # the newest 8 units verbatim
    shortened = [m for m in sent if "left out of this request" in str(m.get("content"))]
    assert shortened and all(m["role"] == "tool" for m in shortened)
    assert pairing_holds(sent)


def test_a_shortened_tool_output_keeps_its_fence_whole() -> None:
    fenced = formats.fence(formats.ToolOutput(tool="git_log", server="git", content="<" + BIG))
    messages = transcript(1)[:2] + work(0, fenced) + [m for n in range(1, 20) for m in work(n)]

    sent = compact(messages, limit=count_tokens(messages) * 2 // 3)

    [result] = [m["content"] for m in sent if m.get("tool_call_id") == "c0"]
    output = formats.parse_fence(result)
    assert (output.tool, output.server) == ("git_log", "git")
    assert output.content.startswith("<xxx") and "left out of this request" in output.content
    assert len(result) < len(fenced) and formats.tags(result) == ["<tool-output", "</tool-output"]


def test_whole_older_units_are_left_out_with_one_note_when_shortening_is_not_enough() -> None:
    messages = transcript(40)
    sent = compact(messages, limit=12_000)

    assert count_tokens(sent) <= 12_000
    assert sent[:2] == messages[:2]
    assert sent[-16:] == messages[-16:]
    notes = [m for m in sent if str(m.get("content")).startswith("[")]
    assert len(notes) == 1 and notes[0]["role"] == "user"
    assert "earlier messages of this conversation are left out" in notes[0]["content"]
    assert pairing_holds(sent)


def test_an_open_question_and_progress_outputs() -> None:
    progress = env(MessageType.OUTPUT, "progress " + BIG, mid=2,
                   subtype=MessageSubtype.PROGRESS_OUTPUT)  # fmt: skip
    question = env(MessageType.ASK, "Which API? " + BIG, mid=3, question_id=7)
    answered = env(MessageType.ASK, "Which DB? " + BIG, mid=4, question_id=8)
    arguments = '{"question_id": 8, "answer": "pg"}'
    answer_call = {"id": "a8", "type": "function",
                   "function": {"name": "answer_other_agent", "arguments": arguments}}  # fmt: skip
    messages = [*transcript(0), progress, question, answered]
    messages += [{"role": "assistant", "content": None, "tool_calls": [answer_call]},
                 {"role": "tool", "tool_call_id": "a8", "content": "ok"}]  # fmt: skip
    for n in range(30):
        messages += work(n)

    shortened = compact(messages, limit=10_000, how=TIGHT)
    left_out = compact(messages, limit=6_000, how=TIGHT)

    cut = formats.parse(shortened[2]["content"])  # the progress output keeps its envelope
    assert cut.subtype is MessageSubtype.PROGRESS_OUTPUT and len(cut.content) < 400
    assert answered in shortened  # a message of another agent is never cut, only left out
    assert answered not in left_out
    for sent in (shortened, left_out):
        assert question in sent  # asked of this agent, not answered yet: verbatim
        assert count_tokens(sent) <= 10_000
        assert pairing_holds(sent)


def test_pairing_holds_detects_a_split_pair() -> None:
    pair = work(1, "done")
    assert pairing_holds(pair)
    assert not pairing_holds(pair[:1])
    assert not pairing_holds(pair[1:])
    assert not pairing_holds([pair[0], {"role": "user", "content": "hi"}, pair[1]])


@st.composite
def transcripts(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    for n in range(draw(st.integers(0, 25))):
        size = draw(st.sampled_from([10, 300, 3000]))
        if draw(st.booleans()):
            calls = draw(st.integers(1, 3))
            ids = [f"c{n}_{i}" for i in range(calls)]
            messages.append({"role": "assistant", "content": "t" * size, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for i in ids]})  # fmt: skip
            messages += [{"role": "tool", "tool_call_id": i, "content": "r" * size} for i in ids]
        else:
            messages.append({"role": draw(st.sampled_from(["user", "assistant"])),
                             "content": "u" * size})  # fmt: skip
    return messages


@settings(max_examples=200, deadline=None)
@given(transcripts(), st.integers(50, 20_000), st.booleans())
def test_compaction_keeps_pairing_and_the_newest_messages(
    messages: list[dict[str, Any]], limit: int, tight: bool
) -> None:
    before = copy.deepcopy(messages)
    sent = compact(messages, limit=limit, how=TIGHT if tight else NORMAL)
    assert messages == before
    assert pairing_holds(sent)
    assert sent[0] == messages[0]
    assert sent[-1] == messages[-1]
    assert count_tokens(sent) <= max(limit, count_tokens(messages))


# --------------------------------------------------------------------------- the window


def window_of(messages: list[dict[str, Any]], budget: int, *, one_by_one: bool) -> ContextWindow:
    window = ContextWindow(target=budget, budget=budget)
    if one_by_one:
        for n in range(1, len(messages) + 1):
            window.extend(messages[:n])
    else:
        window.extend(messages)
    return window


@settings(max_examples=200, deadline=None)
@given(transcripts(), st.integers(50, 20_000))
def test_the_window_keeps_pairing_and_its_cut_is_a_function_of_the_transcript(
    messages: list[dict[str, Any]], budget: int
) -> None:
    before = copy.deepcopy(messages)
    at_once = window_of(messages, budget, one_by_one=False)
    request = at_once.request()
    assert messages == before
    assert pairing_holds(request.messages)
    assert request.messages[0] == messages[0]
    assert request.messages[-1] == messages[-1]
    assert request.tokens == count_tokens(request.messages) or request.left_out
    # Built entry by entry (as calls come) or from the whole transcript (another process),
    # the window leaves out the same entries.
    assert window_of(messages, budget, one_by_one=True).cut == at_once.cut


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Transcripts with questions asked of the agent, some answered by its answer calls."""
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": "s"}] if draw(st.booleans()) else []
    )
    asked: list[int] = []
    for n in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["work", "ask", "answer", "user", "prose"]))
        size = draw(st.sampled_from([10, 300, 3000]))
        if kind == "work":
            messages += work(n, "r" * size)
        elif kind == "ask":
            asked.append(n)
            messages.append(env(MessageType.ASK, "q" * size, mid=n, question_id=n))
        elif kind == "answer" and asked:
            question = draw(st.sampled_from(asked))
            call: dict[str, Any] = {"id": f"a{n}", "type": "function", "function": {
                "name": "answer_other_agent",
                "arguments": json.dumps({"question_id": question, "answer": "a"})}}  # fmt: skip
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"a{n}", "content": "sent"}]  # fmt: skip
        elif kind == "user":
            messages.append(env(MessageType.MESSAGE, "m" * size, mid=n))
        else:
            messages.append({"role": "assistant", "content": "p" * size})
    return messages


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(200, 20_000), st.data())
def test_a_window_built_again_from_its_checkpoint_is_the_same_window(
    messages: list[dict[str, Any]], budget: int, data: st.DataObject
) -> None:
    # A worker took in the first ``taken`` entries and kept where its window stood; another
    # builds it again from that, the pinned entries and those from the cut on, then both take
    # in the rest.
    taken = data.draw(st.integers(1, len(messages)))
    window = window_of(messages[:taken], budget, one_by_one=data.draw(st.booleans()))
    checkpoint = json.loads(json.dumps(window.checkpoint()))
    read: list[list[tuple[int, dict[str, Any]]]] = []

    def rows_of(after: int, also: list[int]) -> list[tuple[int, dict[str, Any]]]:
        read.append([(p, m) for p, m in enumerate(messages) if p > after or p in also])
        return read[-1]

    restored = ContextWindow.restore(checkpoint, rows_of, target=budget, budget=budget)
    assert restored is not None
    window.extend(messages)
    whole = window_of(messages, budget, one_by_one=False)
    for built in (restored, window):
        assert (built.length, built.cut) == (whole.length, whole.cut)
        assert built.request().messages == whole.request().messages
        assert built.call_ids == whole.call_ids
        # A window holds what its requests hold: the tail and the pinned entries.
        request = whole.request()
        assert len(built) == len(request.messages) - (1 if request.left_out else 0)
    # Rows that are not the transcript it was taken of are refused.
    rows = read[0]
    if rows[1:]:
        less = ContextWindow.restore(checkpoint, lambda *_: rows[1:], target=budget, budget=budget)
        assert less is None


def test_a_request_keeps_the_newest_open_questions_not_every_one_ever_asked() -> None:
    # Questions answered in prose (or expired) have no answer call: the window keeps the
    # newest few open ones before its cut, so they do not pile up in every request.
    messages = transcript(0)
    for n in range(30):
        messages.append(env(MessageType.ASK, f"Question {n}?", mid=10 + n, question_id=n))
        messages += work(n, "r" * 2000)
    window = window_of(messages, 3000, one_by_one=True)
    request = window.request()
    asked = [n for n in range(30) if any(f'question_id="{n}"' in str(m["content"])
                                         for m in request.messages)]  # fmt: skip
    assert asked[-OPEN_QUESTIONS_KEPT:] == list(range(30 - len(asked), 30))
    assert len(asked) <= OPEN_QUESTIONS_KEPT + 8  # the kept ones and those in the tail
    assert len(window) < 40


def test_a_long_transcript_plateaus_in_steps_keeping_task_and_open_question() -> None:
    messages = transcript(0)
    messages.append(env(MessageType.ASK, "Which endpoint?", mid=2, question_id=7))
    messages.append(env(MessageType.ASK, "Which port?", mid=3, question_id=8))
    budget = 6000
    window = ContextWindow(target=budget, budget=budget)
    sizes, left_out, moves = [], [], 0
    for n in range(400):
        messages += work(n, "r" * 400)
        if n == 3:  # the second question is answered early on
            call = {
                "id": "a8",
                "type": "function",
                "function": {
                    "name": "answer_other_agent",
                    "arguments": '{"question_id": 8, "answer": "80"}',
                },
            }
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "a8", "content": "sent"}]  # fmt: skip
        window.extend(messages)
        request = window.request()
        moves += request.moved
        sizes.append(count_tokens(request.messages))
        left_out.append(request.left_out)
        assert pairing_holds(request.messages)
    assert max(sizes) <= budget + 50  # the note's estimate against its text
    assert sizes[-1] < count_tokens(messages) // 10
    # The cut moves in steps down to LOW_WATER of the budget: a few moves, not one per call.
    assert 2 <= moves <= 400 * 250 // int(budget * (1 - LOW_WATER)) + 1
    assert left_out == sorted(left_out)
    last = window.request().messages
    assert last[1] == messages[1], "the first task"
    assert WINDOW_NOTE.split("{n}")[1][:30] in last[2]["content"]
    assert 'question_id="7"' in last[3]["content"], "the open question"
    assert not any('question_id="8"' in str(m["content"]) for m in last), "answered: left out"
    assert window.request().moved is False, "nothing new, nothing moved"


def test_a_window_without_a_target_leaves_nothing_out() -> None:
    messages = transcript(50)
    window = ContextWindow(target=None, budget=None)
    window.extend(messages)
    request = window.request()
    assert request.left_out == 0 and request.messages == messages
    assert request.tokens == count_tokens(messages)
    assert window.call_ids == {f"c{n}" for n in range(50)}


# --------------------------------------------------------------------------- usage and cost


def test_usage_is_read_from_the_body_with_cached_tokens() -> None:
    body = {"usage": {"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280,
                      "prompt_tokens_details": {"cached_tokens": 1024}}}  # fmt: skip
    assert usage_from_body(body) == Usage(
        prompt_tokens=1200, completion_tokens=80, cached_tokens=1024
    )
    assert usage_from_body({"usage": {"prompt_tokens": 5, "completion_tokens": 1}}) == Usage(
        prompt_tokens=5, completion_tokens=1
    )
    missing: Any
    for missing in ({}, {"usage": None}, {"usage": {"prompt_tokens": "5"}}, []):
        assert usage_from_body(missing) is None


def test_cost_follows_the_price_table() -> None:
    table = {"m": ModelSpec(input=2.0, cached_input=0.5, output=8.0)}
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=500_000, cached_tokens=400_000)
    # 600k fresh at $2/M + 400k cached at $0.5/M + 500k out at $8/M
    assert cost_of(usage, "m", table) == 1.2 + 0.2 + 4.0
    assert cost_of(usage, "unlisted", table) == 0.0
    no_cache_price = ModelSpec(input=2.0, output=8.0)
    assert no_cache_price.cost(1_000_000, 0, 400_000) == 2.0


def _cut_of(text: str) -> tuple[str, int, str]:
    """A cut text's head, the characters its note says were left out, and its tail."""
    match = re.search(r"\n\[([\d,]+) of [\d,]+ characters of this message left out[^\]]*\]\n", text)
    assert match is not None, text[:300]
    return text[: match.start()], int(match.group(1).replace(",", "")), text[match.end() :]


@pytest.mark.parametrize("limit", [300, 1000, 5000])
def test_fit_cuts_the_newest_oversize_texts_to_a_hard_limit(limit: int) -> None:
    huge = "".join(f"line {n}\n" for n in range(20_000))
    fenced = formats.fence(formats.ToolOutput(tool="dump", server="host", content=huge))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an engineer."},
        {"role": "user", "content": "Dump it."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "dump", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": fenced},
    ]  # fmt: skip
    sent, tokens = fit(messages, limit=limit)

    assert tokens == count_tokens(sent) <= limit
    assert sent[:3] == messages[:3] and messages[3]["content"] == fenced  # input unchanged
    output = formats.parse_fence(sent[3]["content"])  # the fence stays whole
    head, left, tail = _cut_of(output.content)
    assert huge.startswith(head) and huge.endswith(tail)
    assert len(head) + left + len(tail) == len(huge)  # the note counts exactly


def test_fit_leaves_a_request_that_fits_alone_and_refuses_one_that_cannot() -> None:
    messages = [{"role": "system", "content": "s" * 4000}, {"role": "user", "content": "hi"}]
    assert fit(messages, limit=2000) == (messages, count_tokens(messages))
    with pytest.raises(ContextLengthExceededError, match="every message cut"):
        fit(messages, limit=10)
