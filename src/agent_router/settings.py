"""Settings, read from keyword arguments or ``AGENT_ROUTER_*`` environment variables."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///agent_router.db"

#: Tokens per million: prices are quoted per million tokens.
_MILLION = 1_000_000


class ModelSpec(BaseModel):
    """One row of the price table (the ``models`` setting): what a model costs per million
    tokens, in US dollars, and how much context it reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(0.0, ge=0, description="US dollars per million prompt tokens.")
    cached_input: float | None = Field(
        None, ge=0, description="US dollars per million cached prompt tokens; unset: `input`."
    )
    output: float = Field(0.0, ge=0, description="US dollars per million completion tokens.")
    context_window: int | None = Field(
        None, gt=0, description="Tokens the model reads; unset: the `context_window` setting."
    )

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """US dollars for one call's tokens (``cached_tokens`` are part of ``prompt_tokens``)."""
        cached_price = self.input if self.cached_input is None else self.cached_input
        fresh = prompt_tokens - cached_tokens
        return (
            fresh * self.input + cached_tokens * cached_price + completion_tokens * self.output
        ) / _MILLION


class Settings(BaseSettings):
    """Every knob of the router. Each field is also read from ``AGENT_ROUTER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="AGENT_ROUTER_", frozen=True, extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite:///path.db (embedded) or postgresql+psycopg://...",
    )
    broker_url: str = Field(
        "memory://",
        description="Celery broker: memory:// runs turns on threads in this process; "
        "redis://host:6379/0 or amqp://... for real workers.",
    )
    redis_url: str | None = Field(
        None,
        description="Redis for wake keys of blocked asks; in-process when unset.",
    )
    max_content_bytes: int = Field(
        64 * 1024, gt=0, description="Largest message content accepted, in UTF-8 bytes."
    )
    max_tool_argument_bytes: int = Field(
        64 * 1024,
        gt=0,
        description="Largest arguments of one tool call a model may write, in UTF-8 bytes. "
        "Larger ones are not kept: the transcript holds their size and head, and the call is "
        "answered with an error the model reads, so that they are never sent back to it (each "
        "later request would spend their tokens again).",
    )
    drain_batch_size: int = Field(
        1000, gt=0, description="Most messages one drain moves into a transcript."
    )
    ask_block_seconds: float = Field(
        30.0,
        gt=0,
        description="How long a blocked ask holds a worker before it suspends, while the agent "
        "asked is at work (its turn holds a worker).",
    )
    ask_grace_seconds: float = Field(
        1.0,
        ge=0,
        description="How long a blocked ask holds a worker while the agent asked is not at work "
        "(idle, or its turn queued): then it suspends, freeing the slot the answerer may need.",
    )
    question_timeout_seconds: float = Field(
        3600.0, gt=0, description="Default deadline of a question; then it resolves `expired`."
    )
    lease_seconds: float = Field(
        10.0,
        gt=0,
        description="A running turn's lease; a turn not renewed by then is taken over (a "
        "worker killed mid-turn: within lease + sweep_seconds). The transitions before and after "
        "each model call renew it, the heartbeat while a model call or a tool runs.",
    )
    heartbeat_seconds: float = Field(
        3.0,
        gt=0,
        description="How often a turn renews its lease while no transition of it has (a model "
        "call or a tool running); less than lease_seconds.",
    )
    sweep_seconds: float = Field(
        5.0, gt=0, description="Period of the sweeper (each worker's timer, and beat's schedule)."
    )
    ledger_retention_days: float | None = Field(
        None,
        gt=0,
        description="Routine ledger events (routes, drains, claims, turn ends that did not "
        "fail, model calls, publishes, answered asks) older than this are deleted, a batch per "
        "sweeper pass and by `agent-router prune`, for teams that stay active too; what "
        "`check` and the sweeper read (stops, failures, refusals, take-overs, quarantines, "
        "drops) is kept. Unset: the ledger of a live team is kept whole.",
    )
    background_batch_seconds: float = Field(
        1.0,
        ge=0,
        description="A background job's completion that wakes a resting agent starts its turn "
        "this much later, so that completions arriving meanwhile share that one turn.",
    )
    runtime_factory: str | None = Field(
        None,
        description="`module:function` that builds a worker's runtime (called with the settings "
        "and the Celery app; returns agent_router.worker.runtime.Runtime): a host's own models, "
        "tools or turn runner, in `agent-router worker` or a host's worker. Unset: each agent's "
        "model and tools are built from these settings (the team's, the role's or "
        "AGENT_ROUTER_OPENAI_MODEL's model; the roles' MCP servers and host functions).",
    )
    sqlite_busy_timeout_seconds: float = Field(
        30.0, gt=0, description="How long a SQLite writer waits for the write lock."
    )
    pool_size: int = Field(10, gt=0, description="Database connection pool size (PostgreSQL).")
    database_prepare: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Whether psycopg may prepare statements on the PostgreSQL server (a "
        "statement run 5 times on a connection is prepared there). off: never, as a pooler "
        "that hands each transaction another server connection needs (PgBouncer in transaction "
        "pooling before 1.22, or without max_prepared_statements); on: always; auto: only on a "
        "connection that reaches PostgreSQL itself, one the server reports the same process id "
        "for as it gave the connection at its start (a pooler gives each client an id of its "
        "own). See docs/deployment.md.",
    )
    max_turn_seconds: float = Field(
        3600.0,
        gt=0,
        description="Longest turn; the Redis broker's visibility_timeout is set above it.",
    )

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        # The short forms hosts and platforms hand out mean the installed psycopg 3 driver.
        for short in ("postgres://", "postgresql://"):
            if value.startswith(short):
                return "postgresql+psycopg://" + value.removeprefix(short)
        if not value.startswith(("sqlite", "postgresql")):
            raise ValueError("database_url must be a sqlite:// or postgresql:// URL")
        return value

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> Settings:
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds:g}) must be less than lease_seconds "
                f"({self.lease_seconds:g}): a turn renews its lease every heartbeat, and one not "
                "renewed within its lease is taken over while it runs"
            )
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    # The Celery runtime.
    queue: str = Field(
        "agent_router",
        min_length=1,
        description="Celery queue that turn tasks are sent to and the standalone worker consumes.",
    )
    max_turn_steps: int = Field(
        50, gt=0, description="Most model calls in one turn; a turn past it fails (runaway guard)."
    )
    work_seconds: float = Field(
        0.2, ge=0, description="How long the built-in `do_work` tool takes (demo and tests)."
    )
    scripted_write_seconds: float = Field(
        1.0,
        ge=0,
        description="How long the ScriptedModel takes to write a sub-agent's final reply (so "
        "that a message can arrive while the last output is being written) or its "
        "answer to another agent's question (so the asker is seen waiting).",
    )
    wake_recheck_seconds: float = Field(
        5.0,
        gt=0,
        description="A blocked ask re-reads the database at least this often, so a lost wake "
        "signal costs at most this long; a feed reader (Router.events) re-reads this often "
        "while the feed signals are down.",
    )

    # The OpenAI-compatible model adapter.
    openai_model: str | None = Field(
        None,
        description="The model of an agent whose team and role name none, sent to the Chat "
        "Completions endpoint (a team's model: Router.create_team(model=...); a role's: `model` "
        "in the roles file). `scripted`: the built-in scripted model (demo, tests). An agent "
        "with no model fails its turn with ModelNotConfiguredError.",
    )
    openai_base_url: str | None = Field(
        None,
        description="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1; "
        "unset: the SDK's default (OPENAI_BASE_URL, else https://api.openai.com/v1).",
    )
    openai_api_key: str | None = Field(
        None,
        # The standard variable is honoured too, so a key already exported for other tools
        # works here; ours wins when both are set.
        validation_alias=AliasChoices(
            "AGENT_ROUTER_OPENAI_API_KEY", "OPENAI_API_KEY", "openai_api_key"
        ),
        repr=False,  # kept out of reprs, logs and tracebacks
        description="API key: AGENT_ROUTER_OPENAI_API_KEY, else OPENAI_API_KEY.",
    )
    openai_timeout_seconds: float = Field(
        120.0, gt=0, description="Timeout of one model request (each retry gets its own)."
    )
    openai_max_retries: int = Field(
        2,
        ge=0,
        description="Retries of a model request on connection errors, timeouts, 408/409/429 "
        "and 5xx, with the SDK's exponential backoff (honouring the server's Retry-After).",
    )
    openai_temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature; unset: the server's default."
    )
    stream_to_user: bool = Field(
        False,
        description="Stream the lead's model calls (OpenAI models): the text of each reply "
        "reaches the team's feed readers and hooks as deltas while it is written, before the "
        "reply is stored whole (deltas are not stored: only readers waiting then see them).",
    )

    # Operations.
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port on which `agent-router worker` serves Prometheus metrics at /metrics; "
        "unset: no metrics endpoint.",
    )

    # Host-owned agents and recovery time.
    runners: dict[str, str] = Field(
        default_factory=dict,
        description="Host-owned roles: role name -> the Celery task (`name` or `name@queue`) "
        'that runs the turns of agents of that role, e.g. {"Team Leader": "chat.lead_turn"}. '
        "Recorded with each agent when it is created (a runner given to create_team or "
        "create_agent, or in the roles file, comes first).",
    )
    worker_sweeper: bool = Field(
        True,
        description="Every `agent-router worker` also runs the sweeper on a timer thread, every "
        "sweep_seconds (not on a worker slot, not through the broker), so that a dead turn is "
        "taken over within lease + sweep period; beat is then optional.",
    )

    # Tools beside the router's own: MCP servers and host functions (docs/tools.md).
    mcp_servers: dict[str, Any] = Field(
        default_factory=dict,
        description="MCP servers given to every sub-agent role that lists none of its own: a JSON "
        'object of name -> command line, URL, or table (e.g. {"time": "mcp-server-time", '
        '"notes": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": '
        '"Bearer ${NOTES_TOKEN}"}}}).',
    )
    host_tools: str | None = Field(
        None,
        description="Comma-separated modules each worker imports; the functions they register "
        "with @host_tool become tools.",
    )
    mcp_call_timeout_seconds: float = Field(
        60.0, gt=0, description="Timeout of one MCP tool call; past it the model reads an error."
    )
    mcp_connect_timeout_seconds: float = Field(
        20.0, gt=0, description="Timeout of starting or connecting to an MCP server."
    )

    # Fields below were added for observability: log lines, metrics and traces.
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines of `agent-router worker`, `beat` and the CLI: text (the message "
        "followed by its team, agent, outcome and ids as key=value) or json (one object a line).",
    )
    metrics_address: str = Field(
        "127.0.0.1",
        description="Address the Prometheus endpoint (metrics_port) listens on; 0.0.0.0 for a "
        "scraper on another host.",
    )
    metrics_cluster_gauges: bool = Field(
        False,
        description="Also serve the cluster-wide gauges read from the database (mailbox depth, "
        "agents by state, oldest pending message, open questions, unpublished outbox) from this "
        "worker. They read the same from every process: serve them from one, this way or with "
        "`agent-router metrics`.",
    )
    tracing: bool = Field(
        False,
        description="Record OpenTelemetry spans per route, per turn and per model call and "
        "tool call of a turn in workers (needs the "
        "`otel` extra; spans go to the process's tracer provider, e.g. set up by "
        "opentelemetry-instrument and the OTEL_* variables).",
    )

    # Fields below were added for usage, budgets and context management.
    models: dict[str, ModelSpec] = Field(
        default_factory=dict,
        description="Price table and context windows per model name, as JSON: "
        '{"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6, '
        '"context_window": 128000}} (US dollars per million tokens). A model not listed costs '
        "0 and gets the `context_window` setting.",
    )
    context_window: int = Field(
        128_000,
        gt=0,
        description="Tokens a model reads, for models without their own `context_window` (in "
        "`models` or the role): a hard limit. A longer request is compacted, and an oversize "
        "tool result or message still over it (the newest included) is cut in the middle in "
        "the request, never in the transcript, so that no request is sent over it less "
        "`context_reserve_tokens`.",
    )
    context_target_tokens: int | None = Field(
        32_000,
        gt=0,
        description="Tokens a request of the built-in loop is kept near: past it the oldest "
        "messages are left out of the request (never out of the transcript), so a long-lived "
        "agent's requests stop growing; the system prompt, the first task, the questions still "
        "open and the latest messages stay. A role's `context_target_tokens` overrides it; "
        "unset: requests grow up to the model's window.",
    )
    transcript_cache_agents: int = Field(
        256,
        gt=0,
        description="Agents whose request window a process keeps in memory (the most recently "
        "used), so that a model call reads only the entries appended since. A window holds "
        "what its requests hold (up to `context_target_tokens`); an agent let go is read again "
        "at its next turn's first call from where its window last stood, so its cost stays "
        "that of one request. A host loop's `Turn.history()` keeps whole transcripts here too "
        "(about 0.7 MB per 1,000 entries of a few hundred characters).",
    )
    transcript_cache_entries: int = Field(
        50_000,
        gt=0,
        description="Transcript entries a process keeps in memory in all (those its windows "
        "hold and whole transcripts read), whatever the agents: the least recently used agents "
        "are let go past it (the most recent one is kept whatever its length), so a worker's "
        "memory stays bounded (about 35 MB at entries of a few hundred characters).",
    )
    transcript_cache_bytes: int = Field(
        64 * 2**20,
        gt=0,
        description="Bytes of transcript entries a process keeps in memory in all (64 MiB by "
        "default; as Python holds them, each entry counted once as it is read or taken into a "
        "request window): the least recently used agents are let go past it (the most recent "
        "one is kept whatever its size), so a worker's memory stays bounded whatever the size "
        "of the entries (a tool result of megabytes counts as such, not as one entry).",
    )
    context_reserve_tokens: int = Field(
        4096,
        ge=0,
        description="Tokens of the window kept free for the model's reply (at most a quarter "
        "of the window).",
    )
    budget_model_calls: int | None = Field(
        1000,
        gt=0,
        description="A new team's budget of model calls (all its agents, retries and reminders "
        "included); unset: unlimited. Per team: `create_team(budget=...)`, `agent-router budget`.",
    )
    budget_turns: int | None = Field(
        1000, gt=0, description="A new team's budget of turns started; unset: unlimited."
    )
    budget_tokens: int | None = Field(
        5_000_000,
        gt=0,
        description="A new team's budget of prompt + completion tokens; unset: unlimited.",
    )
    budget_cost_usd: float | None = Field(
        10.0,
        gt=0,
        description="A new team's budget in US dollars, by the `models` price table (a model "
        "it does not list counts as $0, which each process logs once per model); unset: "
        "unlimited.",
    )
    budget_wall_seconds: float | None = Field(
        6 * 3600.0,
        gt=0,
        description="A new team's budget of wall time from its creation, in seconds; unset: "
        "unlimited.",
    )
    budget_sub_agents_created: int | None = Field(
        20, gt=0, description="Most sub-agents a new team may create; unset: unlimited."
    )
    budget_sub_agents_active: int | None = Field(
        8,
        gt=0,
        description="Most sub-agents of a new team not terminated at one time; unset: unlimited.",
    )
    budget_warning_ratio: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Share of a budget after which the team's agents get one notice to wrap up.",
    )
    web_token: str | None = Field(
        None,
        description="Token that `agent-router web` asks of every request (Authorization: "
        "Bearer, or a cookie set by opening /?token=... once); required when it listens on "
        "anything but loopback. At least 16 characters, e.g. from "
        "`python -c 'import secrets; print(secrets.token_urlsafe())'`.",
    )
    web_hosts: str | None = Field(
        None,
        description="Comma-separated host names `agent-router web` answers to besides "
        "127.0.0.1, localhost and [::1] (and the address it listens on): the Host header of "
        "any other request is refused, so that a page of another site cannot read the UI "
        "through DNS rebinding.",
    )
    web_threads: int = Field(
        8,
        gt=0,
        le=256,
        description="Threads of `agent-router web` that answer requests. Connections are "
        "read whole before a thread takes them: slow or idle ones hold no thread.",
    )
    web_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="`agent-router web` closes a connection idle for this long, and one whose "
        "request's headers have not all arrived this long after its first byte (or whose body "
        "has not, this long after its headers), however slowly the bytes trickle in.",
    )
