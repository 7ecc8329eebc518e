"""A model call costs the router what is new, not the whole history; and a long-lived agent's
requests stop growing at their target (the transcript stays complete). Real SQLite and
PostgreSQL; the model answers at once (two ``do_work`` calls, then a final reply)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from agent_router import Router, Settings
from agent_router.agents.context import WINDOW_NOTE, ContextWindow, count_tokens, pairing_holds
from agent_router.agents.loop import WINDOW_VIEW, TurnOutcome, context_target, run_turn
from agent_router.agents.protocol import HEADING
from agent_router.agents.roles import RoleCatalogue
from agent_router.agents.tools import default_registry
from agent_router.domain import LedgerAction, TurnRecord
from agent_router.ops.bench import ENTRY_TEXT, InstantModel
from agent_router.outbox import RecordingPublisher
from agent_router.store import BeforeCall
from agent_router.turn import Turn

TARGET = 3000


class Recording(InstantModel):
    """An :class:`InstantModel` that keeps every request it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.requests.append((messages, tools))
        return super().complete(messages, tools)


@pytest.fixture
def quick(settings: Settings) -> Iterator[Callable[..., Router]]:
    """Routers on the test's database, each with its own process-wide caches (a worker each)."""
    made: list[Router] = []

    def make(**update: Any) -> Router:
        router = Router(settings.model_copy(update={"work_seconds": 0.0, **update}),
                        publisher=RecordingPublisher())  # fmt: skip
        made.append(router)
        return router

    yield make
    for router in made:
        router.close()


def _turn(router: Router, team_id: int, name: str, model: InstantModel) -> None:
    router.send(team_id, to=name, content=ENTRY_TEXT, sender="user")
    turn = router.claim_turn(team_id, name)
    assert turn is not None
    outcome = run_turn(router, turn, models=lambda _agent: model, tools=default_registry())
    assert outcome is TurnOutcome.ENDED


def _counting_reads(router: Router, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The transcript rows each read of this router's store returned: a read of its own, or
    the entries a transition before a model call read back."""
    counts: list[int] = []
    read, before_call = router.store.reads.transcript_after, router.store.before_call

    def counted(
        agent_id: int, position: int | None, *, also: Sequence[int] = ()
    ) -> list[tuple[int, dict[str, Any]]]:
        rows = read(agent_id, position, also=also)
        counts.append(len(rows))
        return rows

    def counted_before(turn: TurnRecord, **kwargs: Any) -> BeforeCall:
        before = before_call(turn, **kwargs)
        if before.rows is not None:
            counts.append(len(before.rows))
        return before

    monkeypatch.setattr(router.store.reads, "transcript_after", counted)
    monkeypatch.setattr(router.store, "before_call", counted_before)
    return counts


def _window(router: Router, agent_id: int) -> ContextWindow:
    window = router.store.transcripts.get(agent_id).views[WINDOW_VIEW]
    assert isinstance(window, ContextWindow)
    return window


def _built_whole(router: Router, agent_id: int, length: int, target: int) -> ContextWindow:
    """The agent's window as a process that reads the whole transcript builds it."""
    window = ContextWindow(target=target, budget=_window(router, agent_id).budget)
    window.extend(router.store.reads.transcript(agent_id)[:length])
    return window


def test_a_model_call_reads_only_the_entries_appended_since(
    quick: Callable[..., Router], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, other = quick(context_target_tokens=TARGET), quick(context_target_tokens=TARGET)
    team = worker.create_team()
    agent = worker.create_agent(team.id, role="Bench")
    worker.store.seed_mailbox(agent.id, 1000, content=ENTRY_TEXT)
    _turn(worker, team.id, agent.display_name, InstantModel())  # reads the 1,000 it drains
    counts = _counting_reads(worker, monkeypatch)
    _turn(worker, team.id, agent.display_name, InstantModel())
    # Three model calls, a read before each: the entry it took in last (which tells that the
    # rows are the ones it holds) and those appended since.
    assert counts and max(counts) <= 3, counts
    assert sum(counts) <= 3 * len(counts), counts
    # Another worker runs the agent's next turn; this one then reads what it appended, the
    # message that wakes it and the entry it took in last.
    held = _window(worker, agent.id).length
    _turn(other, team.id, agent.display_name, InstantModel())
    appended = len(worker.store.reads.transcript(agent.id)) - held
    counts.clear()
    recording = Recording()
    _turn(worker, team.id, agent.display_name, recording)
    assert counts[0] == appended + 2 and max(counts[1:]) <= 3, (appended, counts)
    stored = worker.store.reads.transcript(agent.id)
    assert len(stored) > 1000
    # This process's window is the one built from the stored transcript: nothing was missed,
    # and the model read the newest entry (the message that woke it) last.
    window = _window(worker, agent.id)
    assert window.length == len(stored) - 1, "all but the final reply, after the last call"
    whole = _built_whole(worker, agent.id, window.length, TARGET)
    assert (whole.cut, whole.request().messages) == (window.cut, window.request().messages)
    assert whole.cut > 900
    # It holds what its requests hold, not the transcript.
    assert len(window) < 100
    woke = recording.requests[0][0][-1]
    assert woke["role"] == "user" and ENTRY_TEXT.strip() in woke["content"]


def test_a_window_let_go_is_read_again_from_its_cut_not_whole(
    quick: Callable[..., Router], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker that keeps one agent at a time lets the other's window go between its turns.
    worker = quick(context_target_tokens=TARGET, transcript_cache_agents=1)
    team = worker.create_team()
    first = worker.create_agent(team.id, role="Bench")
    second = worker.create_agent(team.id, role="Bench")
    for agent in (first, second):
        worker.store.seed_mailbox(agent.id, 1500, content=ENTRY_TEXT)
        _turn(worker, team.id, agent.display_name, InstantModel())
    counts = _counting_reads(worker, monkeypatch)
    for _ in range(3):
        for agent in (first, second):
            counts.clear()
            recording = Recording()
            _turn(worker, team.id, agent.display_name, recording)
            # The first call reads the pinned entries and those from the cut on: what the
            # request holds (a few more: the cut moves in steps), not 1,500 entries.
            window = _window(worker, agent.id)
            assert counts[0] <= len(window) + 3 < 100, counts
            whole = _built_whole(worker, agent.id, window.length, TARGET)
            assert whole.cut == window.cut > 1400
            assert recording.requests[-1][0][1:] == whole.request().messages
    # Where it stood is kept on the agent.
    checkpoint = worker.store.reads.window_checkpoint(first.id)
    assert checkpoint is not None and checkpoint["cut"] > 1400


def test_a_kept_window_whose_last_entry_changed_is_built_again(
    quick: Callable[..., Router],
) -> None:
    worker = quick(context_target_tokens=TARGET)
    team = worker.create_team()
    agent = worker.create_agent(team.id, role="Bench")
    worker.store.seed_mailbox(agent.id, 600, content=ENTRY_TEXT)
    _turn(worker, team.id, agent.display_name, InstantModel())
    kept = _window(worker, agent.id)
    # The last entry this process took in is not the one stored at its position (as when the
    # agent's rows were deleted and its id given to another): the window is built again.
    kept._last = {"role": "assistant", "content": "not what is stored"}
    _turn(worker, team.id, agent.display_name, InstantModel())
    window = _window(worker, agent.id)
    assert window is not kept
    whole = _built_whole(worker, agent.id, window.length, TARGET)
    assert (whole.cut, whole.request().messages) == (window.cut, window.request().messages)


def test_a_transcript_read_again_whole_when_its_rows_are_not_the_ones_kept(
    quick: Callable[..., Router],
) -> None:
    worker = quick()
    team = worker.create_team()
    agent = worker.create_agent(team.id, role="Bench")
    _turn(worker, team.id, agent.display_name, InstantModel())
    cached = worker.store.transcripts.get(agent.id)
    cached.refresh(worker.store.reads.transcript_after)
    assert cached.entries == worker.store.reads.transcript(agent.id)
    # The last entry this process holds is not the one stored at its position (as when the
    # agent's rows were deleted and its id given to another): it reads the transcript whole.
    cached.entries[-1] = {"role": "assistant", "content": "not what is stored"}
    generation = cached.generation
    cached.refresh(worker.store.reads.transcript_after)
    assert cached.generation == generation + 1
    assert cached.entries == worker.store.reads.transcript(agent.id)


def test_requests_plateau_at_the_target_and_the_transcript_stays_whole(
    quick: Callable[..., Router],
) -> None:
    router = quick(context_target_tokens=TARGET)
    team = router.create_team()
    agent = router.create_agent(team.id, role="Bench")
    name = agent.display_name
    first = Recording()
    _turn(router, team.id, name, first)  # the first task: "start" for the window
    task = first.requests[0][0][1]["content"]
    # The lead asks the agent a question it does not answer; then 2,000 notices arrive.
    router.send(team.id, to=team.lead.display_name, content="go", sender="user")
    lead_turn = router.claim_turn(team.id, team.lead.display_name)
    assert isinstance(lead_turn, Turn)
    lead_turn.drain()
    call = {"id": "ask-1", "type": "function",
            "function": {"name": "ask_sub_agent", "arguments": "{}"}}  # fmt: skip
    lead_turn.append_assistant({"role": "assistant", "content": None, "tool_calls": [call]})
    question = lead_turn.ask(name, "Which endpoint does the reset form post to?",
                             tool_call_id="ask-1")  # fmt: skip
    router.store.seed_mailbox(agent.id, 2000, content=ENTRY_TEXT)
    models = [Recording() for _ in range(4)]
    for model in models:
        _turn(router, team.id, name, model)
    stored = router.store.reads.transcript(agent.id)
    assert len(stored) > 2000
    requests = [r for m in models for r in m.requests]
    for messages, tools in requests:
        assert count_tokens(messages, tools) <= TARGET
        assert messages[0]["role"] == "system" and HEADING in messages[0]["content"]
        assert messages[1]["content"] == task, "the first task stays"
        assert WINDOW_NOTE.split("{n}")[1][:40] in messages[2]["content"]
        assert f'question_id="{question.id}"' in messages[3]["content"], "the open question"
        assert pairing_holds(messages), "a tool call and its results stay together"
    # The last request ends with the newest entries as stored (the final reply came after).
    assert models[-1].requests[-1][0][-2:] == stored[-3:-1]
    events = [
        e for e in router.ledger(team.id)
        if e.action is LedgerAction.MODEL_CALL and "context" in e.detail
    ]  # fmt: skip
    # One event each time what the request leaves out changed, not one per call.
    left_out = [int(messages[2]["content"][1:].split()[0]) for messages, _ in requests]
    changes = [n for i, n in enumerate(left_out) if i == 0 or n != left_out[i - 1]]
    assert [e.detail["context"]["left_out"] for e in events] == changes
    assert len(events) < len(requests) // 3
    for event in events:
        context = event.detail["context"]
        assert context["target_tokens"] == TARGET and context["request_tokens"] <= TARGET
    assert left_out[0] > 1900


def _left_out(messages: list[dict[str, Any]]) -> int:
    return int(messages[2]["content"][1:].split()[0])


def test_workers_take_turns_and_report_each_cut_once(quick: Callable[..., Router]) -> None:
    workers = [quick(context_target_tokens=TARGET), quick(context_target_tokens=TARGET)]
    team = workers[0].create_team()
    agent = workers[0].create_agent(team.id, role="Bench")
    _turn(workers[0], team.id, agent.display_name, InstantModel())
    workers[0].store.seed_mailbox(agent.id, 600, content=ENTRY_TEXT)
    sent: list[int] = []  # what each request left out, in order
    for n in range(8):
        # The agent's turns alternate between two workers; each builds the window it does
        # not hold from where the other's stood, and catches up on the entries since.
        worker = workers[n % 2]
        recording = Recording()
        _turn(worker, team.id, agent.display_name, recording)
        sent += [_left_out(messages) for messages, _tools in recording.requests]
        window = _window(worker, agent.id)
        whole = _built_whole(worker, agent.id, window.length, TARGET)
        assert (whole.cut, whole.request().messages) == (window.cut, window.request().messages)
        if n:
            worker.store.seed_mailbox(agent.id, 40, content=ENTRY_TEXT)
    reported = [
        e.detail["context"]["left_out"] for e in workers[0].ledger(team.id) if "context" in e.detail
    ]
    # Each cut a request was sent with is reported once, by whichever worker sent it first.
    assert reported == sorted(set(sent)), (reported, sent)
    assert len(reported) >= 3


def test_a_role_sets_its_own_target_within_its_window(quick: Callable[..., Router]) -> None:
    roles = RoleCatalogue.from_toml(
        '[[roles]]\nname = "Reviewer"\nsystem_prompt = "You review."\n'
        "context_target_tokens = 2500\n\n"
        '[[roles]]\nname = "Small"\nsystem_prompt = "You are small."\ncontext_window = 8000\n'
    )
    tools = default_registry(roles)
    router = quick(context_target_tokens=TARGET * 4)
    team = router.create_team()
    reviewer = router.create_agent(team.id, role="Reviewer")
    small = router.create_agent(team.id, role="Small")
    other = router.create_agent(team.id, role="Bench")
    assert context_target(router, reviewer, tools) == 2500
    assert context_target(router, small, tools) == 8000 - 2000  # its window less the reserve
    assert context_target(router, other, tools) == TARGET * 4
    # A model that says its window caps the target as a role's window does; a role's wins.
    assert context_target(router, other, tools, model_window=4000) == 4000 - 1000
    assert context_target(router, small, tools, model_window=4000) == 8000 - 2000
    router.store.seed_mailbox(reviewer.id, 300, content=ENTRY_TEXT)
    model = Recording()
    router.send(team.id, to=reviewer.display_name, content=ENTRY_TEXT, sender="user")
    turn = router.claim_turn(team.id, reviewer.display_name)
    assert turn is not None
    assert run_turn(router, turn, models=lambda _agent: model, tools=tools) is TurnOutcome.ENDED
    for messages, schemas in model.requests:
        assert count_tokens(messages, schemas) <= 2500
