"""A chat backend's task that receives a team's messages to the user, as its own Celery app
runs it (``celery -A tests.support.user_tasks worker``), and drops a repeat by the message's
id. Each delivery it gets is listed in Redis under ``USER_TASK_KEY``: ``:attempts`` (every
delivery), ``:seen`` (the ids it took) and ``:received`` (the messages it took, once each).
With ``USER_TASK_STALL`` set, the first delivery of each message stalls, so that a test can
kill the worker while it holds one."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

app = Celery("user_tasks", broker=os.environ.get("USER_TASK_BROKER_URL", "memory://"))
# The message is acknowledged when the task returns: one a killed worker held goes back to the
# queue for the next worker.
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["USER_TASK_REDIS_URL"])


@app.task(name="chat.user_message")
def user_message(message: dict[str, Any]) -> str:
    key = os.environ["USER_TASK_KEY"]
    store = _redis()
    attempt = store.rpush(f"{key}:attempts", message["id"])
    if os.environ.get("USER_TASK_STALL") and attempt == 1:
        time.sleep(600)  # killed here
    if not store.sadd(f"{key}:seen", message["id"]):
        return "repeat"  # delivered before: dropped by its id
    store.rpush(f"{key}:received", json.dumps(message))
    return "taken"
