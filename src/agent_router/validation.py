"""The one boundary for values from outside: the Router, the Turn, the CLI, the tools and the
agent loop check what they are given here before anything reaches the database.

The limits are the columns' own (:mod:`agent_router.limits`, which the store's models build
those columns from): a ``String(n)`` column's length, an ``Integer`` or ``BigInteger`` column's
range, text without NUL or lone surrogates, JSON of bounded depth with finite numbers. Every
check raises a :class:`~agent_router.errors.RefusedError` subclass, so a bad argument gets the
same typed error on SQLite and PostgreSQL and writes nothing. Names are plain and printable, so
that they cannot imitate an envelope, hide characters or pass for another name.

What a model, a tool or a job produced is not refused but made storable (:func:`scrub`,
:func:`model_reply`, :func:`tool_output`): the model reads what became of it and can act on
it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import sys
import unicodedata
from collections.abc import Collection, Mapping
from typing import Any, Final

from pydantic_core import to_jsonable_python

from agent_router import errors, formats, limits
from agent_router.domain import LEAD_DISPLAY_NAME, BudgetName, MessageType

#: Senders that are not agents of the team. ``job:<name>`` is a background job.
EXTERNAL_SENDERS: Final = frozenset({"user", "system"})
EXTERNAL_PREFIX: Final = "job:"
#: Names no sub-agent may take, nor anything that reads as one: the router's own senders and
#: the lead's name.
RESERVED_NAMES: Final = (*sorted(EXTERNAL_SENDERS), LEAD_DISPLAY_NAME)

#: The largest id (every table's key and every reference to one).
MAX_ID: Final = limits.integer_range(limits.ID)[1]
#: Epochs, sequence numbers and transcript positions (32 bits on PostgreSQL).
MIN_INT32, MAX_INT32 = limits.integer_range(limits.COUNTER)
#: Display names, roles and senders (``job:<name>`` included).
MAX_NAME_CHARS: Final = limits.chars(limits.NAME)
#: Roles: a sub-agent's display name is ``{role}_{n}``, which must fit a name whatever ``n``
#: (a 32-bit count) grows to.
MAX_ROLE_CHARS: Final = MAX_NAME_CHARS - len("_") - len(str(MAX_INT32))
#: A background job's name: its notices come from ``job:<name>``, a sender.
MAX_JOB_NAME_CHARS: Final = limits.chars(limits.NAME) - len(EXTERNAL_PREFIX)
#: Dedup keys and tool call ids.
MAX_KEY_CHARS: Final = limits.chars(limits.KEY)
#: A host's turn runner (``name@queue``).
MAX_RUNNER_CHARS: Final = limits.chars(limits.RUNNER)
#: The model named in a model call's usage.
MAX_MODEL_CHARS: Final = limits.chars(limits.NAME)
#: How deep a JSON value from outside may nest.
MAX_JSON_DEPTH: Final = limits.MAX_JSON_DEPTH
#: System prompts.
MAX_PROMPT_BYTES: Final = 1024 * 1024
#: The most tokens one model call may report (far beyond any model's window): the team's sums,
#: 64-bit columns, cannot overflow from millions of such calls.
MAX_TOKENS_PER_CALL: Final = 2**40

# Control, format (zero-width, bidi), surrogate, private-use and unassigned code points, and
# line and paragraph separators: invisible or layout-changing inside a name.
_HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# Characters of an envelope or of markup.
_MARKUP: Final = frozenset('"<>&\\`')
# Scripts whose letters look alike: a name mixing two of them imitates another name.
_CONFUSABLE_SCRIPTS: Final = frozenset({"LATIN", "CYRILLIC", "GREEK"})


def row_id(value: Any, what: str, unknown: type[errors.RefusedError]) -> int:
    """An id of a row: an ``int`` (not a ``bool``); one outside 1..2**63-1 names no row."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.InvalidArgumentError(f"{what} must be an integer, not {type(value).__name__}")
    if not 1 <= value <= MAX_ID:
        raise unknown(f"unknown {what} {shown(value)}")
    return value


def shown(value: int) -> str:
    """An integer as an error message quotes it: one of thousands of digits (which Python
    will not even convert to text) by its size."""
    if value.bit_length() <= 128:
        return str(value)
    return f"of {value.bit_length()} bits"


def integer(
    value: Any, what: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """An ``int`` (not a ``bool``), within ``minimum``..``maximum`` where given."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.InvalidArgumentError(f"{what} must be an integer, not {type(value).__name__}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise errors.InvalidArgumentError(f"{what} must be between {minimum} and {maximum}")
    return value


def seconds(value: Any, what: str, *, maximum: float = 366 * 24 * 3600.0) -> float:
    """A duration: a finite, non-negative number of seconds up to ``maximum``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise errors.InvalidArgumentError(f"{what} must be a number of seconds")
    if not 0 <= value <= maximum:  # NaN fails both comparisons
        raise errors.InvalidArgumentError(f"{what} must be between 0 and {maximum:g} seconds")
    return float(value)


def text(value: Any, what: str, *, max_bytes: int, blank: bool = False) -> str:
    """Stored text: a ``str``, non-blank unless ``blank``, without NUL or lone surrogates, at
    most ``max_bytes`` in UTF-8."""
    if not isinstance(value, str):
        raise errors.InvalidArgumentError(f"{what} must be a string, not {type(value).__name__}")
    if not blank and not value.strip():
        raise errors.InvalidArgumentError(f"{what} is empty")
    if "\x00" in value:
        raise errors.InvalidArgumentError(f"{what} contains a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise errors.InvalidArgumentError(f"{what} is not valid Unicode (lone surrogate)") from None
    if size > max_bytes:
        raise errors.ContentTooLargeError(f"{what} is {size} bytes; the limit is {max_bytes}")
    return value


def optional_text(value: Any, what: str, *, max_bytes: int = MAX_PROMPT_BYTES) -> str | None:
    return None if value is None else text(value, what, max_bytes=max_bytes)


def name(value: Any, what: str = "display name") -> str:
    """A name the router shows in envelopes and lists: 1-200 characters, NFKC-normalised,
    printable, single spaces inside only, no markup characters and no mix of look-alike
    scripts (Latin with Cyrillic or Greek)."""
    if not isinstance(value, str):
        raise errors.InvalidNameError(f"{what} must be a string, not {type(value).__name__}")
    problem = _name_problem(value)
    if problem is not None:
        raise errors.InvalidNameError(f"invalid {what} {value[:MAX_NAME_CHARS]!r}: {problem}")
    return value


@functools.lru_cache(maxsize=4096)
def _name_problem(value: str) -> str | None:
    """What is wrong with the name ``value``, or ``None``; names repeat (a team's agents, its
    senders), so each is checked once."""
    if not value or len(value) > MAX_NAME_CHARS:
        return f"must be 1-{MAX_NAME_CHARS} characters"
    hidden = [c for c in value if unicodedata.category(c) in _HIDDEN_CATEGORIES]
    if hidden:
        return f"holds invisible or control characters {''.join(hidden)!r}"
    if any(c.isspace() and c != " " for c in value):
        return "holds whitespace other than single spaces"
    if value != value.strip() or "  " in value:
        return "has leading, trailing or repeated spaces"
    if _MARKUP.intersection(value):
        return f"holds one of {''.join(sorted(_MARKUP))}"
    if unicodedata.normalize("NFKC", value) != value:
        return "is not in Unicode normal form NFKC (look-alike characters)"
    scripts = {unicodedata.name(c, "?").split(" ")[0] for c in value if c.isalpha()}
    if len(scripts & _CONFUSABLE_SCRIPTS) > 1:
        return "mixes Latin, Cyrillic or Greek letters"
    return None


def _reading(value: str) -> str:
    """How a name reads, for comparing names: letters and digits only, as
    :func:`~agent_router.formats.normalise` reads them (case folded, look-alikes as their ASCII
    twins, invisible characters dropped)."""
    return "".join(c for c in formats.normalise(value) if c.isalnum())


_RESERVED_READINGS: Final = frozenset(map(_reading, RESERVED_NAMES))
_JOB_READING: Final = _reading(EXTERNAL_PREFIX)


def role(value: Any) -> str:
    """A role: a :func:`name` of at most :data:`MAX_ROLE_CHARS` characters, so that the
    display names made from it (``{role}_{n}``) are names too."""
    checked = name(value, "role")
    if len(checked) > MAX_ROLE_CHARS:
        raise errors.InvalidNameError(
            f"invalid role {checked[:40]!r}...: {len(checked)} characters, at most "
            f"{MAX_ROLE_CHARS} (its agents are named {{role}}_{{n}})"
        )
    return checked


def display_name(value: Any) -> str:
    """A sub-agent's display name: a :func:`name` that does not read as one the router
    reserves (:data:`RESERVED_NAMES`, a ``job:`` prefix) in any case, spacing or punctuation,
    or spelt with look-alike letters (``SYSTEM``, ``s y s t e m``, SYSTEM in Cyrillic letters,
    ``team-leader``, ``Job: x``). The lead's own name is left to the team, where it is taken:
    the store refuses it as a duplicate."""
    checked = name(value)
    if checked == LEAD_DISPLAY_NAME:
        return checked
    read = formats.normalise(checked)
    reading = "".join(c for c in read if c.isalnum())
    prefixed = read.replace(" ", "").startswith(_JOB_READING + ":")
    if reading in _RESERVED_READINGS or prefixed:
        raise errors.ReservedNameError(
            f"display name {checked!r} is reserved: it reads as one of the router's own senders "
            f"({', '.join(RESERVED_NAMES)}, job:<name>)"
        )
    return checked


def sender(value: Any) -> str:
    """``user``, ``system``, ``job:<name>`` (a background job) or an agent's display name."""
    if isinstance(value, str) and value in EXTERNAL_SENDERS:
        return value
    if isinstance(value, str) and value.startswith(EXTERNAL_PREFIX):
        name(value[len(EXTERNAL_PREFIX) :], "job name")
        if len(value) > MAX_NAME_CHARS:
            raise errors.InvalidNameError(f"sender is longer than {MAX_NAME_CHARS} characters")
        return value
    return name(value, "sender")


def key(value: Any, what: str) -> str:
    """A dedup key or a tool call id: 1-200 printable characters."""
    if not isinstance(value, str):
        raise errors.InvalidArgumentError(f"{what} must be a string, not {type(value).__name__}")
    problem = _key_problem(value)
    if problem is not None:
        raise errors.InvalidArgumentError(f"{what} {problem}")
    return value


def _key_problem(value: str) -> str | None:
    if not value.strip() or len(value) > MAX_KEY_CHARS:
        return f"must be 1-{MAX_KEY_CHARS} characters"
    if not value.isprintable():
        # Printable as Python means it: no control, format, private-use or unassigned
        # character, and no space but U+0020 (a no-break space reads as one).
        return "holds invisible or control characters"
    return None


def optional_key(value: Any, what: str) -> str | None:
    return None if value is None else key(value, what)


def scrub(value: str) -> str:
    """Text produced by a model or a job made storable without losing it: NUL and lone
    surrogates become U+FFFD (everything else is kept as written)."""
    return limits.storable(value)


def label(value: Any, what: str) -> str:
    """A short free text the ledger records (who changed a budget): 1-200 printable
    characters."""
    if not isinstance(value, str):
        raise errors.InvalidArgumentError(f"{what} must be a string, not {type(value).__name__}")
    if not value.strip() or len(value) > MAX_NAME_CHARS:
        raise errors.InvalidArgumentError(f"{what} must be 1-{MAX_NAME_CHARS} characters")
    if not value.isprintable():
        raise errors.InvalidArgumentError(f"{what} holds invisible or control characters")
    return value


def job_name(value: Any) -> str:
    """A background job's name: a name short enough that ``job:<name>`` is one too."""
    checked = name(value, "job name")
    if len(checked) > MAX_JOB_NAME_CHARS:
        raise errors.InvalidNameError(f"job name is longer than {MAX_JOB_NAME_CHARS} characters")
    return checked


def model_name(value: Any) -> str | None:
    """The model a call's usage is recorded for (``None``: not known)."""
    if value is None:
        return None
    return label(value, "model")


def budget_limits(value: Any) -> dict[BudgetName, float | None]:
    """A team's limits (``None``: unlimited), each a number its column holds: finite, not
    negative, whole for a count, and within the column's range (a cost in nano-dollars, a
    count of sub-agents in 32 bits, a wall time whose deadline is a date)."""
    if not isinstance(value, Mapping):
        raise errors.InvalidArgumentError("budget limits must be a mapping of budget to number")
    checked: dict[BudgetName, float | None] = {}
    for key, limit in value.items():
        try:
            budget = BudgetName(key)
        except ValueError:
            known = ", ".join(b.value for b in BudgetName)
            raise errors.InvalidArgumentError(f"unknown budget {key!r}; one of {known}") from None
        checked[budget] = None if limit is None else _budget_limit(budget, limit)
    return checked


#: The longest wall-time budget: its deadline must be a date both databases hold.
MAX_WALL_SECONDS: Final = 1e10


def _budget_limit(budget: BudgetName, value: Any) -> float:
    what = f"budget {budget.value}"
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise errors.InvalidArgumentError(f"{what} must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise errors.InvalidArgumentError(f"{what} must be a finite number")
    if value < 0:
        raise errors.InvalidArgumentError(f"{what} must not be negative")
    column = limits.limit_of(limits.BUDGET_LIMITS[budget])
    if budget is BudgetName.WALL_SECONDS:
        if value > MAX_WALL_SECONDS:
            raise errors.InvalidArgumentError(f"{what} must be at most {MAX_WALL_SECONDS:g}")
        return float(value)
    scale = limits.NANO if budget is BudgetName.COST else 1
    if budget is not BudgetName.COST and value != int(value):
        raise errors.InvalidArgumentError(f"{what} must be a whole number")
    assert column.maximum is not None
    if value * scale > column.maximum:
        raise errors.InvalidArgumentError(f"{what} must be at most {column.maximum // scale}")
    return value


def runner(value: Any) -> str:
    """A host's turn runner: a Celery task name, or ``name@queue``."""
    if isinstance(value, str):
        task, at, queue = value.partition("@")
        fits = len(value) <= MAX_RUNNER_CHARS and value.isprintable()
        if task and (queue or not at) and fits and not any(c.isspace() for c in value):
            return value
    raise errors.InvalidMessageError(f"invalid runner {value!r}: a Celery task name, or name@queue")


#: The fields of one message of a ``send_many`` and their defaults.
SEND_FIELDS = {
    "to": None,
    "content": None,
    "type": MessageType.MESSAGE,
    "subtype": None,
    "question_id": None,
    "wake": True,
    "dedup_key": None,
}


def send_fields(message: Any) -> dict[str, Any]:
    """One message of a ``send_many``: ``Router.send``'s keyword arguments but ``sender``."""
    if not isinstance(message, Mapping):
        raise errors.InvalidMessageError("each message of send_many is a mapping")
    unknown = set(message) - set(SEND_FIELDS)
    if unknown:
        raise errors.InvalidMessageError(f"unknown message fields {sorted(map(str, unknown))}")
    if "to" not in message or "content" not in message:
        raise errors.InvalidMessageError("each message of send_many needs 'to' and 'content'")
    return {**SEND_FIELDS, **message}


# ---------------------------------------------------------------------------- what models write

#: The stored arguments of a tool call whose arguments were too large to keep begin so; the
#: loop answers such a call with an error result instead of running it.
ARGUMENTS_NOT_KEPT: Final = "[arguments not kept: "
#: How much of arguments not kept, and of a tool name too long to be one, is kept to show.
_HEAD_CHARS: Final = 200


def call_id(value: Any) -> str:
    """The id a model's tool call is stored and answered under: its own when a column holds it
    (1-200 printable characters), else one the router makes from it, ``call_`` and a digest of
    it. The same id always maps to the same one, so a result given under the model's own id (by
    a host's loop, or a reply that cites it) still pairs with its call."""
    if isinstance(value, str) and _key_problem(value) is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12)
    return f"call_{digest.hexdigest()}"


def model_reply(message: Mapping[str, Any], *, max_argument_bytes: int) -> dict[str, Any]:
    """A model's reply as the transcript can hold it, nothing refused: every string made
    storable (:func:`scrub`), each tool call's id one a column holds (:func:`call_id`), a tool
    name longer than a name cut to its head (no tool has it: the call is answered as an
    unknown tool), arguments larger than ``max_argument_bytes`` replaced by
    :data:`ARGUMENTS_NOT_KEPT`, their size and their head (the call is answered with an error
    that says so, and the model never reads them back), arguments whose JSON escapes spell a
    lone surrogate (``"\\ud800"``) written again with U+FFFD in its place, and a tool call id
    repeated within the reply renamed (:func:`unique_call_ids`). A reply already so is
    returned unchanged."""
    if not isinstance(message, Mapping):
        raise errors.InvalidTranscriptEntryError(
            f"an assistant message is a mapping, not {type(message).__name__}"
        )
    reply: dict[str, Any] = _storable(dict(message), depth=0)
    calls = reply.get("tool_calls")
    if isinstance(calls, list):
        bounded = [
            _bounded_call(c, max_argument_bytes) if isinstance(c, dict) else c for c in calls
        ]
        reply["tool_calls"] = unique_call_ids(bounded)
    return reply


def unique_call_ids(calls: list[Any], used: Collection[str] = (), *, salt: str = "") -> list[Any]:
    """``calls`` with every id unique: one already in ``used`` (the ids the model reads back
    in its request) or repeated within ``calls`` is renamed :func:`call_id` of it, ``salt`` and
    its position (some servers number calls from 0 in every reply, others repeat one id in a
    reply; a repeated id would pair a result with the wrong call, and the store refuses two
    calls of one message under one id). The same calls always get the same ids; calls already
    unique are returned as they are."""
    taken = set(used)
    ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
    if not (taken.intersection(i for i in ids if isinstance(i, str)) or _repeats(ids)):
        return calls
    fixed: list[Any] = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            fixed.append(call)
            continue
        unique = str(call.get("id"))
        if unique in taken:
            unique = call_id(f"{unique}_{salt}{i}")
            while unique in taken:
                unique = call_id(f"{unique}_")
        taken.add(unique)
        fixed.append(call if unique == call.get("id") else {**call, "id": unique})
    return fixed


def _repeats(ids: list[Any]) -> bool:
    present = [i for i in ids if i is not None]
    return len(set(present)) != len(present)


def _bounded_call(call: dict[str, Any], max_argument_bytes: int) -> dict[str, Any]:
    call = {**call, "id": call_id(call.get("id"))}
    function = call.get("function")
    if not isinstance(function, dict):
        return call
    function = dict(function)
    name_ = function.get("name")
    if isinstance(name_, str) and len(name_) > MAX_NAME_CHARS:
        function["name"] = name_[: MAX_NAME_CHARS - 1] + "…"
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        arguments = function["arguments"] = _encodable_arguments(arguments)
        size = len(arguments.encode("utf-8"))
        if size > max_argument_bytes:
            head = arguments[:_HEAD_CHARS]
            function["arguments"] = (
                f"{ARGUMENTS_NOT_KEPT}{size} bytes, over the limit of {max_argument_bytes}] {head}…"
            )
    call["function"] = function
    return call


def _encodable_arguments(arguments: str) -> str:
    """Arguments whose JSON escapes spell a lone surrogate (``"\\ud800"``), which every
    reader that decodes them (a tool, the request that quotes them back) would get as a
    character no encoding writes, written again with U+FFFD in its place; any other text is
    kept as the model wrote it."""
    if "\\u" not in arguments:
        return arguments
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    if json_depth(value) > MAX_JSON_DEPTH or _all_encodable(value):
        return arguments
    return json.dumps(_strings_storable(value), ensure_ascii=False)


def _all_encodable(value: Any) -> bool:
    if isinstance(value, str):
        return limits.storable(value) is value
    if isinstance(value, dict):
        return all(_all_encodable(k) and _all_encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(map(_all_encodable, value))
    return True


def _strings_storable(value: Any) -> Any:
    """``value`` with every string in it (keys included) made storable, nothing else changed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(k): _strings_storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings_storable(v) for v in value]
    return value


def _storable(value: Any, *, depth: int) -> Any:
    """Every string in ``value`` (keys included) made storable; a value nested deeper than a
    JSON column holds is refused."""
    if isinstance(value, str):
        return scrub(value)
    if depth > MAX_JSON_DEPTH and isinstance(value, dict | list):
        raise errors.InvalidTranscriptEntryError(
            f"a transcript entry nests deeper than {MAX_JSON_DEPTH} levels"
        )
    if isinstance(value, dict):
        return {scrub(str(k)): _storable(v, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v, depth=depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise errors.InvalidTranscriptEntryError("a transcript entry holds a number not finite")
    return value


def storable(value: Any) -> Any:
    """A JSON value from outside (a transcript entry) with every string in it made storable;
    one nested deeper than :data:`MAX_JSON_DEPTH` or holding a number that is not finite is
    refused (:class:`~agent_router.errors.InvalidTranscriptEntryError`)."""
    return _storable(value, depth=0)


def json_text(raw: str, what: str) -> Any:
    """JSON text from outside (a tool call's arguments), read: an integer too long for Python
    to convert is kept as its digits (a string: no id has them); text that is not JSON, or
    nests deeper than :data:`MAX_JSON_DEPTH`, is refused
    (:class:`~agent_router.errors.InvalidArgumentError`) with what is wrong. Every string in
    the result is made storable."""
    try:
        value = json.loads(raw, parse_int=_integer, parse_float=_float, parse_constant=str)
    except RecursionError:
        raise errors.InvalidArgumentError(f"{what} nest too deep to read") from None
    except ValueError as exc:  # JSONDecodeError included
        raise errors.InvalidArgumentError(f"{what} are not valid JSON ({exc})") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise errors.InvalidArgumentError(f"{what} nest deeper than {MAX_JSON_DEPTH} levels")
    return _storable(value, depth=0)


def _float(text: str) -> float | str:
    number = float(text)
    return number if math.isfinite(number) else text


def _integer(digits: str) -> int | str:
    limit = sys.get_int_max_str_digits()
    return digits if limit and len(digits.lstrip("-")) > limit else int(digits)


def json_depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0, ``[]``: 1), counted without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((v, depth + 1) for v in item)
    return deepest


# ---------------------------------------------------------------------------- what tools return

#: The longest text a value a tool returned that is not JSON is shown as (its ``repr``).
MAX_SHOWN_CHARS: Final = 2000
#: The most values (containers and scalars) of one tool's return value written as JSON; each
#: container's rest past them is one short text that says how many were left out.
MAX_OUTPUT_VALUES: Final = 100_000


def tool_output(value: Any) -> str:
    """What a tool returned as the text of its result, whatever its type; never raises. A
    ``str`` is kept (made storable, :func:`scrub`); ``bytes`` are decoded as UTF-8, a byte
    that is not replaced by U+FFFD; anything else is written as JSON (pydantic's conversion:
    dataclasses, models, dates, sets), where an integer too long to write as text (Python
    writes at most 4,300 digits), a number that is not finite, a value that contains itself,
    one nested deeper than :data:`MAX_JSON_DEPTH` and any object JSON cannot hold are each
    written as a short readable text (at most :data:`MAX_SHOWN_CHARS`) saying what they
    were."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return scrub(bytes(value).decode("utf-8", "replace"))
    budget = [MAX_OUTPUT_VALUES]
    try:
        return json.dumps(
            _jsonable(value, depth=0, path=frozenset(), budget=budget),
            ensure_ascii=False,
            allow_nan=False,
        )
    except (ValueError, TypeError, RecursionError):  # a to_jsonable_python result gone wrong
        return json.dumps(_readable(value), ensure_ascii=False)


def _jsonable(value: Any, *, depth: int, path: frozenset[int], budget: list[int]) -> Any:
    """``value`` as a JSON value holds it (see :func:`tool_output`); ``path``: the ids of the
    containers it sits in; ``budget``: the values left to write."""
    budget[0] -= 1
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return scrub(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, int):
        return int(value) if _writable(value) else _readable(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if id(value) in path:
        return f"(this {type(value).__name__} contains itself: not shown again)"
    if depth >= MAX_JSON_DEPTH:
        return f"(nested deeper than {MAX_JSON_DEPTH} levels: not shown)"
    inner = path | {id(value)}
    if isinstance(value, Mapping):
        written: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if budget[0] <= 0:
                written["…"] = _left_out(len(value) - i)
                break
            written[_key(k)] = _jsonable(v, depth=depth + 1, path=inner, budget=budget)
        return written
    if isinstance(value, list | tuple | set | frozenset):
        items: list[Any] = []
        for i, v in enumerate(value):
            if budget[0] <= 0:
                items.append(_left_out(len(value) - i))
                break
            items.append(_jsonable(v, depth=depth + 1, path=inner, budget=budget))
        return items
    try:
        converted = to_jsonable_python(value)
    except Exception:  # any object may fail to convert: it is shown instead
        return _readable(value)
    if isinstance(converted, dict | list):
        return _jsonable(converted, depth=depth + 1, path=inner, budget=budget)
    return _jsonable(converted, depth=depth, path=inner, budget=budget)


def _left_out(count: int) -> str:
    return f"({count} more values: not shown, past {MAX_OUTPUT_VALUES} in all)"


def _writable(value: int) -> bool:
    """An integer Python writes as text (at most ``sys.get_int_max_str_digits()`` digits)."""
    limit = sys.get_int_max_str_digits()
    return not limit or value.bit_length() * math.log10(2) < limit - 1


def _key(value: Any) -> str:
    """A mapping's key as a JSON object's: a string (made storable), else its readable text."""
    return scrub(value) if isinstance(value, str) else _readable(value)


def _readable(value: Any) -> str:
    """Any value as a short text: its ``repr`` cut to :data:`MAX_SHOWN_CHARS` (an integer too
    long to write: its size), or its type when even that fails."""
    if isinstance(value, int) and not _writable(value):
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"(an integer of about {digits} digits: too long to show)"
    try:
        shown_text = repr(value)
    except Exception:  # a broken __repr__: shown by its type
        shown_text = f"<{type(value).__qualname__} object>"
    shown_text = scrub(shown_text)
    if len(shown_text) > MAX_SHOWN_CHARS:
        shown_text = shown_text[: MAX_SHOWN_CHARS - 1] + "…"
    return shown_text
