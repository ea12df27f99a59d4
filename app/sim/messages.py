"""The message layer standing in for Celery: an outbox that use cases send through, and a
broker that loses, duplicates, delays and reorders messages. What a message runs, and under
which delivery rules, is `app.handlers`' table, the same one `tasks/` registers with Celery.

`on_retry` and `on_failure` are tasks/base.py's hooks around a pipeline step's transient
retries (the retry counted on the job; the job requeued once RETRY_MAX is spent).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from app import names
from app.runtime import Runtime
from app.sim.host import Host
from app.usecases import dispatch


def pipeline_links(job_id: str, net_name: str, attempt: int) -> list[tuple[str, dict[str, Any]]]:
    """app.celery_app.CeleryOutbox.start_pipeline: scale_up -> wait_ready -> dispatch, each
    bound to the job's attempt."""
    ids = {"job_id": job_id, "net_name": net_name, "attempt": attempt}
    return [(names.SCALE_UP, dict(ids)), (names.WAIT_READY, dict(ids)), (names.DISPATCH, dict(ids))]


def on_retry(rt: Runtime, kw: dict[str, Any], countdown: float) -> None:
    """tasks.base._apply_rules' count (a transient retry of a job's step, and when it
    will be tried again)."""
    if kw.get("job_id"):
        dispatch.count_retry(rt, uuid.UUID(kw["job_id"]), next_try_in_s=countdown)


def on_failure(rt: Runtime, task: str, kw: dict[str, Any], exc: BaseException) -> None:
    """tasks.base.DispatcherTask.on_failure (retries of a transient error exhausted)."""
    if kw.get("job_id"):
        attempt = kw.get("attempt")
        dispatch.requeue_after_transient(
            rt,
            uuid.UUID(kw["job_id"]),
            f"{task}: retries exhausted: {exc}",
            net_name=kw.get("net_name"),
            attempt=int(attempt) if attempt is not None else None,
        )


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
