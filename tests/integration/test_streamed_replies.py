"""Streamed replies to the user: with ``stream_to_user`` the lead's model calls go to the server
with ``stream=True`` through the real openai SDK over HTTP, each piece of text reaches the
team's feed readers waiting then (Redis pub/sub) and the hooks before the reply is stored
whole, and the reply, the stored transcript and the usage are those of the unstreamed call."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from agent_router import Delta, FeedItem, Router, Settings
from agent_router.agents import builder, hosted
from agent_router.agents.llm import directive
from agent_router.agents.loop import TurnOutcome, run_turn
from agent_router.agents.openai_model import OpenAIModel
from agent_router.agents.tools import default_registry
from agent_router.constants import feed_channel
from agent_router.hooks import RouterHooks
from agent_router.outbox import RecordingPublisher
from tests.support.chat_server import ChatServer, completion, scripted_lead, tool_call, usage

LEAD = "Team Leader"
MARK = "Lead:"


class Deltas(RouterHooks):
    def __init__(self) -> None:
        self.seen: list[tuple[int, str, Delta]] = []

    def after_delta(self, team_id: int, agent: str, delta: Delta) -> None:
        self.seen.append((team_id, agent, delta))


@pytest.fixture
def server() -> Iterator[ChatServer]:
    # Chunks a little apart, as a model writes them: a reader returning with one piece is
    # listening again before the next.
    with ChatServer(scripted_lead(MARK, tokens=(120, 12)), chunk_seconds=0.05) as s:
        yield s


def _settings(server: ChatServer, tmp_path: Path, redis_url: str, *, stream: bool) -> Settings:
    return Settings(
        database_url=f"sqlite:///{tmp_path}/{'streamed' if stream else 'whole'}.db",
        redis_url=redis_url,
        openai_model="test-model",
        openai_api_key="sk-test",
        openai_base_url=server.base_url,
        openai_max_retries=0,
        stream_to_user=stream,
    )


def _run_lead(router: Router, team_id: int) -> TurnOutcome:
    turn = router.claim(router.agent(team_id, LEAD).id, builtin=True)
    assert turn is not None
    models = builder.for_router(router).models
    return run_turn(router, turn, models=models, tools=default_registry())


def _read_until_answer(router: Router, team_id: int, after: int, got: list[FeedItem]) -> None:
    while not any(item.kind == "answer" for item in got):
        items = router.events(team_id, after=after, wait=120.0)
        got.extend(items)
        after = items[-1].cursor if items else after


def _listening(router: Router, redis_url: str, team_id: int) -> None:
    channel = feed_channel(router.store.installation_id(), team_id)
    client = redis.Redis.from_url(redis_url)
    try:
        for _ in range(2000):
            if dict(client.pubsub_numsub(channel)).get(channel.encode(), 0):
                return
            time.sleep(0.005)
        raise AssertionError("the reader never subscribed")
    finally:
        client.close()


def _session(
    server: ChatServer, tmp_path: Path, redis_url: str, *, stream: bool
) -> tuple[Router, int, list[FeedItem], Deltas]:
    """A team whose lead is told to tell the user something, its turn run while a reader
    waits on the feed: the router, the team, what the reader got, what the hooks saw."""
    hooks = Deltas()
    router = Router(
        _settings(server, tmp_path, redis_url, stream=stream),
        publisher=RecordingPublisher(),
        hooks=hooks,
    )
    router.create_schema()
    team = router.create_team()
    progress = directive("tell_user", text="Looking into it.")
    router.send(team.id, to=LEAD, content=f"Plan the release.\n{progress}")
    cursor = router.events(team.id)[-1].cursor
    got: list[FeedItem] = []
    reader = threading.Thread(target=_read_until_answer, args=(router, team.id, cursor, got))
    reader.start()
    _listening(router, redis_url, team.id)
    assert _run_lead(router, team.id) is TurnOutcome.ENDED
    reader.join(timeout=120.0)
    assert not reader.is_alive()
    return router, team.id, got, hooks


def test_a_waiting_reader_gets_the_answer_s_pieces_in_order_before_the_answer(
    server: ChatServer, tmp_path: Path, redis_url: str
) -> None:
    router, team_id, got, hooks = _session(server, tmp_path, redis_url, stream=True)
    try:
        answer = router.user_messages(team_id)[-1]
        assert answer.content.startswith(MARK)
        # Among the lead's turn events: the progress message, then the answer's pieces, then
        # the answer stored whole.
        kinds = [item.kind for item in got if item.kind != "event"]
        pieces = [item for item in got if item.kind == "delta"]
        assert kinds == ["progress"] + ["delta"] * len(pieces) + ["answer"]
        # Every piece, in order, to the hooks: they add up to the answer.
        assert [(t, a) for t, a, _d in hooks.seen] == [(team_id, LEAD)] * len(hooks.seen)
        assert [d.seq for _t, _a, d in hooks.seen] == list(range(len(hooks.seen)))
        assert len({d.stream for _t, _a, d in hooks.seen}) == 1
        assert "".join(d.text for _t, _a, d in hooks.seen) == answer.content
        assert len(hooks.seen) == len(answer.content.split())
        # The reader got them in order, as they were said (a piece said while it was between
        # two waits, on a loaded machine, reaches no one: the pieces are a preview).
        written = {d.seq: (d.stream, d.text) for _t, _a, d in hooks.seen}
        assert pieces
        assert [p.seq for p in pieces] == sorted({p.seq or 0 for p in pieces})
        assert all(
            p.sender == LEAD and written[p.seq or 0] == (p.stream, p.content) for p in pieces
        )
        # A delta is not stored: it keeps the reader's cursor, and a read from there finds
        # only the answer.
        progress = next(item for item in got if item.kind == "progress")
        assert pieces[0].cursor == pieces[-1].cursor >= progress.cursor
        said = [i for i in router.events(team_id, after=pieces[-1].cursor) if i.kind != "event"]
        assert said == [item for item in got if item.kind == "answer"]
        assert pieces[0].as_payload()["stream"] == pieces[0].stream
        assert all(r.body["stream"] is True for r in server.requests)
        assert all(r.body["stream_options"] == {"include_usage": True} for r in server.requests)
    finally:
        router.close()


def test_the_streamed_transcript_and_usage_are_those_of_the_whole_replies(
    server: ChatServer, tmp_path: Path, redis_url: str
) -> None:
    streamed, streamed_team, _got, _hooks = _session(server, tmp_path, redis_url, stream=True)
    whole, whole_team, got, hooks = _session(server, tmp_path, redis_url, stream=False)
    try:
        assert [r.body.get("stream") for r in server.requests] == [True, True, None, None]
        # The first reply was tool calls, streamed in pieces.
        replies = [e for e in streamed.transcript(streamed_team, LEAD) if e["role"] == "assistant"]
        assert [bool(e.get("tool_calls")) for e in replies] == [True, False]
        assert streamed.transcript(streamed_team, LEAD) == whole.transcript(whole_team, LEAD)
        assert [(m.kind, m.content) for m in streamed.user_messages(streamed_team)] == [
            (m.kind, m.content) for m in whole.user_messages(whole_team)
        ]
        # The usage the server sent, in the stream's last chunk, counted alike.
        assert streamed.budget(streamed_team).usage == whole.budget(whole_team).usage
        # Unstreamed: no pieces, to the reader or the hooks.
        assert [item.kind for item in got if item.kind != "event"] == ["progress", "answer"]
        assert hooks.seen == []
    finally:
        streamed.close()
        whole.close()


def test_a_reply_streamed_in_pieces_adds_up_to_the_whole_reply() -> None:
    calls = [
        tool_call("call_a", "search", {"query": "release notes", "limit": 3}),
        tool_call("call_b", "tell_user", '{"text": "Half way."}'),
    ]
    with ChatServer(chunk_seconds=0.0) as server:
        model = OpenAIModel(
            Settings(
                openai_model="test-model",
                openai_api_key="sk-test",
                openai_base_url=server.base_url,
                openai_max_retries=0,
            )
        )
        messages = [{"role": "user", "content": "Go."}]
        reply = completion("Searching now, then telling.", calls, usage=usage(40, 9, cached=8))
        server.enqueue(reply, reply)
        pieces: list[Delta] = []
        streamed = model.respond(messages, [], on_delta=pieces.append)
        whole = model.respond(messages, [])
        model.close()
    assert streamed == whole
    assert streamed.message["tool_calls"][0]["function"]["arguments"] == (
        '{"query": "release notes", "limit": 3}'
    )
    assert [p.text for p in pieces] == ["Searching ", "now, ", "then ", "telling."]
    assert [p.seq for p in pieces] == [0, 1, 2, 3]


def test_without_redis_a_waiting_reader_gets_the_pieces_in_process(tmp_path: Path) -> None:
    router = Router(Settings(database_url=f"sqlite:///{tmp_path}/in_process.db"), publisher=None)
    try:
        router.create_schema()
        team = router.create_team()
        router.send(team.id, to=LEAD, content="Hello.")
        cursor = router.events(team.id)[-1].cursor
        got: list[FeedItem] = []
        reader = threading.Thread(
            target=lambda: got.extend(router.events(team.id, after=cursor, wait=3600.0))
        )
        reader.start()
        sink = router.delta_sink(team.id, LEAD)
        sent = 0
        # Pieces said before the reader listens reach no one; it returns with the first it hears.
        while reader.is_alive() and sent < 100_000:
            sink(Delta(stream="s1", seq=sent, text=f"w{sent} "))
            sent += 1
            reader.join(timeout=0.01)
        assert not reader.is_alive()
        assert got
        assert {(i.kind, i.sender, i.stream, i.cursor) for i in got} == {
            ("delta", LEAD, "s1", cursor)
        }
        seqs = [i.seq or 0 for i in got]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert [i.content for i in got] == [f"w{n} " for n in seqs]
        # Nothing was stored: the feed reads on from the cursor as before.
        assert router.events(team.id, after=cursor) == []
    finally:
        router.close()


def test_a_stream_that_is_not_chat_completion_chunks_is_malformed() -> None:
    from agent_router.agents.openai_model import streamed_body
    from agent_router.errors import MalformedModelResponseError

    with pytest.raises(MalformedModelResponseError, match="not a JSON object"):
        streamed_body([[1, 2]], print)
    with pytest.raises(MalformedModelResponseError, match="no streamed chunk had a choice"):
        streamed_body([{"choices": []}, {"usage": None}], print)


def test_a_host_owned_lead_streams_its_answer_through_its_turn(
    server: ChatServer, tmp_path: Path, redis_url: str
) -> None:
    """The host's loop calls ``turn.complete(client, ...)`` (the real openai SDK over HTTP):
    with ``stream_to_user`` the call is streamed, its pieces reach the waiting reader and the
    hooks, and the answer is stored whole, as the built-in loop's."""
    hooks = Deltas()
    router = Router(
        _settings(server, tmp_path, redis_url, stream=True),
        publisher=RecordingPublisher(),
        hooks=hooks,
    )
    try:
        router.create_schema()
        team = router.create_team(lead_runner="host.lead_turn")
        router.send(team.id, to=LEAD, content="Plan the release.")
        cursor = router.events(team.id)[-1].cursor
        got: list[FeedItem] = []
        reader = threading.Thread(target=_read_until_answer, args=(router, team.id, cursor, got))
        reader.start()
        _listening(router, redis_url, team.id)
        lead = router.agent(team.id, LEAD)
        with (
            openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0) as client,
            hosted.claim(lead.id, lead.epoch, router=router, tools=default_registry()) as turn,
        ):
            assert turn is not None
            while (text := turn.step(turn.complete(client, model="test-model"))) is None:
                pass
        assert turn.outcome == TurnOutcome.ENDED
        reader.join(timeout=120.0)
        assert not reader.is_alive()
        answer = router.user_messages(team.id)[-1]
        assert answer.content == text and text.startswith(MARK)
        assert "".join(d.text for _t, _a, d in hooks.seen) == text
        assert [d.seq for _t, _a, d in hooks.seen] == list(range(len(hooks.seen)))
        pieces = [item for item in got if item.kind == "delta"]
        assert pieces and all(p.sender == LEAD for p in pieces)
        kinds = [item.kind for item in got if item.kind != "event"]
        assert kinds == ["delta"] * len(pieces) + ["answer"]
        assert all(r.body["stream"] is True for r in server.requests)
    finally:
        router.close()
