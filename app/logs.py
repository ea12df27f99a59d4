"""Logging for every process: plain lines for a terminal, JSON lines for a log pipeline.

Use cases log with `extra={"net": ..., "job": ..., "reason": ...}`; the JSON formatter puts
those keys next to the standard fields, so a log query can filter on a net or a job. A line
written while a Celery task runs also carries `task_id` and `task_name`, the keys Celery
Flower shows, so a line leads to its task there and a task to its lines. A redacting filter
on the handler masks the configured secrets wherever they would appear.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from app import names
from app.errors import SettingsError
from app.redact import redact_text, secret_parameter
from app.settings import Settings

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_FIELDS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
    # uvicorn's ANSI-coloured copy of the message: noise in a log pipeline.
    | {"color_message"}
)
# Extra keys whose values are never logged, whatever the code passes.
_SECRET_KEY_PARTS = ("secret", "password", "passwd", "api_key", "apikey", "token", "authorization")
MASK = "***"


def _is_secret_key(key: str) -> bool:
    lowered = key.lower()
    # submit_token is a job id with an attempt number, not a credential.
    return lowered != "submit_token" and any(part in lowered for part in _SECRET_KEY_PARTS)


class RedactingFilter(logging.Filter):
    """Masks known secret values and URL passwords in the message and in extra fields."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return redact_text(text)

    def filter(self, record: logging.LogRecord) -> bool:
        # Render the message once, with its arguments, so a secret passed as an argument
        # is masked too; the record then carries no arguments.
        record.msg = self._clean(record.getMessage())
        record.args = None
        for key, value in list(record.__dict__.items()):
            if key in _RECORD_FIELDS:
                continue
            if _is_secret_key(key):
                record.__dict__[key] = MASK
            elif isinstance(value, str):
                record.__dict__[key] = self._clean(value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self._clean(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = self._clean(record.exc_text)
        return True


class CeleryTaskFilter(logging.Filter):
    """Adds `task_id` and `task_name` to a line written while a Celery task runs (in this
    thread); other lines are left alone.

    Reads Celery's own record of the running task, so every line inside a task gets them:
    ours, Celery's, and those of any library the task calls.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        # No Celery loaded means no task running: the API and the CLI never import it here.
        state = sys.modules.get("celery._state")
        task = state.get_current_task() if state is not None else None
        if task is not None:
            task_id = getattr(task.request, "id", None)
            if task_id is not None:  # None: a task called as a plain function (tests)
                record.task_id = task_id
            record.task_name = task.name
        elif record.name == "celery.app.trace":
            # Celery's "Task ... succeeded / raised / retry" lines are written just after the
            # task left the stack; they name it in their own `data` extra.
            data = record.__dict__.get("data")
            if isinstance(data, dict) and "id" in data and "name" in data:
                record.task_id, record.task_name = data["id"], data["name"]
        return True


# Beat's once-a-second poll (AWAITED_POLL_S): Celery's own INFO lines for it (sent, received,
# succeeded, expired) would be most of a worker's log. Its warnings, errors and the lines the
# task itself writes (a run settled) still appear.
QUIET_TASKS = frozenset({names.MONITOR_AWAITED_RUNS})
_CELERY_TASK_NAME_ARG = {"celery.beat": 1, "celery.worker.request": 0}


class QuietPollFilter(logging.Filter):
    """Drops Celery's routine INFO lines about the tasks in QUIET_TASKS."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or not record.name.startswith("celery."):
            return True
        data = record.__dict__.get("data")
        if isinstance(data, dict):  # celery.app.trace, celery.worker.strategy
            return data.get("name") not in QUIET_TASKS
        position = _CELERY_TASK_NAME_ARG.get(record.name)
        args = record.args
        if position is not None and isinstance(args, tuple) and len(args) > position:
            return args[position] not in QUIET_TASKS
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the `extra` keys, exception."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and key not in data:
                data[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            data["exc"] = record.exc_text
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=str)


class PlainFormatter(logging.Formatter):
    """A readable line; `extra` keys follow the message as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [
            f"{key}={value}" for key, value in record.__dict__.items() if key not in _RECORD_FIELDS
        ]
        if not extras:
            return line
        head, sep, tail = line.partition("\n")  # keep a traceback below the key=values
        return f"{head} [{' '.join(extras)}]{sep}{tail}"


def secret_values(settings: Settings) -> list[str]:
    """Every configured secret, as the strings that must never reach a log line."""
    values = [
        settings.api_secret.get_secret_value(),
        settings.flower_basic_auth.get_secret_value(),
        settings.callback_secret.get_secret_value(),
        settings.callback_previous_secret.get_secret_value(),
    ]
    # FLOWER_BASIC_AUTH is user:password[,user:password]; mask each password on its own too.
    for pair in settings.flower_basic_auth.get_secret_value().split(","):
        values.append(pair.partition(":")[2])
    for url in (settings.database_url, settings.broker_url, settings.callback_url or ""):
        values.extend(_url_password(url))
    return [v for v in values if v]


def _url_password(url: str) -> list[str]:
    """The URL's passwords (its authority's, its query's password-like parameters'), decoded
    and as written (a `%40` in the URL is an `@` to the client): a line may quote either."""
    from urllib.parse import unquote_plus, urlsplit

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        password = make_url(url).password
        written = urlsplit(url).password
    except (ArgumentError, ValueError):
        return []
    forms = {password, written}
    # The query as SQLAlchemy reads it: all after the `?`, a `#` in a value included.
    query = url.partition("?")[2]
    for name, _, value in (item.partition("=") for item in query.split("&")):
        if secret_parameter(name):
            forms |= {value, unquote_plus(value)}
    return [str(form) for form in forms if form]


def configure_logging(settings: Settings, stream: Any = None) -> logging.Handler:
    """Send every logger to stderr (or `stream`) as plain or JSON lines; returns the handler.

    Idempotent: a second call replaces the handler installed by the first.
    """
    level = logging.getLevelName(settings.log_level.strip().upper())
    if not isinstance(level, int):
        raise SettingsError(
            f"LOG_LEVEL={settings.log_level!r} is not a level; "
            "use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.log_json else PlainFormatter())
    handler.addFilter(QuietPollFilter())
    handler.addFilter(CeleryTaskFilter())
    handler.addFilter(RedactingFilter(secret_values(settings)))
    handler.set_name("fl-dispatcher")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "fl-dispatcher"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn and celery install their own handlers unless told otherwise; route theirs here.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    return handler
