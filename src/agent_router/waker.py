"""Wake signals for blocked asks: a per-question Redis list in production, an in-process event in
the embedded mode. A signal is sent only after the transaction that ended the wait committed,
and carries its question's token (:func:`~agent_router.constants.wake_token`): a waiter that
pops its own token is done without reading the database; one that pops another (left by another
database sharing Redis) re-reads it. A lost signal costs a periodic re-read, never an answer.
A Router's Redis waker names its lists by the database's installation id as well, so another
database's signals do not even reach it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from agent_router.constants import wake_key
from agent_router.logfields import get_logger

if TYPE_CHECKING:
    import redis

logger = get_logger(__name__)


class Waker(Protocol):
    def notify(self, question_id: int, token: str) -> None:
        """Tell the asker blocked on ``question_id`` that its wait is over (sent after the
        commit that ended it); ``token``: the question's wake token."""

    def wait(self, question_id: int, timeout: float, token: str) -> bool:
        """Block up to ``timeout`` seconds for a notification; ``True`` only if one carrying
        ``token`` came."""

    def forget(self, question_id: int) -> None:
        """Drop any notification left for ``question_id`` (the wait is over)."""


class InProcessWaker:
    """Events keyed by question id. A notification sent before the wait starts is kept, so the
    order of notify and wait does not matter. Bounded: the oldest unclaimed events are dropped
    (their waiters, if any, fall back to re-reading the database)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._events: OrderedDict[int, threading.Event] = OrderedDict()
        self._tokens: dict[int, str] = {}
        self._capacity = capacity

    def _event(self, question_id: int) -> threading.Event:
        with self._lock:
            event = self._events.get(question_id)
            if event is None:
                event = self._events[question_id] = threading.Event()
                while len(self._events) > self._capacity:
                    dropped, _ = self._events.popitem(last=False)
                    self._tokens.pop(dropped, None)
            return event

    def notify(self, question_id: int, token: str) -> None:
        event = self._event(question_id)
        with self._lock:
            self._tokens[question_id] = token
        event.set()

    def wait(self, question_id: int, timeout: float, token: str) -> bool:
        event = self._event(question_id)
        if not event.wait(timeout):
            return False
        with self._lock:
            if self._tokens.get(question_id) == token:
                return True
            # Another's signal: consumed, so that the next wait blocks again.
            event.clear()
            self._tokens.pop(question_id, None)
            return False

    def forget(self, question_id: int) -> None:
        with self._lock:
            self._events.pop(question_id, None)
            self._tokens.pop(question_id, None)


class RedisWaker:
    """``RPUSH`` + ``EXPIRE`` to notify, ``BLPOP`` to wait, on
    ``agent_router:wake:<installation>:<id>`` (:func:`~agent_router.constants.wake_key`;
    ``installation`` gives the database's installation id, called at the first use and kept;
    a waker without one uses ``agent_router:wake:<id>``). The list outlives a notify sent
    before the waiter blocks; the expiry cleans up after nobody waits.

    Redis being down never fails an ask: a notify that cannot be sent is dropped (the waiter
    re-reads the database every ``wake_recheck_seconds``), and a wait that cannot reach Redis
    sleeps out its timeout instead, so the caller's loop falls back to re-reading the
    database.

    A ``BLPOP`` blocks at most ``max_block_seconds`` (the Router's ``wake_recheck_seconds``)
    and the socket waits 5 s longer, so a quiet wait is never a socket timeout. The wakers of a
    process share one connection pool per URL."""

    def __init__(
        self,
        url: str,
        *,
        ttl_seconds: int = 24 * 3600,
        max_block_seconds: float = 5.0,
        installation: Callable[[], str] | None = None,
    ) -> None:
        import redis  # here, not at the top: a process that never waits on Redis never loads it

        # One BLPOP never blocks longer than this; the socket waits longer still (see
        # _shared_pool), so a quiet wait ends by BLPOP's own timeout, never the socket's.
        self._max_block = max_block_seconds
        self._pool_key = (url, _socket_timeout(max_block_seconds))
        self._client: redis.Redis = redis.Redis(connection_pool=_shared_pool(*self._pool_key))
        self._redis_error: type[Exception] = redis.RedisError
        self._ttl = ttl_seconds
        self._installation = installation
        # Questions whose last wait popped a signal: the pop emptied their list (Redis deletes
        # an empty list), so forgetting them needs no round trip.
        self._popped: set[int] = set()
        self._popped_lock = threading.Lock()
        self._closed = False

    def key(self, question_id: int) -> str:
        """The question's list (raises the store's error if the installation id cannot be
        read)."""
        return wake_key(question_id, self._installation() if self._installation else None)

    def notify(self, question_id: int, token: str) -> None:
        key = self.key(question_id)
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.rpush(key, token)
                pipe.expire(key, self._ttl)
                pipe.execute()
        except self._redis_error as exc:
            logger.warning(
                "wake signal not sent; the waiter re-reads the database",
                extra={"action": "wake_failed", "question_id": question_id, "error": repr(exc)},
            )

    def wait(self, question_id: int, timeout: float, token: str) -> bool:
        started = time.monotonic()
        try:
            # BLPOP takes whole or fractional seconds; 0 would mean forever.
            block = min(max(timeout, 0.01), self._max_block)
            found = self._client.blpop([self.key(question_id)], timeout=block)
        except self._redis_error as exc:
            logger.warning(
                "wake signals unavailable; re-reading the database instead",
                extra={"action": "wake_fallback", "question_id": question_id, "error": repr(exc)},
            )
            time.sleep(max(0.0, timeout - (time.monotonic() - started)))
            return False
        with self._popped_lock:
            if found is not None:
                self._popped.add(question_id)
            else:
                self._popped.discard(question_id)
        if found is None:
            return False
        value = found[1]
        return (value.decode() if isinstance(value, bytes) else value) == token

    def forget(self, question_id: int) -> None:
        with self._popped_lock:
            if question_id in self._popped:
                # Its signal was popped: nothing is left but a duplicate notify, if any, which
                # expires on its own.
                self._popped.discard(question_id)
                return
        with contextlib.suppress(self._redis_error):  # the key expires on its own
            self._client.delete(self.key(question_id))

    def close(self) -> None:
        """Let go of the process's pool for this URL; the last waker to close disconnects it."""
        if not self._closed:
            self._closed = True
            _release_pool(*self._pool_key)


#: How much longer than its longest BLPOP a wake connection's socket waits for a reply: the
#: server answers a BLPOP that timed out at once, so a reply later than this is a dead link.
SOCKET_TIMEOUT_MARGIN_SECONDS = 5.0


def _socket_timeout(max_block_seconds: float) -> float:
    return max_block_seconds + SOCKET_TIMEOUT_MARGIN_SECONDS


class _Pools:
    """The process's Redis connection pools for wake signals, one per URL and socket timeout,
    shared by every waker (and so every Router and thread) of the process: a connection is
    held only while a call uses it, so the process holds at most as many as it has concurrent
    waits, however many waits and Routers come and go. redis-py's pool notices a fork and
    opens new connections in the child."""

    lock = threading.Lock()
    pools: dict[tuple[str, float], tuple[redis.ConnectionPool, int]] = {}  # pool, users


def _shared_pool(url: str, socket_timeout: float) -> redis.ConnectionPool:
    import redis

    with _Pools.lock:
        pool, users = _Pools.pools.get((url, socket_timeout), (None, 0))
        if pool is None:
            pool = redis.ConnectionPool.from_url(
                url,
                socket_keepalive=True,
                health_check_interval=30,
                socket_connect_timeout=2.0,
                socket_timeout=socket_timeout,
            )
        _Pools.pools[(url, socket_timeout)] = (pool, users + 1)
        return pool


def _release_pool(url: str, socket_timeout: float) -> None:
    with _Pools.lock:
        pool, users = _Pools.pools[(url, socket_timeout)]
        if users > 1:
            _Pools.pools[(url, socket_timeout)] = (pool, users - 1)
            return
        del _Pools.pools[(url, socket_timeout)]
    pool.disconnect()
