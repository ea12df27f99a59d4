"""The message layer standing in for Celery: an outbox that use cases send through, a broker
that loses, duplicates, delays and reorders messages, and ONE table mapping task names to
use-case calls as tasks/*.py does (so an interface change on main is a small edit here).

Retry rules are those of tasks/base.py: a pipeline step that raises a classified
TransientError is retried with exponential backoff and full jitter (factor 2 s, capped by
RETRY_BACKOFF_MAX_S) until request.retries + 1 > RETRY_MAX; then `on_failure` requeues the
job (`requeue_after_transient`). `on_retry` counts the retry. wait_ready's NOT_READY is a
retry after READY_POLL_S with no limit (it still counts in request.retries, as in Celery).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from app import names
from app.errors import InvalidRequest, NotFound
from app.runtime import Runtime
from app.schemas import AbortJob, CancelPrewarm, EnqueueJob, PrewarmNet, ReportJobStatus
from app.sim.clock import SimClock
from app.sim.faults import FaultProfile
from app.usecases import (
    abort,
    dispatch,
    intake,
    monitor,
    prewarm,
    prewarm_warm_up,
    reconciler,
    scale_down,
)
from app.usecases.dispatch import Step

RETRY_BACKOFF_S = 2  # app.celery_app.RETRY_BACKOFF_S


class Host(Protocol):
    """What the message layer needs from the simulation that owns it."""

    clock: SimClock
    rng_msg: random.Random  # the message stream

    @property
    def faults(self) -> FaultProfile: ...

    def trace(self, line: str) -> None: ...

    def hook(self, point: str, net: str | None) -> None: ...


def _job(kw: dict[str, Any]) -> uuid.UUID:
    return uuid.UUID(kw["job_id"])


def _enqueue(rt: Runtime, kw: dict[str, Any]) -> object:
    """tasks.public.enqueue_job: a refused payload is recorded, not raised."""
    try:
        request = intake.parse_payload(EnqueueJob, kw["payload"])
        return intake.submit_job(rt, request).enqueued
    except InvalidRequest as exc:
        intake.reject_enqueue(rt, intake.caller_key_of(kw["payload"]), str(exc))
        return f"rejected: {exc}"


def _abort_job(rt: Runtime, kw: dict[str, Any]) -> object:
    """tasks.public.abort_job."""
    try:
        request = intake.parse_payload(AbortJob, kw["payload"])
        return intake.request_abort(rt, request.job_id, request.reason).decision.state
    except (InvalidRequest, NotFound) as exc:
        return f"rejected: {exc}"


def _report(rt: Runtime, kw: dict[str, Any]) -> object:
    """tasks.public.report_job_status."""
    try:
        request = intake.parse_payload(ReportJobStatus, kw["payload"])
        return intake.report_status(rt, request)
    except (InvalidRequest, NotFound) as exc:
        return f"rejected: {exc}"


def _prewarm(rt: Runtime, kw: dict[str, Any]) -> object:
    """tasks.prewarm.prewarm_net: a refused prewarm is recorded, not raised."""
    try:
        request = intake.parse_payload(PrewarmNet, kw["payload"])
    except InvalidRequest as exc:
        code = prewarm.refuse_prewarm(rt, intake.caller_key_of(kw["payload"]), exc)
        return f"refused: {code}"
    try:
        return prewarm.request_prewarm(rt, request).prewarm["status"]
    except InvalidRequest as exc:  # recorded by the use case
        return f"refused: {prewarm.refusal_code(exc)}"


def _cancel_prewarm(rt: Runtime, kw: dict[str, Any]) -> object:
    """tasks.prewarm.cancel_prewarm: an unknown, refused or malformed key is answered, not
    raised (the task logs it and returns {"rejected": ...})."""
    try:
        request = intake.parse_payload(CancelPrewarm, kw["payload"])
        return prewarm.cancel_prewarm(rt, request.caller_key)["status"]
    except (InvalidRequest, NotFound) as exc:
        return f"rejected: {exc}"


@dataclass(frozen=True)
class TaskSpec:
    """How a task runs: its use-case call and which of tasks/base.py's rules apply."""

    call: Callable[[Runtime, dict[str, Any]], object]
    # "pipeline" (retries, on_failure requeue) | "housekeeping" | "public" | "plain" |
    # "callbacks" (delivery to the simulation's receiver; retries itself with a countdown)
    kind: str
    polls: bool = False  # wait_ready: NOT_READY -> retry after READY_POLL_S


def _step(kw: dict[str, Any]) -> tuple[uuid.UUID, str, int]:
    return _job(kw), kw["net_name"], int(kw["attempt"])


# The ONE mapping from task names to use cases; mirrors tasks/pipeline.py, tasks/housekeeping.py
# and tasks/public.py. Chain steps return their StepResult: a step that skipped or gave up
# ends its chain (tasks.pipeline._end_chain_if_over).
TASKS: dict[str, TaskSpec] = {
    names.ASSIGN_NEXT_JOB: TaskSpec(lambda rt, kw: len(dispatch.assign_jobs(rt)), "plain"),
    names.SCALE_UP: TaskSpec(lambda rt, kw: dispatch.start(rt, *_step(kw)), "pipeline"),
    names.WAIT_READY: TaskSpec(
        lambda rt, kw: dispatch.check_ready(rt, *_step(kw)), "pipeline", polls=True
    ),
    names.DISPATCH: TaskSpec(lambda rt, kw: dispatch.dispatch(rt, *_step(kw)), "pipeline"),
    names.ABORT_ON_SERVER: TaskSpec(lambda rt, kw: abort.abort_on_server(rt, _job(kw)), "pipeline"),
    names.SETTLE_STRAY_RUNS: TaskSpec(
        lambda rt, kw: abort.settle_stray_runs(rt, kw["net_name"]), "plain"
    ),
    names.SCALE_DOWN_IDLE_NETS: TaskSpec(
        lambda rt, kw: scale_down.scale_down_idle_nets(rt), "housekeeping"
    ),
    names.KEEP_ALIVE_BUSY_NETS: TaskSpec(
        lambda rt, kw: scale_down.keep_alive_busy_nets(rt), "housekeeping"
    ),
    names.MONITOR_RUNNING_JOBS: TaskSpec(
        lambda rt, kw: monitor.monitor_running_jobs(rt), "housekeeping"
    ),
    names.MONITOR_AWAITED_RUNS: TaskSpec(
        lambda rt, kw: monitor.monitor_awaited_runs(rt), "housekeeping"
    ),
    names.RECONCILE: TaskSpec(lambda rt, kw: reconciler.reconcile(rt), "housekeeping"),
    names.ENQUEUE_JOB: TaskSpec(_enqueue, "public"),
    names.ABORT_JOB: TaskSpec(_abort_job, "public"),
    names.REPORT_JOB_STATUS: TaskSpec(_report, "public"),
    names.PREWARM: TaskSpec(_prewarm, "public"),
    names.CANCEL_PREWARM: TaskSpec(_cancel_prewarm, "public"),
    # tasks.prewarm.warm_up: a pipeline task polling every READY_POLL_S while NOT_READY.
    names.WARM_UP: TaskSpec(
        lambda rt, kw: prewarm_warm_up.warm_up(rt, kw["net_name"]), "pipeline", polls=True
    ),
    # tasks.callbacks.deliver_callbacks; the simulation passes its receiver as the sender.
    names.DELIVER_CALLBACKS: TaskSpec(lambda rt, kw: None, "callbacks"),
}


def pipeline_links(job_id: str, net_name: str, attempt: int) -> list[tuple[str, dict[str, Any]]]:
    """app.celery_app.CeleryOutbox.start_pipeline: scale_up -> wait_ready -> dispatch, each
    bound to the job's attempt."""
    ids = {"job_id": job_id, "net_name": net_name, "attempt": attempt}
    return [(names.SCALE_UP, dict(ids)), (names.WAIT_READY, dict(ids)), (names.DISPATCH, dict(ids))]


def step_of(result: object) -> object:
    """A chain step's Step (its StepResult's), or the result itself."""
    return getattr(result, "step", result)


def ends_chain(result: object) -> bool:
    """tasks.pipeline._end_chain_if_over: Celery runs no further step of this chain."""
    return bool(getattr(step_of(result), "ends_chain", False))


def on_retry(rt: Runtime, kw: dict[str, Any], countdown: float) -> None:
    """tasks.base._retry_transient's count (a transient retry of a job's step, and when it
    will be tried again)."""
    if kw.get("job_id"):
        dispatch.count_retry(rt, _job(kw), next_try_in_s=countdown)


def on_failure(rt: Runtime, task: str, kw: dict[str, Any], exc: BaseException) -> None:
    """tasks.base.DispatcherTask.on_failure (retries of a transient error exhausted)."""
    if kw.get("job_id"):
        attempt = kw.get("attempt")
        dispatch.requeue_after_transient(
            rt,
            _job(kw),
            f"{task}: retries exhausted: {exc}",
            net_name=kw.get("net_name"),
            attempt=int(attempt) if attempt is not None else None,
        )


def backoff_s(rng: random.Random, retries: int, maximum: int) -> float:
    """celery.utils.time.get_exponential_backoff_interval(full_jitter=True)."""
    countdown = min(maximum, RETRY_BACKOFF_S * (2**retries))
    return float(max(0, rng.randrange(countdown + 1)))


@dataclass
class Message:
    """One message on the broker. `chain` holds the links still to send after success."""

    id: int
    task: str
    kwargs: dict[str, Any]
    deliver_at: float
    retries: int = 0
    chain: tuple[tuple[str, dict[str, Any]], ...] = ()
    expires_at: float | None = None
    origin: str = ""

    def label(self) -> str:
        args = ",".join(f"{k}={_short(v)}" for k, v in sorted(self.kwargs.items()))
        tail = f" r{self.retries}" if self.retries else ""
        return f"#{self.id} {self.task.removeprefix(names.PREFIX)}({args}){tail}"


def _short(value: object) -> str:
    text = str(value)
    if isinstance(value, dict):
        text = ",".join(f"{k}={_short(v)}" for k, v in sorted(value.items()))
    return text[:8] if len(text) == 36 else text


@dataclass
class Broker:
    """Holds pending messages; faults decide what a send really does."""

    sim: Host
    pending: list[Message] = field(default_factory=list)
    _next_id: int = 0
    sent: int = 0
    lost: int = 0
    coalesced: int = 0

    def push(
        self,
        task: str,
        kwargs: dict[str, Any],
        *,
        delay: float = 0.0,
        chain: tuple[tuple[str, dict[str, Any]], ...] = (),
        retries: int = 0,
        expires_in: float | None = None,
        origin: str = "",
        faulty: bool = True,
    ) -> bool:
        """Put a message on the broker (subject to the profile's message faults)."""
        sim = self.sim
        faults = sim.faults
        rng = sim.rng_msg
        self.sent += 1
        if task == names.ASSIGN_NEXT_JOB and any(m.task == task for m in self.pending):
            # A kick while one is still queued is redundant: the queued one runs later and
            # sees every row this one would see. (Saves most of the simulation's time.)
            self.coalesced += 1
            return True
        if (
            task == names.DELIVER_CALLBACKS
            and not retries
            and any(
                m.task == task and m.deliver_at <= sim.clock.t + delay and not m.retries
                for m in self.pending
            )
        ):
            # The same for a delivery kick after a commit: one already due delivers what
            # this one would (the lease makes a second deliverer return at once anyway).
            self.coalesced += 1
            return True
        if faulty:
            if rng.random() < faults.msg_refuse:
                return False
            if rng.random() < faults.msg_drop:
                self.lost += 1
                sim.trace(f"  lost: {task.removeprefix(names.PREFIX)}")
                return True
            if rng.random() < faults.msg_delay:
                delay += rng.uniform(0.0, faults.msg_delay_max_s)
        now = sim.clock.t
        copies = 2 if faulty and rng.random() < faults.msg_dup else 1
        for i in range(copies):
            self._next_id += 1
            self.pending.append(
                Message(
                    id=self._next_id,
                    task=task,
                    kwargs=dict(kwargs),
                    deliver_at=now + delay + (rng.uniform(0.0, 3.0) if i else 0.0),
                    retries=retries,
                    chain=chain,
                    expires_at=None if expires_in is None else now + delay + expires_in,
                    origin=origin,
                )
            )
        return True

    def redeliver(self, message: Message, delay: float) -> None:
        """A message whose worker died before acking it comes back (acks_late)."""
        self.pending.append(replace(message, deliver_at=self.sim.clock.t + delay))

    def due(self, now: float) -> list[Message]:
        return [m for m in self.pending if m.deliver_at <= now]

    def take(self, message: Message) -> None:
        self.pending.remove(message)

    def next_time(self) -> float | None:
        return min((m.deliver_at for m in self.pending), default=None)

    def work_pending(self) -> bool:
        """Messages other than beat's (which never stop)."""
        return any(m.origin != "beat" for m in self.pending)


class SimOutbox:
    """`Runtime.outbox` of one simulated worker process."""

    def __init__(self, broker: Broker, slot: int, *, hooked: bool = True) -> None:
        self.broker = broker
        self.slot = slot
        # Not a hook point: the callback kick sent from a session's after_commit, where a
        # simulated death (an exception) would surface from commit() itself; a real worker
        # dying there just loses the kick, which the message layer's drops cover.
        self.hooked = hooked

    def send(self, task: str, **kwargs: Any) -> bool:
        if self.hooked:
            self.broker.sim.hook("outbox.send", None)
        return self.broker.push(task, kwargs, origin=f"w{self.slot}")

    def start_pipeline(self, job_id: str, net_name: str, attempt: int) -> None:
        self.broker.sim.hook("outbox.send", None)
        links = pipeline_links(job_id, net_name, attempt)
        (task, kwargs), rest = links[0], tuple(links[1:])
        self.broker.push(task, kwargs, chain=rest, origin=f"w{self.slot}")


def is_poll(spec: TaskSpec, result: object) -> bool:
    # wait_ready's Step.NOT_READY, or warm_up's Warm.NOT_READY (the same string).
    return spec.polls and step_of(result) == Step.NOT_READY
