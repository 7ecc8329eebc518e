"""One root exception; each subclass's docstring is its default message."""

from __future__ import annotations

from typing import Any


class AgentRouterError(Exception):
    """An agent-router operation failed. A refusal of the store carries its ``code`` and the
    ``fields`` its message was rendered from (``agent_router.store.refusals``)."""

    code: str | None = None
    fields: dict[str, Any] = {}  # replaced on a refusal, never changed in place

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(AgentRouterError):
    """Raised when settings are invalid or incomplete."""


class ModelNotConfiguredError(ConfigurationError):
    """Raised when a turn's agent has no model in this process: neither its team, nor its
    role, nor ``AGENT_ROUTER_OPENAI_MODEL`` names one. The turn fails with this as its reason;
    it never gets a reply."""


class RouterDisabledError(ConfigurationError):
    """Raised by the router's tasks in a host process whose ``AGENT_ROUTER_*`` settings are
    invalid or incomplete: ``agent_router.worker.install`` left the router off there, and the
    message names the setting and what it accepts."""


class StoreError(AgentRouterError):
    """Raised when the database failed; the transaction rolled back and wrote nothing.

    Not a :class:`RefusedError`: the input may be fine and the same call may succeed later.
    Every driver error (SQLAlchemy, psycopg, sqlite3) leaves the store as this or a subclass."""

    def __init__(self, message: str | None = None, *, retryable: bool = False) -> None:
        super().__init__(message)
        # The connection was lost before COMMIT: nothing was written, running the same
        # transaction again is safe (the store does so itself a few times first).
        self.retryable = retryable

    @property
    def transient(self) -> bool:
        """The database was out of reach (the connection was lost before or while committing),
        not a refusal: the same call can succeed once it is back. A turn that meets one is
        left to recovery (its lease lapses, the sweeper takes it over and the new turn reads
        what did commit) rather than failed."""
        return self.retryable or isinstance(self, CommitUnknownError)


class CommitUnknownError(StoreError):
    """Raised when the connection was lost while committing: the write may or may not have
    committed. Retry with the same dedup key (a send) or read back before repeating."""


class RefusedError(AgentRouterError):
    """Raised when input is refused; nothing but a ledger event was written."""


class UnknownTeamError(RefusedError):
    """Raised when a team id does not exist."""


class UnknownAgentError(RefusedError):
    """Raised when no agent of that display name or id exists in the team."""


class UnknownMessageError(RefusedError):
    """Raised when a message id does not exist."""


class UnknownTurnError(RefusedError):
    """Raised when a turn id does not exist (in that team)."""


class AgentTerminatedError(RefusedError):
    """Raised when the target agent is terminated and takes no more messages."""


class InvalidMessageError(RefusedError):
    """Raised when a message is malformed (empty content, wrong type, bad flags)."""


class InvalidArgumentError(InvalidMessageError):
    """Raised when an argument has the wrong type, is out of range, or holds refused text
    (NUL, lone surrogates, control or invisible characters, too long)."""


class InvalidNameError(InvalidArgumentError):
    """Raised when a name (display name, role, sender, ``job:<name>``) is not a plain,
    printable, normalised name."""


class ReservedNameError(InvalidNameError):
    """Raised when a display name is, or reads as, a name the router gives its own senders
    (``user``, ``system``, ``job:<name>``, the Team Leader's): in any case or spacing, with
    look-alike letters."""


class ContentTooLargeError(InvalidMessageError):
    """Raised when message content exceeds the configured limit."""


class UnknownRoleError(RefusedError):
    """Raised when a role is not in the roles catalogue; ``roles`` are the ones it has."""

    def __init__(self, message: str | None = None, *, roles: list[str] | None = None) -> None:
        super().__init__(message)
        self.roles = list(roles or [])  # the catalogue's sub-agent roles


class DedupConflictError(RefusedError):
    """Raised when a dedup key already named a different message to the same agent (other
    content, sender or type): a retry must resend exactly what it sent."""


class DuplicateDisplayNameError(RefusedError):
    """Raised when a display name is already taken in the team."""


class QuestionError(RefusedError):
    """Raised when an answer does not fit a question."""


class UnknownQuestionError(QuestionError):
    """Raised when the question id does not exist in the team."""


class QuestionClosedError(QuestionError):
    """Raised when the question was already answered, expired or cancelled."""


class WrongQuestionError(QuestionError):
    """Raised when the answer is not addressed to the agent that asked the question."""


class AskRefusedError(RefusedError):
    """Raised when an ask would deadlock: it asks oneself, closes a waits-for cycle, or targets a
    terminated agent."""

    def __init__(self, message: str | None = None, *, cycle: list[str] | None = None) -> None:
        super().__init__(message)
        self.cycle = cycle or []


class OwedRowsError(RefusedError):
    """Raised when a team to delete still holds what is owed to someone (undelivered mail, open
    questions, a budget it waits to have raised, unpublished outbox rows, a turn at work) and
    dropping it was not asked for (``include_undelivered``): nothing is deleted."""

    def __init__(self, message: str | None = None, *, owed: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.owed = owed or {}  # kind -> rows


class BudgetExhaustedError(RefusedError):
    """Raised when a team budget is spent: nothing more of that kind may start."""

    def __init__(self, message: str | None = None, *, budget: str | None = None) -> None:
        super().__init__(message)
        self.budget = budget  # the BudgetName value that is spent


class TurnError(AgentRouterError):
    """Raised when a turn operation cannot proceed."""


class HostOwnedTurnError(TurnError):
    """Raised when the built-in loop is handed a turn of an agent whose turns a host's task runs:
    nothing is claimed, and the turn belongs to ``runner``."""

    def __init__(self, message: str | None = None, *, runner: str) -> None:
        super().__init__(message or f"the turns of this agent run in the host's task {runner!r}")
        self.runner = runner


class StaleTurnError(TurnError):
    """Raised when a turn's epoch was superseded: it can drain, append and end nothing."""


class ToolCallsPendingError(TurnError):
    """Raised when the transcript ends in assistant tool calls that still lack results."""


class InvalidTranscriptEntryError(TurnError):
    """Raised when an assistant message or tool result is malformed."""


class ModelError(AgentRouterError):
    """Raised when a model call failed: the server refused it, kept failing, or was unreachable."""

    def __init__(
        self, message: str | None = None, *, status_code: int | None = None, transient: bool = False
    ) -> None:
        super().__init__(message)
        self.status_code = status_code  # the HTTP status, when the server answered
        # The client's own retries are spent, yet the cause may pass (timeout, connection
        # error, 408/409/429/5xx): a Celery task may retry the turn later.
        self.transient = transient


class MalformedModelResponseError(ModelError):
    """Raised when a model's response does not fit the Chat Completions protocol."""


class ContextLengthExceededError(ModelError):
    """Raised when the server refused a request as longer than the model's context window."""
