"""The Celery tasks: one per handler of `app.handlers`, registered under its full name with
its kind's delivery rules (`tasks.base.register`). No task has a body of its own."""

from __future__ import annotations

from celery import Task

from app.handlers import HANDLERS
from tasks.base import register

TASKS: dict[str, Task] = {name: register(handler) for name, handler in HANDLERS.items()}
