"""Wake signals for a team's feed (:meth:`Router.events`): a reader that found nothing new
waits on its team's signal, not on the database, so a quiet team costs no statement while it
waits. Redis pub/sub in production (any process's commit reaches any process's reader), a
condition variable in the embedded mode. A reader starts listening before it reads, so a
signal sent between its read and its wait is not missed; a lost signal costs at most the rest
of the wait, never an event: the next read finds it.

Redis being down never slows the send path: after a failed publish or subscribe, the process
tries Redis again only once per backoff period (:class:`Outage`: 1 s, doubling, at most 30 s),
publishing nothing and logging one warning for the whole outage; the first call that reaches
Redis again ends it. A reader that cannot listen re-reads the database on a timer instead.

The same channel carries the pieces of a reply being written (deltas): published, never stored,
they reach only the readers listening at that moment.

A channel is named by the database's installation id and the team's id
(:func:`~agent_router.constants.feed_channel`): Redis pub/sub ignores the database number, so
deployments sharing a Redis server would otherwise hear each other's teams, reply text
included."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent_router import errors
from agent_router.constants import feed_channel
from agent_router.logfields import get_logger

if TYPE_CHECKING:
    import redis

logger = get_logger(__name__)


@dataclass(frozen=True)
class Wake:
    """What woke a reader: ``committed`` when something new was committed to the feed, and
    the pieces of replies being written (``deltas``, each a JSON-ready mapping) that came."""

    committed: bool
    deltas: tuple[Mapping[str, Any], ...] = ()


class Listener(Protocol):
    @property
    def live(self) -> bool:
        """Whether signals reach this listener; when not, its reader re-reads on a timer."""

    def wait(self, timeout: float) -> Wake | None:
        """Block up to ``timeout`` seconds; what came since listening began, or ``None``
        (returned at once, :attr:`live` turned false, when the signals break while it waits)."""


class TeamSignals(Protocol):
    def notify(self, team_id: int) -> None:
        """Something new is in the team's feed (sent after the commit that wrote it)."""

    def say(self, team_id: int, delta: Mapping[str, Any]) -> None:
        """A piece of a reply being written, for the team's readers waiting now (not kept)."""

    def listen(self, team_id: int) -> Any:
        """A context manager giving a :class:`Listener` for the team's signals from now on."""


class _Mailbox:
    def __init__(self, signals: InProcessSignals) -> None:
        self._signals = signals
        self.committed = False
        self.deltas: list[Mapping[str, Any]] = []

    @property
    def live(self) -> bool:
        return True

    def wait(self, timeout: float) -> Wake | None:
        return self._signals.wait_on(self, timeout)


class InProcessSignals:
    """A mailbox per listener under one condition: a notification marks its team's, a delta
    is added to them; a listener waits for its own to fill."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._listeners: dict[int, set[_Mailbox]] = {}

    def notify(self, team_id: int) -> None:
        with self._condition:
            for box in self._listeners.get(team_id, ()):
                box.committed = True
            self._condition.notify_all()

    def say(self, team_id: int, delta: Mapping[str, Any]) -> None:
        with self._condition:
            for box in self._listeners.get(team_id, ()):
                box.deltas.append(delta)
            self._condition.notify_all()

    def wait_on(self, box: _Mailbox, timeout: float) -> Wake | None:
        with self._condition:
            if not self._condition.wait_for(
                lambda: box.committed or bool(box.deltas), timeout=max(timeout, 0.0)
            ):
                return None
            wake = Wake(committed=box.committed, deltas=tuple(box.deltas))
            box.committed, box.deltas = False, []
            return wake

    @contextmanager
    def listen(self, team_id: int) -> Iterator[Listener]:
        box = _Mailbox(self)
        with self._condition:
            self._listeners.setdefault(team_id, set()).add(box)
        try:
            yield box
        finally:
            with self._condition:
                self._listeners[team_id].discard(box)
                if not self._listeners[team_id]:
                    del self._listeners[team_id]


#: What a notification publishes; a delta is published as its JSON object.
_COMMITTED = b"1"


class _Subscribed:
    def __init__(self, pubsub: Any, error: type[Exception], outage: Outage, live: bool) -> None:
        self._pubsub = pubsub
        self._error = error
        self._outage = outage
        self._live = live

    @property
    def live(self) -> bool:
        return self._live

    def wait(self, timeout: float) -> Wake | None:
        if not self._live:
            return None
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                message = self._pubsub.get_message(timeout=left)
                if message is not None and message.get("type") == "message":
                    return self._drained(message["data"])
        except self._error as exc:
            self._live = False
            self._outage.failed(exc)
        return None

    def _drained(self, data: bytes) -> Wake:
        """The first message and those already queued behind it, up to a notification."""
        deltas: list[Mapping[str, Any]] = []
        while data != _COMMITTED:
            deltas.append(json.loads(data))
            message = self._pubsub.get_message(timeout=0.0)
            if message is None or message.get("type") != "message":
                return Wake(committed=False, deltas=tuple(deltas))
            data = message["data"]
        return Wake(committed=True, deltas=tuple(deltas))


class Outage:
    """When to try Redis again after it failed: not before ``first`` seconds, then twice as
    long after each further failure, at most ``longest``. Between tries nothing reaches for
    Redis, so while it is down a process costs one connect attempt per period, however many
    messages it routes. Once a period is over, one caller makes the next try (the others
    still skip), and the first success ends the outage. One warning when an outage begins,
    one line when it ends."""

    def __init__(self, *, first: float = 1.0, longest: float = 30.0) -> None:
        self._first, self._longest = first, longest
        self._lock = threading.Lock()
        self._down = False
        self._period = first
        self._retry_at = 0.0
        #: Connect attempts refused so far (each outage's first failure and every failed try).
        self.failures = 0

    def may_try(self) -> bool:
        """Whether to reach for Redis now; a caller told yes owns the period's one try."""
        with self._lock:
            if not self._down:
                return True
            now = time.monotonic()
            if now < self._retry_at:
                return False
            self._retry_at = now + self._period  # the others skip while this one tries
            return True

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            if self._down:
                self._period = min(self._period * 2, self._longest)
            else:
                self._down, self._period = True, self._first
                logger.warning(
                    "feed signals unavailable; readers re-read the database until Redis is back",
                    extra={"action": "feed_signals_down", "error": repr(exc)},
                )
            self._retry_at = time.monotonic() + self._period

    def succeeded(self) -> None:
        if not self._down:  # the common case, without the lock
            return
        with self._lock:
            if self._down:
                self._down, self._period = False, self._first
                logger.info("feed signals back", extra={"action": "feed_signals_up"})


class RedisSignals:
    """``PUBLISH`` on ``agent_router:feed:<installation>:<team>`` to notify; a reader
    ``SUBSCRIBE``s before it reads (the subscription is confirmed before the read), then waits
    for a message. Calls share one :class:`Outage`: a publish or subscribe failing skips the
    next ones for its backoff period, and a call is never retried (a signal is best effort).

    ``installation`` gives the database's installation id (the store's ``installation_id``,
    read once and kept), called at the first publish or listen: a reader and a publisher of one
    database compute the same channel, those of another database another."""

    def __init__(
        self, url: str, *, installation: Callable[[], str], outage: Outage | None = None
    ) -> None:
        import redis  # here, not at the top: a process without a feed reader never loads it
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._client: redis.Redis = redis.Redis.from_url(
            url, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0)
        )
        self._error: type[Exception] = redis.RedisError
        self._installation = installation
        self.outage = outage or Outage()

    def channel(self, team_id: int) -> str:
        """The team's channel (raises the store's error if the installation id cannot be
        read)."""
        return feed_channel(self._installation(), team_id)

    def notify(self, team_id: int) -> None:
        self._publish(team_id, _COMMITTED)

    def say(self, team_id: int, delta: Mapping[str, Any]) -> None:
        self._publish(team_id, json.dumps(delta, ensure_ascii=False))

    def _publish(self, team_id: int, data: bytes | str) -> None:
        """Nothing is lost by a skipped or failed publish: a waiting reader's next read finds
        the event (a delta's reply reaches it whole when stored)."""
        if not self.outage.may_try():
            return
        try:
            channel = self.channel(team_id)
        except errors.AgentRouterError as exc:  # the database, not Redis: no outage
            logger.warning(
                "feed signal not sent: no installation id",
                extra={"action": "feed_signal_skipped", "team_id": team_id, "error": repr(exc)},
            )
            return
        try:
            self._client.publish(channel, data)
        except self._error as exc:
            self.outage.failed(exc)
        else:
            self.outage.succeeded()

    @contextmanager
    def listen(self, team_id: int) -> Iterator[Listener]:
        pubsub = self._client.pubsub(ignore_subscribe_messages=False)
        live = False
        try:
            channel = self.channel(team_id)
        except errors.AgentRouterError:
            # The database, not Redis: this reader re-reads it on the timer (and finds out).
            channel = None
        try:
            if channel is not None and self.outage.may_try():
                try:
                    pubsub.subscribe(channel)
                    # The confirmation: from here on no signal of the team is missed.
                    pubsub.get_message(timeout=2.0)
                except self._error as exc:
                    self.outage.failed(exc)
                else:
                    live = True
                    self.outage.succeeded()
            yield _Subscribed(pubsub, self._error, self.outage, live)
        finally:
            with suppress(self._error):
                pubsub.close()

    def close(self) -> None:
        self._client.close()
