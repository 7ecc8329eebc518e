"""A process's transcript cache stays bounded: by agents and by entries in all, letting the
least recently used agents go; the most recent is kept whatever its length."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_router.store.transcripts import TranscriptCache


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
