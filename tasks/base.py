"""The one task base: defaults every task shares, the per-process runtime, and the
delivery rules of `app.handlers` carried out on Celery: only what `on_error` classifies is
retried, running out of retries requeues the job instead of losing it, and a caller's request
is never acknowledged away while the database cannot store it."""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from celery import Task
from celery.app.task import X_DEATH_HEADERS
from celery.exceptions import Reject, Retry
from celery.worker.request import Request

from app.celery_app import (
    HOUSEKEEPING_HARD_LIMIT_S,
    HOUSEKEEPING_SOFT_LIMIT_S,
    PIPELINE_HARD_LIMIT_S,
    PIPELINE_SOFT_LIMIT_S,
    celery,
    celery_runtime,
)
from app.db import database_error_name
from app.handlers import (
    ACKS,
    ERROR_RETRIES_HEADER,
    HANDLERS,
    LOSSES_HEADER,
    Handler,
    Kind,
    Verdict,
    backoff_s,
    ends_chain,
    header_count,
    on_error,
    sent_again_in_s,
    shown,
)
from app.names import PREFIX
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


class SentAgainRequest(Request):  # type: ignore[misc]
    """One delivery, in the worker's main process. A message whose worker process is lost
    holding it (killed at its hard time limit, out of memory, a crash) is sent again with its
    losses counted (`LOSSES_HEADER`; its retries left alone), at once the first time and after
    the retries' backoff from the second (`app.handlers.sent_again_in_s`), where Celery would
    put it back at once every time: a message that kills every worker that takes it looped at
    full speed for ever, each turn costing a process and a hard time limit. Should the broker
    refuse the copy, the message goes back to its queue as before: never acknowledged away;
    one whose channel closed meanwhile is back on the broker already, and is not copied."""

    _lost = False

    def on_timeout(self, soft: bool, timeout: float) -> None:
        """Celery's handling of a time limit; a hard one marks the delivery lost."""
        self._lost = self._lost or not soft
        super().on_timeout(soft, timeout)

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        """Celery's handling of a failure; any but the task's own Reject is a lost worker
        where Celery then puts the message back."""
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        # A task's own Reject(requeue=True) is a retry whose copy the broker refused: put back.
        self._lost = not isinstance(exc, Reject)
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def reject(self, requeue: bool = False) -> None:
        """Put back (requeue) as a copy sent again, when the delivery was lost."""
        if requeue and self._lost and not self.acknowledged and self._sent_again():
            self.acknowledge()
            return
        super().reject(requeue=requeue)

    def _sent_again(self) -> bool:
        if _channel_closed(self._message):
            # The broker took the message back already (its consumer's connection dropped
            # meanwhile): a copy would be a second delivery of it.
            return False
        try:
            context = self._context
            headers = dict(context.headers or {})
            losses = header_count(headers.get(LOSSES_HEADER))
            countdown = sent_again_in_s(losses, load_settings().retry_backoff_max_s)
            self.task.signature_from_request(
                context, countdown=countdown, headers={**headers, LOSSES_HEADER: losses + 1}
            ).apply_async()
        except Exception as exc:  # noqa: BLE001 (the broker refused it: back to its queue)
            log.error(
                "worker lost holding a message: no copy sent; put back",
                extra={"task_name": self.name, "task_id": self.id, "reason": type(exc).__name__},
            )
            return False
        log.warning(
            "worker lost holding a message: sent again",
            extra={
                "task_name": self.name,
                "task_id": self.id,
                "losses": losses + 1,
                "retry_in_s": countdown,
            },
        )
        return True


def _channel_closed(message: Any) -> bool:
    """Whether the channel a message came on is closed (kombu's virtual transports: Redis,
    SQL; py-amqp's RabbitMQ): its unacknowledged messages went back to the broker."""
    channel = getattr(message, "channel", None)
    return (
        channel is None
        or bool(getattr(channel, "closed", False))
        or (getattr(channel, "is_open", True) is False)
    )


class DispatcherTask(Task):  # type: ignore[misc]
    """Late ack + a lost worker's message sent again (`app.handlers.ACKS`,
    `SentAgainRequest`), no stored result; see `register`."""

    Request = SentAgainRequest
    acks_late = ACKS.late
    acks_on_failure_or_timeout = ACKS.on_failure_or_timeout
    reject_on_worker_lost = ACKS.reject_on_worker_lost
    ignore_result = True
    typing = True

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Out of retries on a transient error: requeue the job, never drop it."""
        handler = HANDLERS.get(self.name)
        job_id = kwargs.get("job_id") if isinstance(kwargs, dict) else None
        if handler is None or not job_id:
            return
        # Called once the task failed for good: judged as at its last try, a step's error
        # that on_error retries (transient, a row changed meanwhile) is one whose retries ran
        # out, and its job is requeued.
        settings = runtime().settings
        if on_error(handler, exc, settings.retry_max, settings) is Verdict.EXHAUSTED:
            from app.usecases.retries import requeue_after_transient

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


# What a pipeline step returns when its net turned out misconfigured (handled, chain ended).
MISCONFIGURED = "misconfigured"


def _apply_rules(handler: Handler, fun: Callable[..., Any]) -> Callable[..., Any]:
    """Carry out `app.handlers.on_error`'s verdict on what `fun` raised, reading RETRY_MAX and
    RETRY_BACKOFF_MAX_S from this process's settings at retry time (Celery's own autoretry
    would freeze them when the task module is imported).

    A step's classified transient error is retried with backoff and full jitter, each retry
    counted on its job; a caller's request the database cannot store now (refused or reset
    connection, restart, failover) is sent again the same way with no retry limit, as one
    WARNING line with the error's class, never its text, and should the broker refuse that
    copy too, the message goes back to its queue instead of being dropped."""

    @functools.wraps(fun)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fun(self, *args, **kwargs)
        except (Retry, Reject):
            raise
        except Exception as exc:
            settings = runtime().settings
            # Its retries after an error, not Celery's `retries`: a readiness poll is none.
            # Its other headers go with the copy, as Celery's own retry (a poll's) sends
            # them: without RabbitMQ's dead-letter ones, whose cycle check drops a message
            # dead-lettered again while it carries them.
            headers = {
                name: value
                for name, value in (self.request.headers or {}).items()
                if name not in X_DEATH_HEADERS
            }
            retries = header_count(headers.get(ERROR_RETRIES_HEADER))
            verdict = on_error(handler, exc, retries, settings)
            if verdict is Verdict.ENDED:
                # Already handled by the use case (net MISCONFIGURED, job back in the queue,
                # one ERROR line): the chain ends here, without Celery's "raised unexpected"
                # and its traceback, which would read as a bug.
                log.info(
                    "step ended: net misconfigured",
                    extra={"job": kwargs.get("job_id"), "task": self.name, "reason": str(exc)},
                )
                self.request.chain = None
                return MISCONFIGURED
            if verdict is not Verdict.RETRY:
                raise  # FAILED: loud; EXHAUSTED: on_failure requeues the job
            countdown = backoff_s(retries, settings.retry_backoff_max_s)
            job_id = kwargs.get("job_id")
            if handler.kind is Kind.PIPELINE and job_id:
                from app.usecases.retries import count_retry

                # Counted on the job, which also learns when this task will try again: a
                # worker that dies in the wait is then known gone soon after (reconcile).
                count_retry(runtime(), uuid.UUID(job_id), next_try_in_s=countdown)
            if handler.kind is Kind.REQUEST:
                log.warning(
                    "database unavailable: request kept, retried",
                    extra={
                        "task": self.name,
                        "reason": database_error_name(exc),
                        "retries": retries,
                        "retry_in_s": countdown,
                    },
                )
            try:
                raise self.retry(
                    exc=exc,
                    countdown=countdown,
                    max_retries=None,
                    headers={**headers, ERROR_RETRIES_HEADER: retries + 1},
                ) from exc
            except Reject as refused:
                if handler.kind is not Kind.REQUEST:
                    raise  # a lost step is found again by reconcile
                # Celery's retry answers a failed send of the new copy with
                # Reject(requeue=False), which drops this message: put it back instead.
                raise Reject(refused.reason, requeue=True) from exc

    return run


def register(handler: Handler) -> Task:
    """The Celery task of one handler (`app.handlers`): its name, the project's defaults,
    and its kind's delivery rules. A `request` (flip-api's) is retried while the database
    cannot store it, never acknowledged away; a `pipeline` step retries classified transient
    errors (backoff, jitter, cap, count) and requeues its job when they run out; anything
    else fails at once and loudly (a blanket retry on Exception would turn a
    misconfiguration into an endless loop). Housekeeping gets beat's longer limits."""
    soft, hard = (
        (HOUSEKEEPING_SOFT_LIMIT_S, HOUSEKEEPING_HARD_LIMIT_S)
        if handler.kind in (Kind.HOUSEKEEPING, Kind.CALLBACKS)
        else (PIPELINE_SOFT_LIMIT_S, PIPELINE_HARD_LIMIT_S)
    )

    # Any arguments, so Celery's own check of them (`typing`, at apply_async) lets a
    # misshapen request through to its refusal (`Handler.kwargs`).
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = runtime()
        result = handler.call(rt, **handler.kwargs(kwargs, self.request.id, args))
        countdown = handler.again_in(rt.settings, result)
        if countdown is not None:
            raise self.retry(countdown=countdown, max_retries=None)
        if ends_chain(result):
            self.request.chain = None  # Celery runs no further step of this chain
        return shown(result)

    body = _apply_rules(handler, run)
    body.__name__ = body.__qualname__ = handler.name.removeprefix(PREFIX)
    body.__doc__ = handler.call.__doc__
    task: Task = celery.task(
        name=handler.name,
        base=DispatcherTask,
        bind=True,
        soft_time_limit=soft,
        time_limit=hard,
        send_events=handler.task_events,
        # Celery acknowledges a task killed at its hard limit when acks_on_timeout is true
        # (ACKS.on_failure_or_timeout would make it so for every task).
        acks_on_timeout=ACKS.on_timeout(handler.kind),
        # No limit of Celery's own (its default is 3, and a retry's max_retries=None means
        # that default): on_error alone decides how often a message is tried again.
        max_retries=None,
    )(body)
    return task
