"""What the columns that values from outside reach can hold: one declaration that the store's
models build those columns from and that the boundary (:mod:`agent_router.validation`)
checks against, so that a column and its check never disagree. A column widened here is
widened in the schema (a migration follows) and in its check at once.

- A ``String(n)`` holds ``n`` characters (PostgreSQL's ``varchar(n)`` counts characters and
  refuses more; SQLite would keep them, which is why the check is made before either sees it).
- ``Integer`` is 32 bits and ``BigInteger`` 64 bits on PostgreSQL; SQLite keeps 64 bits in
  either, so the narrower PostgreSQL range is the limit on both: a 32-bit column's type
  (:data:`COUNTER`, every ``Mapped[int]`` of the models) refuses a wider value as it is
  written, on SQLite as PostgreSQL does (:class:`OutOfRangeError`, SQLSTATE 22003).
- ``Float`` holds finite numbers (a deadline computed from an infinite one cannot be written).
- Text of any column (``String``, ``Text``, and every string inside a ``JSON`` value, keys
  included) holds no NUL (PostgreSQL's ``text`` and ``jsonb`` refuse it) and no lone surrogate
  (no encoding can write one).
- A ``JSON`` value nests at most :data:`MAX_JSON_DEPTH` deep and holds only finite numbers
  (``jsonb`` refuses ``NaN`` and ``Infinity``; SQLite's JSON would store them).

:func:`from_metadata` reads every column's limit back from a schema (the tests hold the
models to this module with it); :func:`storable` and :func:`storable_json` make text the store
writes on its own account (an error message, a ledger event's detail) fit any column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa

from agent_router.domain import BudgetName

#: Display names, roles, senders (``job:<name>`` included), background job names, model names.
NAME: Final = sa.String(200)
#: Dedup keys, tool call ids, Celery task ids.
KEY: Final = sa.String(200)
#: A host's turn runner (``name@queue``).
RUNNER: Final = sa.String(300)
#: Every table's key, and every column that refers to one (SQLite's 64-bit INTEGER is the
#: rowid it autoincrements).
ID: Final = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class OutOfRangeError(OverflowError):
    """Raised when a value written to an integer column is beyond its range: what PostgreSQL
    says of it, with the standard's SQLSTATE, so that both databases say the same."""

    sqlstate = "22003"

    def __init__(self) -> None:
        super().__init__("integer out of range")


class Counter(sa.types.TypeDecorator[int]):
    """A 32-bit integer column whose every written value is checked against its range: on
    PostgreSQL ``integer`` refuses a wider one itself, SQLite would keep it."""

    impl = sa.Integer
    cache_ok = True

    def process_bind_param(self, value: int | None, dialect: sa.Dialect) -> int | None:
        if value is not None and not -(2**31) <= value < 2**31:
            raise OutOfRangeError()
        return value


#: Epochs, sequence numbers and transcript positions: every ``Mapped[int]`` of the models.
COUNTER: Final = Counter()
#: The column type of each budget's limit: counts and costs (in nano-dollars) 64 bits, the
#: sub-agents 32, the wall time a float.
BUDGET_LIMITS: Final[Mapping[BudgetName, sa.types.TypeEngine[Any]]] = {
    BudgetName.MODEL_CALLS: sa.BigInteger(),
    BudgetName.TURNS: sa.BigInteger(),
    BudgetName.TOKENS: sa.BigInteger(),
    BudgetName.COST: sa.BigInteger(),
    BudgetName.WALL_SECONDS: sa.Float(),
    BudgetName.SUB_AGENTS_CREATED: sa.Integer(),
    BudgetName.SUB_AGENTS_ACTIVE: sa.Integer(),
}
#: A cost is stored in nano-dollars (1e-9 US dollars): integer sums, no rounding drift.
NANO: Final = 1_000_000_000

#: How deep a JSON value (a transcript entry, a ledger event's detail, an outbox payload) may
#: nest. Python's own parser and serializer recurse once per level (about 1,000 by default) and
#: PostgreSQL's ``jsonb`` parser is bounded by its stack; nothing the router writes nests more
#: than a few levels, and a tool call's arguments are stored as a string.
MAX_JSON_DEPTH: Final = 64

#: The character that stands in for what no column can hold (NUL, a lone surrogate).
REPLACEMENT: Final = "\ufffd"


@dataclass(frozen=True, kw_only=True)
class ColumnLimit:
    """What one column holds: ``kind`` is ``text``, ``integer``, ``float``, ``json`` or
    ``other`` (booleans, enums, times); ``max_chars`` for a ``String(n)``; ``minimum`` and
    ``maximum`` for an integer."""

    name: str  # table.column
    kind: str
    nullable: bool = True
    max_chars: int | None = None
    minimum: int | None = None
    maximum: int | None = None


def _on_postgresql(type_: sa.types.TypeEngine[Any]) -> sa.types.TypeEngine[Any]:
    """The type a column has on PostgreSQL, the stricter database (a variant's base type is
    the one used wherever no variant is given, PostgreSQL included; ``JSON``'s PostgreSQL
    variant is ``JSONB``, which is still JSON)."""
    variants = getattr(type_, "_variant_mapping", {})
    return variants.get("postgresql", type_)  # type: ignore[no-any-return]


def limit_of(
    type_: sa.types.TypeEngine[Any], name: str = "", *, nullable: bool = True
) -> ColumnLimit:
    """What a column of ``type_`` holds."""
    type_ = _on_postgresql(type_)
    if isinstance(type_, sa.types.TypeDecorator):
        type_ = type_.impl_instance
    if isinstance(type_, sa.Enum | sa.Boolean | sa.DateTime):
        return ColumnLimit(name=name, kind="other", nullable=nullable)
    if isinstance(type_, sa.String):  # Text is a String without a length
        return ColumnLimit(name=name, kind="text", nullable=nullable, max_chars=type_.length)
    if isinstance(type_, sa.JSON):
        return ColumnLimit(name=name, kind="json", nullable=nullable)
    if isinstance(type_, sa.Integer):
        bits = 64 if isinstance(type_, sa.BigInteger) else 32
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return ColumnLimit(name=name, kind="integer", nullable=nullable, minimum=low, maximum=high)
    if isinstance(type_, sa.Float):
        return ColumnLimit(name=name, kind="float", nullable=nullable)
    return ColumnLimit(name=name, kind="other", nullable=nullable)


def chars(type_: sa.types.TypeEngine[Any]) -> int:
    """How many characters a ``String(n)`` column holds."""
    found = limit_of(type_).max_chars
    if found is None:
        raise ValueError(f"{type_!r} has no length")
    return found


def integer_range(type_: sa.types.TypeEngine[Any]) -> tuple[int, int]:
    """The integers an integer column holds."""
    found = limit_of(type_)
    if found.minimum is None or found.maximum is None:
        raise ValueError(f"{type_!r} is not an integer type")
    return found.minimum, found.maximum


def from_metadata(metadata: sa.MetaData) -> dict[str, ColumnLimit]:
    """Every column's limit in a schema, by ``table.column``: what the columns hold, read
    back from their types."""
    return {
        f"{table.name}.{column.name}": limit_of(
            column.type, f"{table.name}.{column.name}", nullable=bool(column.nullable)
        )
        for table in metadata.sorted_tables
        for column in table.columns
    }


def storable(value: str) -> str:
    """``value`` as a text column can hold it, nothing else changed: NUL and lone surrogates
    become U+FFFD."""
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT)
    return encodable(value)


def encodable(value: str) -> str:
    """``value`` as UTF-8 can write it, nothing else changed: lone surrogates (which a JSON
    escape such as ``"\\ud800"`` decodes to) become U+FFFD. The same object when there are
    none."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(REPLACEMENT if "\ud800" <= c <= "\udfff" else c for c in value)
    return value


def storable_json(value: Any) -> Any:
    """``value`` as a JSON column can hold it (:func:`_storable_json`); one that is so already
    (nearly every one: a flat mapping of short scalars, checked in one pass) is returned as it
    is."""
    if isinstance(value, dict) and all(_plain(v) for v in value.values()):
        return value
    return _storable_json(value)


def _plain(value: Any) -> bool:
    """A scalar a JSON column holds as it is (a string of ASCII without NUL, a bool, a short
    integer, ``None``); anything else takes the slow path."""
    kind = type(value)
    if kind is str:
        return value.isascii() and "\x00" not in value
    if kind is int:
        return bool(value.bit_length() <= 256)
    return kind is bool or value is None


def _storable_json(value: Any, *, depth: int = 0) -> Any:
    """Every string (keys included) made storable, a number that is not finite written as its
    text (an integer of hundreds of digits: its size), and what nests deeper than
    :data:`MAX_JSON_DEPTH` written as a short text that says so: for what the store writes on
    its own account (a ledger event's detail), which must never be the reason a write fails."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):  # past a few hundred digits, not even text of it is useful
        return value if value.bit_length() <= 256 else f"(an integer of {value.bit_length()} bits)"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= MAX_JSON_DEPTH:
        return f"(nested deeper than {MAX_JSON_DEPTH} levels: not kept)"
    if isinstance(value, Mapping):
        return {storable(str(k)): _storable_json(v, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable_json(v, depth=depth + 1) for v in value]
    return storable(str(value))
