"""Settings of the example chat backend: one PostgreSQL database (the host's tables and the
router's) and one Redis (the Celery broker), both from the environment."""

import os

from sqlalchemy.engine import make_url

# The router's own variable: both share one database, as a real chat backend would.
_db = make_url(os.environ.get("AGENT_ROUTER_DATABASE_URL", "postgresql://root@127.0.0.1/chat"))

SECRET_KEY = os.environ.get("CHAT_SECRET_KEY", "example-only")
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["chat"]
ROOT_URLCONF = "chat.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.database,
        "USER": _db.username or "",
        "PASSWORD": _db.password or "",
        "HOST": _db.host or "",
        "PORT": str(_db.port or ""),
    }
}
CELERY_BROKER_URL = os.environ.get("AGENT_ROUTER_BROKER_URL", "redis://127.0.0.1:6379/0")
#: The host's own queue: its tasks, the lead's turns included.
CHAT_QUEUE = os.environ.get("CHAT_QUEUE", "chat")
#: The model a room's sub-agents run on (kept with the room's team): a model of the
#: OpenAI-compatible server of the AGENT_ROUTER_OPENAI_* settings, or "scripted", the library's
#: scripted model, which needs no server.
CHAT_AGENT_MODEL = os.environ.get("CHAT_AGENT_MODEL", "scripted")
#: The lead's model, as the chat's model client names it.
CHAT_MODEL = os.environ.get("CHAT_MODEL", "gpt-4o")
#: How long one event stream of a room's live page lasts before the browser reconnects.
CHAT_STREAM_SECONDS = float(os.environ.get("CHAT_STREAM_SECONDS", "30"))
