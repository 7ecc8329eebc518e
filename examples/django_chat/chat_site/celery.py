"""The chat backend's Celery app, as it was before agent-router, plus one line: ``install``."""

import os

from celery import Celery

from agent_router.worker import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chat_site.settings")

app = Celery("chat_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_routes = {"chat.*": {"queue": os.environ.get("CHAT_QUEUE", "chat")}}
app.autodiscover_tasks()
install(app)  # the router's tasks, route, beat entry and sweeper; nothing of ours changes
