"""Keep a worker process running: ``agent-router worker`` runs the Celery worker as a child and
starts it again when it dies (a broker restart can make a Celery worker exit with an
unrecoverable error instead of reconnecting). SIGTERM and SIGINT are passed on to the child, and
a child that exits after one of them, or with status 0, is not restarted. On Linux a supervisor
that dies, even by SIGKILL, takes its child with it: the kernel sends the child SIGTERM (a warm
shutdown), so no worker is left running unsupervised."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType

logger = logging.getLogger(__name__)

#: Seconds before a restart: doubles after each quick death, back to the first after a long run.
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
#: A child that ran this long before dying is restarted after FIRST_BACKOFF again.
STABLE_SECONDS = 60.0


def supervise(command: Sequence[str]) -> int:
    """Run ``command`` until it exits cleanly or is told to stop; returns its exit status."""
    stopping: list[int] = []
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    backoff = FIRST_BACKOFF
    try:
        while True:
            started = time.monotonic()
            # The supervisor runs no other thread, so preexec_fn is safe here.
            child = subprocess.Popen(list(command), preexec_fn=_die_with(os.getpid()))  # noqa: PLW1509
            status = _wait(child)
            if stopping or status == 0:
                return status
            if time.monotonic() - started >= STABLE_SECONDS:
                backoff = FIRST_BACKOFF
            logger.warning(
                "worker exited; starting it again",
                extra={"action": "worker_restart", "status": status, "backoff": backoff},
            )
            print(f"agent-router: worker exited with {status}; restarting in {backoff:g} s",
                  flush=True)  # fmt: skip
            deadline = time.monotonic() + backoff
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.1)
            if stopping:
                return status
            backoff = min(backoff * 2, MAX_BACKOFF)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


#: prctl(2): the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> Callable[[], None] | None:
    """What the child runs before exec: ask for SIGTERM when ``parent`` dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None

    def set_death_signal() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request was in place
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


def _wait(child: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return child.wait()
        except InterruptedError:  # a forwarded signal interrupted the wait
            continue
