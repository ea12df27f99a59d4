"""The message layer standing in for Celery: an outbox that use cases send through, and a
broker that loses, duplicates, delays and reorders messages. What a message runs, and under
which delivery rules, is `app.handlers`' table, the same one `tasks/` registers with Celery.

`on_retry` and `on_failure` are tasks/base.py's hooks around a pipeline step's transient
retries (the retry counted on the job; the job requeued once RETRY_MAX is spent).

A broker outage (`Broker.outages`, windows of simulated time) is what a Redis restart or a
network cut does to Celery: nothing is delivered; a worker's send is refused (the outbox's
`send` reports False, `start_pipeline` raises kombu's OperationalError as Celery's
`apply_async` does once its publish retries are spent); beat's tick is lost (beat reserved
the entry before it failed to send); flip-api's call fails and flip-api sends it again once
the broker is back. A message whose handler ends while the broker is down cannot be
acknowledged, and nothing it sent (a retry, the chain's next link) left the worker: kombu
restores it, at the worker's reconnection or, if that restore fails too, only once Redis's
visibility timeout passes (2 h in production, 2-10 minutes here), and it runs again.

flip-api's calls (origin "flip-api") reach the worker through kombu's json round trip
(`carried`), as Celery's default serializer carries them: a Python caller's UUID or datetime
arrives as that object, not as JSON.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from kombu.exceptions import OperationalError as BrokerUnavailable
from kombu.utils import json as kombu_json

from app import names
from app.publishing import published
from app.runtime import Runtime
from app.sim.host import Host
from app.usecases import retries as step_retries


def pipeline_links(job_id: str, net_name: str, attempt: int) -> list[tuple[str, dict[str, Any]]]:
    """app.celery_app.CeleryOutbox.start_pipeline: scale_up -> wait_ready -> dispatch, each
    bound to the job's attempt."""
    ids = {"job_id": job_id, "net_name": net_name, "attempt": attempt}
    return [(names.SCALE_UP, dict(ids)), (names.WAIT_READY, dict(ids)), (names.DISPATCH, dict(ids))]


def on_retry(rt: Runtime, kw: dict[str, Any], countdown: float) -> None:
    """tasks.base._apply_rules' count (a transient retry of a job's step, and when it
    will be tried again)."""
    if kw.get("job_id"):
        step_retries.count_retry(rt, uuid.UUID(kw["job_id"]), next_try_in_s=countdown)


def on_failure(rt: Runtime, task: str, kw: dict[str, Any], exc: BaseException) -> None:
    """tasks.base.DispatcherTask.on_failure (retries of a transient error exhausted)."""
    if kw.get("job_id"):
        attempt = kw.get("attempt")
        step_retries.requeue_after_transient(
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
    # Celery's task id: the same for the copies of one send (a duplicate delivery) and across
    # its retries (`Task.retry` sends the same id again), unlike `id`, one per copy.
    task_id: int = 0
    # How often its worker was lost holding it (`app.handlers.LOSSES_HEADER`), carried by its
    # retries and copies as Celery carries the header.
    losses: int = 0
    # Its retries after an error (`app.handlers.ERROR_RETRIES_HEADER`), which `on_error`
    # judges and the backoff grows with; `retries` counts readiness polls too, as Celery's.
    error_retries: int = 0
    # Subject to the profile's message faults; a world's own sends that must reach the worker
    # (tests/sim's band worlds) are not, nor are their retries.
    faulty: bool = True
    # Celery's positional arguments: none from this package; a caller may send a request
    # by name with its payload positional (tests.sim.kombu_values' misshapen requests).
    args: tuple[Any, ...] = ()
    # Celery's task id as the sender named it (`send_task(task_id=...)`: flip-api may name its
    # own, of any length and content), carried by its copies and retries; "" for one Celery
    # made up, which the handler is given as `sim-{task_id}`.
    named_id: str = ""

    def message_id(self) -> str:
        """The task id its handler is given (`Handler.kwargs`' message id)."""
        return self.named_id or f"sim-{self.task_id}"

    def label(self) -> str:
        args = ",".join(
            [f"[{_short(v)}]" for v in self.args]
            + [f"{k}={_short(v)}" for k, v in sorted(self.kwargs.items())]
        )
        tail = f" r{self.retries}" if self.retries else ""
        return f"#{self.id} {self.task.removeprefix(names.PREFIX)}({args}){tail}"


def _short(value: object) -> str:
    text = str(value)
    if isinstance(value, dict):
        text = ",".join(f"{k}={_short(v)}" for k, v in sorted(value.items()))
    return text[:8] if len(text) == 36 else text


def carried(kwargs: dict[str, Any]) -> dict[str, Any]:
    """flip-api's call as its worker gets it: through Celery's json serializer (kombu's
    `dumps` and `loads`), which makes a tuple a list and carries a UUID, datetime, date,
    time, Decimal or bytes as `{"__type__": ...}`, decoded back to that Python object. Plain
    JSON values come back as they were."""
    return cast(dict[str, Any], _kombu_loads(_kombu_dumps(kwargs)))


# kombu.utils.json's own signatures are untyped.
_kombu_dumps = cast(Callable[[object], str], kombu_json.dumps)
_kombu_loads = cast(Callable[[str], object], kombu_json.loads)


@dataclass
class Broker:
    """Holds pending messages; faults decide what a send really does."""

    sim: Host
    pending: list[Message] = field(default_factory=list)
    _next_id: int = 0
    sent: int = 0
    lost: int = 0
    coalesced: int = 0
    outages: list[tuple[float, float]] = field(default_factory=list)  # (from, until)

    def down_until(self, t: float) -> float | None:
        """The end of the broker outage under way at `t`, if one is."""
        return next((end for start, end in self.outages if start <= t < end), None)

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
        task_id: int | None = None,
        losses: int = 0,
        error_retries: int = 0,
        args: tuple[Any, ...] = (),
        named_id: str = "",
    ) -> bool:
        """Put a message on the broker (subject to the profile's message faults)."""
        sim = self.sim
        faults = sim.faults
        rng = sim.rng_msg
        self.sent += 1
        if origin == "flip-api":
            kwargs = carried(kwargs)
            if args:
                args = tuple(carried({"args": list(args)})["args"])
        back = self.down_until(sim.clock.t + delay) if self.outages else None
        if back is not None:
            if origin == "flip-api":
                # Its send_task failed; flip-api sends the same call again once it can.
                delay = back - sim.clock.t + sim.rng_msg.uniform(0.5, 5.0)
            else:
                sim.trace(f"  refused (broker down): {task.removeprefix(names.PREFIX)}")
                return False
        if task == names.ASSIGN_NEXT_JOB and any(
            m.task == task and m.deliver_at <= sim.clock.t + delay for m in self.pending
        ):
            # A kick while one is still queued is redundant: the queued one runs later and
            # sees every row this one would see. (Saves most of the simulation's time.) Not
            # one due later, such as an unacknowledged round restored only when the
            # visibility timeout passes: a real broker delivers the new one meanwhile
            # (racy seed 7095 of the b9eb150 sweep: no assign round for 541 s).
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
        sent_as = task_id if task_id is not None else self._next_id + 1
        for i in range(copies):
            self._next_id += 1
            self.pending.append(
                Message(
                    id=self._next_id,
                    task_id=sent_as,
                    task=task,
                    kwargs=dict(kwargs),
                    deliver_at=now + delay + (rng.uniform(0.0, 3.0) if i else 0.0),
                    retries=retries,
                    chain=chain,
                    expires_at=None if expires_in is None else now + delay + expires_in,
                    origin=origin,
                    losses=losses,
                    error_retries=error_retries,
                    faulty=faulty,
                    args=args,
                    named_id=named_id,
                )
            )
        return True

    def redeliver(self, message: Message, delay: float) -> None:
        """A message whose worker died before acking it comes back (acks_late)."""
        self.pending.append(replace(message, deliver_at=self.sim.clock.t + delay))

    def restore_unacked(self, message: Message, back: float) -> None:
        """A message whose handler ended while the broker was down (its ack, and whatever
        it sent, never left the worker) comes back after the outage: restored at the
        worker's reconnection, or once the visibility timeout passes."""
        rng = self.sim.rng_msg
        late = rng.uniform(120.0, 600.0) if rng.random() < 0.5 else rng.uniform(1.0, 5.0)
        self.sim.trace(f"   unacked (broker down): {message.label()} back in {late:.0f}s")
        self.pending.append(replace(message, deliver_at=back + late))

    def due(self, now: float) -> list[Message]:
        if self.outages and self.down_until(now) is not None:
            return []  # the workers cannot consume
        return [m for m in self.pending if m.deliver_at <= now]

    def take(self, message: Message) -> None:
        self.pending.remove(message)

    def next_time(self) -> float | None:
        first = min((m.deliver_at for m in self.pending), default=None)
        if first is None or not self.outages:
            return first
        # Due (now or at `first`) while the broker is down: deliverable once it is back.
        back = self.down_until(max(first, self.sim.clock.t))
        return first if back is None else back

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
        """`CeleryOutbox.send`: the product's own `published` around Celery's send."""
        if self.hooked:
            self.broker.sim.hook("outbox.send", None)
        return published(task, lambda: self._publish(task, kwargs))

    def start_pipeline(self, job_id: str, net_name: str, attempt: int) -> bool:
        """`CeleryOutbox.start_pipeline`: the product's `published` around the chain."""
        self.broker.sim.hook("outbox.send", None)
        links = pipeline_links(job_id, net_name, attempt)
        (task, kwargs), rest = links[0], tuple(links[1:])
        return published(task, lambda: self._publish(task, kwargs, rest))

    def _publish(
        self, task: str, kwargs: dict[str, Any], chain: tuple[tuple[str, dict[str, Any]], ...] = ()
    ) -> None:
        """Celery's send: a refusal raises what `apply_async` raises once its publish
        retries are spent."""
        if not self.broker.push(task, kwargs, chain=chain, origin=f"w{self.slot}"):
            raise BrokerUnavailable("[Errno 111] Connection refused (simulated broker)")
