"""The one validation layer at the public boundary: the Router, the CLI and the tools check
their arguments here before anything reaches the database.

Every check raises a :class:`~agent_router.errors.RefusedError` subclass, so a bad argument gets
the same typed error on SQLite and PostgreSQL and writes nothing. Ids are 64-bit signed integers
(what both databases store); text is UTF-8 without NUL (PostgreSQL cannot store it) and without
lone surrogates (no encoding can); names are plain and printable, so that they cannot imitate an
envelope, hide characters or pass for another name.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from agent_router import errors, formats
from agent_router.domain import LEAD_DISPLAY_NAME, MessageType

#: The largest id both databases store (a signed 64-bit integer).
MAX_ID: Final = 2**63 - 1
#: Epochs and sequence numbers are 32-bit integers in both databases.
MIN_INT32: Final = -(2**31)
MAX_INT32: Final = 2**31 - 1
#: Display names, roles and senders (``job:<name>`` included).
MAX_NAME_CHARS: Final = 200
#: Dedup keys and tool call ids.
MAX_KEY_CHARS: Final = 200
#: System prompts.
MAX_PROMPT_BYTES: Final = 1024 * 1024

#: Senders that are not agents of the team. ``job:<name>`` is a background job.
EXTERNAL_SENDERS: Final = frozenset({"user", "system"})
EXTERNAL_PREFIX: Final = "job:"
#: Names no sub-agent may take, nor anything that reads as one: the router's own senders and
#: the lead's name.
RESERVED_NAMES: Final = (*sorted(EXTERNAL_SENDERS), LEAD_DISPLAY_NAME)

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
        raise unknown(f"unknown {what} {value}")
    return value


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
    if not value.strip() or len(value) > MAX_KEY_CHARS:
        raise errors.InvalidArgumentError(f"{what} must be 1-{MAX_KEY_CHARS} characters")
    if not value.isprintable():
        # Printable as Python means it: no control, format, private-use or unassigned
        # character, and no space but U+0020 (a no-break space reads as one).
        raise errors.InvalidArgumentError(f"{what} holds invisible or control characters")
    return value


def optional_key(value: Any, what: str) -> str | None:
    return None if value is None else key(value, what)


def scrub(value: str) -> str:
    """Text produced by a model or a job made storable without losing it: NUL and lone
    surrogates become U+FFFD (everything else is kept as written)."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
    return value


def runner(value: Any) -> str:
    """A host's turn runner: a Celery task name, or ``name@queue``."""
    if isinstance(value, str):
        task, at, queue = value.partition("@")
        if task and (queue or not at) and len(value) <= 300 and not any(c.isspace() for c in value):
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
