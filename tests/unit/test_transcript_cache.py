"""A process's transcript cache stays bounded: by agents, by entries and by bytes in all,
letting the least recently used agents go; the most recent is kept whatever its size."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_router.agents.context import ContextWindow
from agent_router.store.transcripts import TranscriptCache, entry_bytes


def _reader(lengths: dict[int, int]) -> Any:
    def read_after(agent_id: int, after: int | None) -> list[tuple[int, dict[str, Any]]]:
        start = 0 if after is None else after
        return [(p, {"agent": agent_id, "p": p}) for p in range(start, lengths[agent_id])]

    return read_after


@settings(max_examples=200, deadline=None)
@given(
    reads=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 40)), min_size=1, max_size=60),
    capacity=st.integers(1, 6),
    max_entries=st.integers(1, 120),
)
def test_the_cache_holds_at_most_its_agents_and_entries(
    reads: list[tuple[int, int]], capacity: int, max_entries: int
) -> None:
    cache = TranscriptCache(capacity, max_entries)
    lengths: dict[int, int] = {}
    for agent, grown in reads:
        lengths[agent] = max(lengths.get(agent, 0), grown)  # a transcript only grows
        cached = cache.get(agent)
        cached.refresh(_reader(lengths))
        # What a reader gets is the whole transcript, read or kept.
        assert [e["p"] for e in cached.entries] == list(range(lengths[agent]))
        # At the next get the cache is back within its bounds, keeping the newest agent.
        other = cache.get(agent)
        assert other is cached
        held = cache.entries()
        assert held <= max(max_entries, len(cached.entries))
        assert len(cache._agents) <= capacity
        assert next(reversed(cache._agents)) == agent


def test_an_agent_let_go_is_read_whole_again() -> None:
    cache = TranscriptCache(capacity=10, max_entries=50)
    lengths = {1: 40, 2: 40}
    first = cache.get(1)
    first.refresh(_reader(lengths))
    cache.get(2).refresh(_reader(lengths))
    cache.get(2)  # over 50 entries: agent 1, the least recent, is let go
    again = cache.get(1)
    assert again is not first and again.entries == []
    assert again.refresh(_reader(lengths)) == 40


def _sized_reader(lengths: dict[int, int], sizes: dict[int, int]) -> Any:
    """Entries whose text is ``sizes[agent]`` characters long."""

    def read_after(agent_id: int, after: int | None) -> list[tuple[int, dict[str, Any]]]:
        start = 0 if after is None else after
        text = "t" * sizes[agent_id]
        return [
            (p, {"role": "user", "content": f"{p}{text}"}) for p in range(start, lengths[agent_id])
        ]

    return read_after


@settings(max_examples=200, deadline=None)
@given(
    reads=st.lists(
        st.tuples(st.integers(0, 7), st.integers(1, 30), st.integers(0, 5000), st.booleans()),
        min_size=1, max_size=50,
    ),
    capacity=st.integers(1, 6),
    max_entries=st.integers(1, 120),
    max_bytes=st.integers(1, 400_000),
)  # fmt: skip
def test_the_cache_holds_at_most_its_agents_entries_and_bytes(
    reads: list[tuple[int, int, int, bool]], capacity: int, max_entries: int, max_bytes: int
) -> None:
    cache = TranscriptCache(capacity, max_entries, max_bytes)
    lengths: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for agent, grown, size, windowed in reads:
        lengths[agent] = max(lengths.get(agent, 0), grown)
        sizes.setdefault(agent, size)  # an entry, once written, never changes
        read = _sized_reader(lengths, sizes)
        cached = cache.get(agent)
        cached.refresh(read)
        if windowed:  # a request window beside the transcript, as the built-in loop keeps
            window = cached.views.get("window")
            if not isinstance(window, ContextWindow):
                window = cached.views["window"] = ContextWindow(target=None, budget=None)
            window.take(
                read(agent, window.length - 1 if window.length else None)[
                    1 if window.length else 0 :
                ]
            )
            # The window's count is the entries' it holds, each counted once.
            assert window.nbytes == sum(entry_bytes(e) for e in window.held())
        assert cached.nbytes() == sum(entry_bytes(e) for e in cached.entries) + sum(
            getattr(v, "nbytes", 0) for v in cached.views.values()
        )
        newest = cache.get(agent)
        assert newest is cached
        # Back within every bound, the newest agent kept whatever its size.
        assert cache.nbytes() <= max(max_bytes, cached.nbytes())
        assert cache.entries() <= max(max_entries, cached.size())
        assert len(cache._agents) <= capacity
        assert next(reversed(cache._agents)) == agent


def test_a_window_counts_the_bytes_it_holds_and_lets_go() -> None:
    window = ContextWindow(target=2000, budget=1000, keep_recent=2)
    rows = [(p, {"role": "user", "content": f"{p} " + "w" * 2000}) for p in range(30)]
    window.take(rows)
    assert len(window) < 30  # the cut moved: what is before it was let go
    assert window.nbytes == sum(entry_bytes(e) for e in window.held())
