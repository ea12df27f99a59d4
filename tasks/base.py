"""The one task base: defaults every task shares, the per-process runtime, and the rule
that only classified transient errors are retried and that running out of retries requeues
the job instead of losing it."""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task
from celery.exceptions import Reject, Retry
from celery.utils.time import get_exponential_backoff_interval

from app.celery_app import (
    HOUSEKEEPING_HARD_LIMIT_S,
    HOUSEKEEPING_SOFT_LIMIT_S,
    PIPELINE_HARD_LIMIT_S,
    PIPELINE_SOFT_LIMIT_S,
    RETRY_BACKOFF_S,
    celery,
    celery_runtime,
)
from app.db import database_error_name, database_unavailable
from app.errors import MisconfigurationError, TransientError
from app.runtime import Runtime
from app.settings import load_settings

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


class _ProcessRuntime:
    """Holds this process's runtime, built on first use (after the worker's fork, so each
    child has its own database pool and NVFLARE sessions)."""

    def __init__(self) -> None:
        self.current: Runtime | None = None
        self.lock = threading.Lock()


_process = _ProcessRuntime()


def runtime() -> Runtime:
    """This process's runtime."""
    with _process.lock:
        if _process.current is None:
            _process.current = celery_runtime(load_settings())
        return _process.current


def set_runtime(rt: Runtime | None) -> None:
    """Replace the process runtime (tests; a worker never calls this)."""
    with _process.lock:
        _process.current = rt


class DispatcherTask(Task):  # type: ignore[misc]
    """Late ack + requeue on a lost worker, no stored result; see `dispatcher_task`."""

    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    typing = True

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Out of retries on a transient error: requeue the job, never drop it."""
        job_id = kwargs.get("job_id") if isinstance(kwargs, dict) else None
        if job_id and isinstance(exc, TransientError) and self.name in PIPELINE_TASKS:
            from app.usecases.dispatch import requeue_after_transient

            log.warning(
                "retries exhausted; requeueing",
                extra={"job": job_id, "task": self.name, "reason": str(exc)},
            )
            attempt = kwargs.get("attempt")
            requeue_after_transient(
                runtime(),
                uuid.UUID(job_id),
                f"{self.name}: retries exhausted: {exc}",
                net_name=kwargs.get("net_name"),
                attempt=int(attempt) if attempt is not None else None,
            )


PIPELINE_TASKS: set[str] = set()
# flip-api's requests, whose message is the only copy of what the caller asked for.
CALLER_INTENT_TASKS: set[str] = set()
# What a pipeline step returns when its net turned out misconfigured (handled, chain ended).
MISCONFIGURED = "misconfigured"


def _retry_transient(fun: F) -> F:
    """Retry a classified transient error with exponential backoff and full jitter, reading
    RETRY_MAX and RETRY_BACKOFF_MAX_S from this process's settings at retry time (Celery's
    own autoretry would freeze them when the task module is imported)."""

    @functools.wraps(fun)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fun(self, *args, **kwargs)
        except MisconfigurationError as exc:
            # Already handled by the use case (net MISCONFIGURED, job back in the queue, one
            # ERROR line): the chain ends here, without Celery's "raised unexpected" and its
            # traceback, which would read as a bug.
            log.info(
                "step ended: net misconfigured",
                extra={"job": kwargs.get("job_id"), "task": self.name, "reason": str(exc)},
            )
            self.request.chain = None
            return MISCONFIGURED
        except TransientError as exc:
            settings = runtime().settings
            countdown = get_exponential_backoff_interval(
                factor=RETRY_BACKOFF_S,
                retries=self.request.retries,
                maximum=settings.retry_backoff_max_s,
                full_jitter=True,
            )
            job_id = kwargs.get("job_id")
            if job_id and self.request.retries < settings.retry_max:
                from app.usecases.dispatch import count_retry

                # Counted on the job, which also learns when this task will try again: a
                # worker that dies in the wait is then known gone soon after (reconcile).
                count_retry(runtime(), uuid.UUID(job_id), next_try_in_s=countdown)
            raise self.retry(exc=exc, countdown=countdown, max_retries=settings.retry_max) from exc

    return run  # type: ignore[return-value]


def _keep_until_stored(fun: F) -> F:
    """A caller's request whose message is its only copy: a database that cannot store it
    now (refused or reset connection, restart, failover) must not let Celery acknowledge it
    away. The request is sent again with backoff and full jitter (capped by
    RETRY_BACKOFF_MAX_S, no retry limit: the database coming back is what ends it), as one
    WARNING line with the error's class, never its text. Should the broker refuse that copy
    too, the message goes back to its queue unacknowledged instead of being dropped."""

    @functools.wraps(fun)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fun(self, *args, **kwargs)
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            countdown = get_exponential_backoff_interval(
                factor=RETRY_BACKOFF_S,
                retries=self.request.retries,
                maximum=runtime().settings.retry_backoff_max_s,
                full_jitter=True,
            )
            log.warning(
                "database unavailable: request kept, retried",
                extra={
                    "task": self.name,
                    "reason": database_error_name(exc),
                    "retries": self.request.retries,
                    "retry_in_s": countdown,
                },
            )
            try:
                raise self.retry(countdown=countdown, max_retries=None) from exc
            except Retry:
                raise
            except Reject as refused:
                # Celery's retry answers a failed send of the new copy with
                # Reject(requeue=False), which drops this message: put it back instead.
                raise Reject(refused.reason, requeue=True) from exc

    return run  # type: ignore[return-value]


def dispatcher_task(
    name: str,
    *,
    pipeline: bool = False,
    housekeeping: bool = False,
    caller_intent: bool = False,
    **options: Any,
) -> Callable[[F], F]:
    """Register a task under its full name (see `app.names`) with the project's defaults.

    Pipeline steps also retry classified transient errors (backoff, jitter, cap, count);
    anything else fails at once and loudly. A blanket retry on Exception would turn a
    misconfiguration into an endless loop. Housekeeping tasks get beat's longer limits.
    A `caller_intent` task (flip-api's requests: its message is the only copy) is retried
    while the database cannot store it, never acknowledged away (`_keep_until_stored`).
    """
    soft, hard = (
        (HOUSEKEEPING_SOFT_LIMIT_S, HOUSEKEEPING_HARD_LIMIT_S)
        if housekeeping
        else (PIPELINE_SOFT_LIMIT_S, PIPELINE_HARD_LIMIT_S)
    )
    defaults: dict[str, Any] = {
        "name": name,
        "base": DispatcherTask,
        "bind": True,
        "soft_time_limit": soft,
        "time_limit": hard,
    }
    if pipeline:
        PIPELINE_TASKS.add(name)
    defaults |= options

    def register(fun: F) -> F:
        body = _retry_transient(fun) if pipeline else fun
        if caller_intent:
            body = _keep_until_stored(body)
            CALLER_INTENT_TASKS.add(name)
        task: F = celery.task(**defaults)(body)
        return task

    return register
