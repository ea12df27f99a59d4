"""Where a task may be interrupted, and what happens there. Every adapter call, new session
and send is a hook point: the simulation spends the call's latency there, kills the worker
(WorkerKilled), lets the other worker run a message meanwhile (preferably one that races
with this one), or stalls this worker while the world moves on."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app import names
from app.errors import DriverTransientError, ServerUnavailable, TransientError
from app.handlers import HANDLERS, Kind
from app.sim.host import SimHost
from app.sim.messages import Message

# Where a last try's worker stalls (app.sim.faults.last_try_stall), and the error its call
# then gives: a submit after the server took it, a scale call before the platform heard it.
_LAST_TRY_POINTS: dict[str, type[TransientError]] = {
    "admin.submit.after": ServerUnavailable,
    "driver.scale": DriverTransientError,
}


class WorkerKilled(BaseException):
    """The worker process died here (SIGKILL): nothing after this point runs on it.

    A BaseException, so no `except Exception` in the code under test swallows it; its
    message is not acked and comes back later (acks_late, reject_on_worker_lost).
    """


class HookedSessions:
    """`Runtime.sessions`: the real sessionmaker, with a hook before every new session (a
    point where another worker may run, or this one may die, between two transactions)."""

    def __init__(self, factory: sessionmaker[Session], sim: SimHost) -> None:
        self._factory = factory
        self._sim = sim

    def __call__(self, **kwargs: Any) -> Session:
        self._sim.hook("db.session", None)
        return self._factory(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory, name)


class Interleaving(SimHost):
    """The hook points' side of a simulation."""

    def hook(self, point: str, net: str | None) -> None:
        """A point where time passes, the worker may die, or another worker may run."""
        faults = self.faults
        slot = self._stack[-1] if self._stack else 0
        self._resumed = None
        if slot in self._dead:
            raise WorkerKilled(point)
        if point.startswith("admin."):
            latency = faults.submit_latency_max_s if point == "admin.submit" else 0.0
            latency += faults.admin_latency_max_s
            if latency:
                self.clock.advance(self.rng.uniform(0.0, latency))
        if not self._stack:
            return  # not inside a worker (the harness itself)
        if faults.worker_kill and self.rng.random() < faults.worker_kill:
            self._dead.add(slot)
            self.stats["kills"] += 1
            self.trace(f"   xx worker w{slot} killed at {point}")
            raise WorkerKilled(point)
        if point.startswith(("admin.", "driver.")) and self.conn.in_transaction:
            self.checker.report(
                "adapter-outside-transaction",
                point,
                f"{point} on net {net} called while a transaction holds the database",
            )
        fired = bool(self._triggers) and not self.conn.in_transaction and self._fire_triggers()
        if (
            faults.interleave
            and len(self._stack) == 1
            # Inside a bundle fetch this worker holds the job's cache lock (flock): another
            # worker would wait for it, which one thread cannot model (it would deadlock).
            and not point.startswith("s3.")
            and not self.conn.in_transaction
            # A caller's message sent at this very moment is taken by another worker at
            # once half the time: that is the race the trigger was armed for.
            and self.rng.random() < (0.5 if fired else faults.interleave)
        ):
            due = self.broker.due(self.clock.t)
            if due:
                message = self._pick_concurrent(due)
                self.broker.take(message)
                self.stats["interleaved"] += 1
                if self.tracing:
                    self.trace(f"   || w1 runs {message.label()} during {point}")
                self._deliver(message, 1)
        if (
            faults.stall
            and len(self._stack) == 1
            and self._stalled is None
            # At a call to a server or a driver: where a task acts on what it read before
            # (a claim, a lease, a snapshot of runs), the moment a pause matters.
            and point.startswith(("admin.", "driver."))
            and not self.conn.in_transaction
            and self._rng_stall.random() < faults.stall
        ):
            self._stall(slot, point, self._rng_stall.uniform(30.0, faults.stall_max_s))
        if (
            faults.slow_scale_call
            and point == "driver.scale"
            and len(self._stack) == 1
            and self._stalled is None
            and not self.conn.in_transaction
            and self._rng_slow_scale.random() < faults.slow_scale_call
        ):
            # The platform answers late and the call lands then: the same pause to the
            # worker, its length drawn around the lease its stop holds (STUCK_AFTER_S).
            stuck = self.settings.stuck_after_s
            self._stall(slot, point, self._rng_slow_scale.uniform(5.0, 2 * stuck))
        if faults.last_try_stall and point in _LAST_TRY_POINTS and self._last_try_stalls(point):
            self._stall(slot, point, self._rng_last_try.uniform(30.0, 60.0))
            self.trace(f"   zz w{slot}'s {point} timed out while it was paused")
            raise _LAST_TRY_POINTS[point](f"{net}: {point} timed out, worker paused (simulated)")

    def _last_try_stalls(self, point: str) -> bool:
        """The last try of a pipeline step (its retries spent), at its first server or driver
        call, on a random stream of its own (seeds without last tries are unchanged)."""
        if len(self._stack) != 1 or self._stalled is not None or self.conn.in_transaction:
            return False
        message = self._current[-1]
        spec = HANDLERS[message.task]
        # A poll's retries count its polls (wait_ready, warm_up): it has no last try.
        polls = message.task in (names.WAIT_READY, names.WARM_UP)
        if spec.kind is not Kind.PIPELINE or polls or message.retries < self.settings.retry_max:
            return False
        if message.id in self._last_try_seen:
            return False
        self._last_try_seen.add(message.id)
        return self._rng_last_try.random() < self.faults.last_try_stall

    def _stall(self, slot: int, point: str, length_s: float) -> None:
        """The worker in `slot` stops at `point` for `length_s`: meanwhile the other worker
        takes every message that comes due, beat ticks and the world's events happen, and
        every invariant is checked as ever. A lease its task holds may pass, and the job may
        move on, before the task resumes. A worker restarted meanwhile (a redeploy) dies
        at the next hook point, its message redelivered."""
        until = self.clock.t + length_s
        self._stalled = slot
        self.stats["stalls"] = self.stats.get("stalls", 0) + 1
        self.trace(f"   zz worker w{slot} stalls {length_s:.0f}s at {point}")
        try:
            while self.clock.t < until and not (self.fail_fast and self.checker.violations):
                if self._step(1 - slot):
                    continue
                if self._next_change() > until:
                    self.clock.advance_to(until)
                    break
                self._advance()
        finally:
            self._stalled = None
        self.trace(f"   zz worker w{slot} resumes at {point}")
        if slot in self._dead:
            raise WorkerKilled(point)
        self._resumed = (point, length_s)

    def _pick_concurrent(self, due: list[Message]) -> Message:
        """The message another worker runs now: half the time one that conflicts with the
        current one (same job, or a claim/scale step against housekeeping), since races
        between those are the ones that matter."""
        outer = self._current[0]
        conflicting = [m for m in due if _conflicts(outer, m)]
        if conflicting and self.rng_msg.random() < 0.7:
            return self.rng_msg.choice(conflicting)
        return self.rng_msg.choice(due)


# Which concurrent messages race with which: housekeeping against claims and scale steps.
_RACES = {
    names.RECONCILE: (names.ASSIGN_NEXT_JOB, names.SCALE_UP),
    names.SCALE_DOWN_IDLE_NETS: (names.ASSIGN_NEXT_JOB, names.SCALE_UP),
    names.MONITOR_RUNNING_JOBS: (
        names.DISPATCH,
        names.ABORT_JOB,
        names.REPORT_JOB_STATUS,
        names.MONITOR_AWAITED_RUNS,
    ),
    names.MONITOR_AWAITED_RUNS: (
        names.DISPATCH,
        names.ABORT_JOB,
        names.REPORT_JOB_STATUS,
        names.MONITOR_RUNNING_JOBS,
    ),
    names.ASSIGN_NEXT_JOB: (names.RECONCILE, names.SCALE_DOWN_IDLE_NETS),
}


def job_of(message: Message) -> str | None:
    """The job a message is about, if any."""
    job = message.kwargs.get("job_id")
    payload = message.kwargs.get("payload")
    if job is None and isinstance(payload, dict):
        job = payload.get("job_id")
    return str(job) if job is not None else None


def _conflicts(outer: Message, other: Message) -> bool:
    job = job_of(outer)
    if job is not None and job_of(other) == job:
        return True
    return other.task in _RACES.get(outer.task, ())
