"""The bench's rows: each figure beside its floor, its ratio to the raw driver's floor measured in
the same run, and the published target it is held to (met or not). Nothing is asserted here."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True, kw_only=True)
class Row:
    figure: str
    backend: str
    ours: float
    floor: float | None  # what this figure is compared with, measured in the same run
    ratio: float | None  # ours / floor
    raw_ratio: float | None  # ours / the raw driver's floor transaction (same kind of figure)
    target: str | None  # the published target, in words
    met: bool | None  # whether this run met it
    unit: str


def row(
    figure: str,
    backend: str,
    ours: float,
    floor: float | None,
    unit: str,
    *,
    raw: float | None = None,
    target: str | None = None,
    limit: float | None = None,
    at_least: bool = False,
) -> Row:
    """One row. ``raw`` is the raw floor of the same kind (a latency for ms, a rate for msg/s);
    ``limit`` is the value the target puts on ``ours`` (an upper bound, or a lower one when
    ``at_least``). Ratios are of the unrounded figures."""
    met = None if limit is None else (ours >= limit if at_least else ours <= limit)
    return Row(
        figure=figure,
        backend=backend,
        ours=round(ours, 3),
        floor=None if floor is None else round(floor, 3),
        ratio=round(ours / floor, 2) if floor else None,
        raw_ratio=round(ours / raw, 2) if raw else None,
        target=target,
        met=met,
        unit=unit,
    )


def render(rows: list[Row]) -> str:
    head = (
        f"{'figure':<52} {'backend':<16} {'ours':>9} {'floor':>9} {'ratio':>6} {'x raw':>6}  "
        f"{'unit':<6} target"
    )
    lines = [head, "-" * (len(head) + 30)]
    for r in rows:
        floor = "-" if r.floor is None else f"{r.floor:.3f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        raw = "-" if r.raw_ratio is None else f"{r.raw_ratio:.2f}"
        target = ""
        if r.target is not None:
            verdict = "" if r.met is None else (" (met)" if r.met else " (NOT met)")
            target = f"{r.target}{verdict}"
        lines.append(
            f"{r.figure:<52} {r.backend:<16} {r.ours:>9.3f} {floor:>9} {ratio:>6} {raw:>6}  "
            f"{r.unit:<6} {target}".rstrip()
        )
    return "\n".join(lines)


def to_json(rows: list[Row]) -> str:
    return json.dumps([asdict(r) for r in rows])
