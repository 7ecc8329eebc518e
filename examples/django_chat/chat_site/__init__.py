"""A small Django + Celery chat backend that adopted agent-router (its Celery app is loaded with
Django, as Celery's Django guide does it)."""

from chat_site.celery import app as celery_app

__all__ = ["celery_app"]
