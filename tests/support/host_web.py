"""A chat backend as a host writes it, for ``celery -A tests.support.host_web worker`` and for its
web process (:func:`application`, a WSGI app): its broker and result backend from
``CHAT_BROKER_URL``, its own route (``chat.*`` to ``CHAT_QUEUE``), a task of its own, and the
router wired in with ``install`` whatever the ``AGENT_ROUTER_*`` variables say."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from celery import Celery

from agent_router.worker import install

app = Celery(
    "chat_web", broker=os.environ["CHAT_BROKER_URL"], backend=os.environ["CHAT_BROKER_URL"]
)
app.conf.task_routes = {"chat.*": {"queue": os.environ.get("CHAT_QUEUE", "chat")}}
install(app)


@app.task(name="chat.shout")
def shout(text: str) -> str:
    return text.upper()


def application(
    environ: dict[str, Any], start_response: Callable[[str, list[tuple[str, str]]], Any]
) -> Iterable[bytes]:
    """``GET /shout?text=hi`` answers ``HI``, computed by the host's worker."""
    text = parse_qs(environ.get("QUERY_STRING", "")).get("text", [""])[0]
    body = str(shout.delay(text).get(timeout=30)).encode()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]
