"""The Celery runtime: the app, the turn task, task events, metrics, the sweeper bootstep."""
