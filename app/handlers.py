"""Every message the product handles, listed once: its use case, its kind (which delivery
rules apply), its queue and, for beat's loops, its period. `tasks/` registers one Celery task
per entry, `app.celery_app` builds beat's schedule from the periods, and the simulator
(`app/sim`) delivers its messages to the same calls under the same rules, so nothing mirrors
the task layer. Imports no Celery.

The delivery rules by kind (`on_error`; tasks/base.py carries them out on Celery):

- `request`, flip-api's (the message is the only copy of its intent): a database that
  cannot store it now (a statement hung to the task's soft time limit included), or a row
  another worker changed meanwhile, is retried with backoff and no limit, never
  acknowledged away; killed at the hard time limit, it goes back to its queue;
- `pipeline`, a chain step bound to one job, net and attempt: a `TransientError` or a row
  changed meanwhile is retried with backoff up to `RETRY_MAX`, each retry counted on the
  job, then the job is requeued, never dropped; a misconfigured net ends the chain (the use
  case handled it);
- `housekeeping` (beat's loops), `plain` (the assign round, stray settling) and `callbacks`
  (a delivery round) fail loudly: the next tick, beat's sweep or reconcile does the work.

A handler may also ask to run again after a countdown (`again_in`: a readiness poll, the
next callback due), and a chain step may end its chain (`ends_chain`).

(`billiard` is Celery's process pool, not Celery: its time-limit exception is what a
statement that hangs past the soft limit raises in the use case.)
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm.exc import StaleDataError

from app import names
from app.db import database_unavailable
from app.errors import MisconfigurationError, TransientError
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import (
    abort,
    callbacks,
    dispatch,
    intake,
    kicks,
    monitor,
    reconciler,
    requests,
    scale_down,
)
from app.usecases.dispatch import Step
from app.usecases.prewarm import warm_up as prewarm_warm_up

# Exponential backoff of every retry: factor 2 s, full jitter, capped by RETRY_BACKOFF_MAX_S.
RETRY_BACKOFF_S = 2


class Kind(StrEnum):
    """Which delivery rules apply to a handler's messages (the table in the module doc)."""

    REQUEST = "request"
    PIPELINE = "pipeline"
    HOUSEKEEPING = "housekeeping"
    PLAIN = "plain"
    CALLBACKS = "callbacks"


def _never(_settings: Settings, _result: object) -> float | None:
    return None


@dataclass(frozen=True)
class Handler:
    """One message the product handles."""

    name: str
    call: Callable[..., object]  # call(rt, **the message's kwargs)
    kind: Kind
    # Beat's period in seconds (None or 0: beat does not send it), and its queue there.
    period: Callable[[Settings], float | None] | None = None
    beat_queue: str = names.HOUSEKEEPING_QUEUE
    # A countdown after which the same message runs again (no retry limit), or None.
    again_in: Callable[[Settings, object], float | None] = field(default=_never)
    task_events: bool = True  # Flower's task list; off for a poll a second
    # The call also takes `message_id`, the broker message's id (Celery's task id), the same
    # for every copy of the message (its retries, redeliveries, publish duplicates), so a
    # copy finds what another recorded.
    message_id: bool = False

    def kwargs(
        self, sent: dict[str, Any], message_id: str, args: tuple[Any, ...] = ()
    ) -> dict[str, Any]:
        """The call's keyword arguments: the message's own, and its id if the call takes it.
        A request (flip-api's, sent by name) is its one `payload`, whatever shape the message
        came in: one sent otherwise is refused as the request's refusals are
        (`intake.request_payload`), never failed with a TypeError and acknowledged away.
        Any other message is sent by this package with keyword arguments only."""
        if self.kind is Kind.REQUEST:
            sent = {"payload": intake.request_payload(args, sent)}
        elif args:
            raise TypeError(f"{self.name} takes keyword arguments only ({len(args)} positional)")
        return {**sent, "message_id": message_id} if self.message_id else sent

    @property
    def queue(self) -> str:
        """The queue it is sent to outside beat's schedule."""
        return names.queue_for(self.name)


@dataclass(frozen=True)
class Acks:
    """When the broker forgets a message: Celery's settings for every task (`celery_config`,
    `DispatcherTask`), which the simulator's broker follows too."""

    # Acknowledged when the task returns, not when a worker takes it: a worker that dies
    # mid-task leaves the message to be delivered again.
    late: bool = True
    # A task that raised is acknowledged (Celery's default); False would reject it without
    # requeue, which forgets it just the same: only a retry keeps a failed message's work.
    on_failure_or_timeout: bool = True
    # A worker process lost mid-task (killed, out of memory) does not lose its message: it is
    # sent again (`sent_again_in_s`).
    reject_on_worker_lost: bool = True

    def on_timeout(self, kind: Kind) -> bool:
        """Whether a task killed at its hard time limit is acknowledged: a caller's request,
        its only copy, is sent again instead (`sent_again_in_s`); a step's or a loop's work
        is found again by its lease or beat's next tick, so it is let go."""
        return self.on_failure_or_timeout and kind is not Kind.REQUEST


ACKS = Acks()


class Verdict(StrEnum):
    """What becomes of a message whose handler raised (`on_error`)."""

    RETRY = "retry"  # sent again after a backoff countdown
    EXHAUSTED = "exhausted"  # a step out of retries: it fails, and its job is requeued
    ENDED = "ended"  # handled where it was raised (a misconfigured net): the chain ends
    FAILED = "failed"  # fails loudly: acknowledged, the message is gone


def on_error(handler: Handler, exc: BaseException, retries: int, settings: Settings) -> Verdict:
    """The delivery rule for `exc` out of `handler` on its try number `retries` (0 first)."""
    # Another transaction changed the row between this one's read and its write (the rows'
    # version check): trying again reads it as it is now, and acts only if still its own.
    changed = isinstance(exc, StaleDataError)
    # A statement that hung to the soft time limit (a socket to a primary that vanished in
    # a failover, a row lock a frozen transaction holds): the database could not store it now.
    hung = isinstance(exc, SoftTimeLimitExceeded)
    if handler.kind is Kind.REQUEST and (
        changed or hung or database_unavailable(exc) or isinstance(exc, TransientError)
    ):
        return Verdict.RETRY  # the message is the caller's only copy: never let it go
    if handler.kind is Kind.PIPELINE:
        if isinstance(exc, MisconfigurationError):
            return Verdict.ENDED
        if changed or isinstance(exc, TransientError):
            return Verdict.RETRY if retries < settings.retry_max else Verdict.EXHAUSTED
    return Verdict.FAILED


def step_of(result: object) -> object:
    """A step's outcome (its StepResult's or WarmResult's `step`), or the result itself."""
    return getattr(result, "step", result)


def ends_chain(result: object) -> bool:
    """A chain step that skipped, gave up or submitted the job itself: Celery runs no further
    step of its chain."""
    return bool(getattr(step_of(result), "ends_chain", False))


def shown(result: object) -> Any:
    """A handler's result as the task's JSON result (what Flower shows)."""
    step = getattr(result, "step", None)
    if step is not None:
        return str(step)
    if isinstance(result, reconciler.Reconciled):
        return {"redriven": list(result.redriven), "repaired": list(result.repaired)}
    if isinstance(result, callbacks.DeliveryReport):
        return {"delivered": result.delivered, "failed": result.failed, "busy": result.busy}
    return result


def backoff_s(retries: int, maximum: float, rng: random.Random | None = None) -> float:
    """Celery's exponential backoff with full jitter (`get_exponential_backoff_interval`),
    with the exponent clamped first so a retry count without limit cannot grow the power."""
    exponent = min(max(retries, 0), 32)
    countdown = int(min(maximum, RETRY_BACKOFF_S * 2**exponent))
    return float((rng or random).randrange(countdown + 1))


# The message header counting how often a message's worker was lost holding it (a count of
# its own: Celery's `retries` also counts database retries and readiness polls).
LOSSES_HEADER = "fl_dispatcher_losses"
# The message header counting its retries after an error, which `on_error` judges and the
# backoff grows with: Celery's `retries` also counts readiness polls (wait_ready's and
# warm_up's own retries), and a boot polled RETRY_MAX times would have its first error
# judged its last, and waited the capped backoff.
ERROR_RETRIES_HEADER = "fl_dispatcher_error_retries"


# A count header's bound: past any real count, and its next count (`+ 1`) still a number
# every transport sends (one of 4,301 digits is none: json's int() and str() refuse it).
HEADER_COUNT_MAX = 2**31 - 1


def header_count(value: object) -> int:
    """A count header's value (`LOSSES_HEADER`, `ERROR_RETRIES_HEADER`): 0 when absent or no
    count (any producer may set a header: a hand-sent message's text, a negative number), at
    most `HEADER_COUNT_MAX` (a huge one: never an error out of the error path itself)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, str) and value.strip().isdecimal():
        try:
            value = int(value.strip())
        except ValueError:  # more digits than int() reads (4,300): a count past the bound
            return HEADER_COUNT_MAX
    return min(max(0, value), HEADER_COUNT_MAX) if isinstance(value, int) else 0


def sent_again_in_s(losses: int, maximum: float, rng: random.Random | None = None) -> float:
    """When a message whose worker was lost holding it (killed at the hard time limit, out of
    memory, a crash) is delivered again, `losses` its losses before this one: at once the
    first time (a deploy or another task's memory is no fault of its own), then after the
    retries' backoff, so a message that kills every worker that takes it does not loop at
    full speed for ever."""
    return 0.0 if losses <= 0 else backoff_s(losses, maximum, rng)


def _polls_while_not_ready(settings: Settings, result: object) -> float | None:
    # wait_ready's Step.NOT_READY, or warm_up's Warm.NOT_READY (the same string).
    return settings.ready_poll_s if step_of(result) == Step.NOT_READY else None


def _next_callback_due(_settings: Settings, result: object) -> float | None:
    return getattr(result, "retry_in_s", None)


def _step(use_case: Callable[..., object]) -> Callable[..., object]:
    def call(rt: Runtime, job_id: str, net_name: str, attempt: int = 0) -> object:
        return use_case(rt, uuid.UUID(job_id), net_name, int(attempt))

    return call


def _every(settings: Settings) -> float:
    return settings.housekeeping_interval_s


def _handlers() -> tuple[Handler, ...]:
    return (
        # The assign round first: beat's schedule and the simulator's ticks keep this order.
        Handler(
            names.ASSIGN_NEXT_JOB,
            lambda rt: len(kicks.assign_round(rt)),
            Kind.PLAIN,
            period=_every,
        ),
        Handler(names.SCALE_UP, _step(dispatch.start), Kind.PIPELINE),
        Handler(
            names.WAIT_READY,
            _step(dispatch.check_ready),
            Kind.PIPELINE,
            again_in=_polls_while_not_ready,
        ),
        Handler(names.DISPATCH, _step(dispatch.dispatch), Kind.PIPELINE),
        Handler(
            names.ABORT_ON_SERVER,
            lambda rt, job_id: abort.abort_on_server(rt, uuid.UUID(job_id)),
            Kind.PIPELINE,
        ),
        Handler(
            names.SETTLE_STRAY_RUNS,
            abort.settle_stray_runs,
            Kind.PLAIN,
        ),
        Handler(
            names.WARM_UP,
            prewarm_warm_up.warm_up,
            Kind.PIPELINE,
            again_in=_polls_while_not_ready,
        ),
        Handler(
            names.SCALE_DOWN_IDLE_NETS,
            scale_down.scale_down_idle_nets,
            Kind.HOUSEKEEPING,
            period=_every,
        ),
        Handler(
            names.MONITOR_RUNNING_JOBS,
            monitor.monitor_running_jobs,
            Kind.HOUSEKEEPING,
            period=_every,
        ),
        Handler(
            names.RECONCILE,
            _reconcile,
            Kind.HOUSEKEEPING,
            period=lambda settings: 2 * settings.housekeeping_interval_s,
        ),
        Handler(
            names.KEEP_ALIVE_BUSY_NETS,
            scale_down.keep_alive_busy_nets,
            Kind.HOUSEKEEPING,
            period=lambda settings: settings.keep_alive_interval_s,
        ),
        # Reads the tables only while a QUEUED job waits for a busy net. No task events: a
        # poll a second would crowd the job chains out of Flower's task list (it keeps the
        # newest 100,000: a day of polls); what it settles shows in the jobs' history.
        Handler(
            names.MONITOR_AWAITED_RUNS,
            monitor.monitor_awaited_runs,
            Kind.HOUSEKEEPING,
            period=lambda settings: settings.awaited_poll_s or None,
            task_events=False,
        ),
        # The sweep of events whose kick was lost, or made by a process that sends none;
        # beside the deliveries' own kicks, not on the housekeeping queue: a round holds its
        # slot up to ROUND_BUDGET_S and runs again while events wait.
        Handler(
            names.DELIVER_CALLBACKS,
            lambda rt: callbacks.deliver_callbacks(rt, rt.callback_sender),
            Kind.CALLBACKS,
            period=lambda settings: (
                settings.housekeeping_interval_s if settings.callbacks_enabled else None
            ),
            beat_queue=names.PIPELINE_QUEUE,
            again_in=_next_callback_due,
        ),
        Handler(names.ENQUEUE_JOB, requests.enqueue_job, Kind.REQUEST, message_id=True),
        Handler(names.ABORT_JOB, requests.abort_job, Kind.REQUEST),
        Handler(names.REPORT_JOB_STATUS, requests.report_job_status, Kind.REQUEST),
        Handler(names.PREWARM, requests.prewarm_net, Kind.REQUEST),
        Handler(names.CANCEL_PREWARM, requests.cancel_prewarm, Kind.REQUEST),
    )


def _reconcile(rt: Runtime) -> reconciler.Reconciled:
    # One observation pass: the nets' drivers are read in batches (ECS: 10 services a call).
    with rt.observation_pass():
        return reconciler.reconcile(rt)


HANDLERS: dict[str, Handler] = {handler.name: handler for handler in _handlers()}


def beat_loops(settings: Settings) -> list[tuple[Handler, float]]:
    """Beat's loops with their periods in seconds, the assign round first."""
    loops = []
    for handler in HANDLERS.values():
        period = handler.period(settings) if handler.period is not None else None
        if period:
            loops.append((handler, period))
    return loops
