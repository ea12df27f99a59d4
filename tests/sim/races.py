"""The adversary's moments at a hook point (a `Simulation` calls `at_hook` after its own
physics there: the call's latency, a worker killed, the caller's armed calls): the other
worker runs a due message meanwhile (preferably one that races with this one), this worker
stalls while the world moves on, a scale call is answered late, or a pipeline step's last
try is paused past its call's timeout."""

from __future__ import annotations

import random

from app import names
from app.errors import DriverTransientError, ServerUnavailable, TransientError
from app.handlers import HANDLERS, Kind
from app.sim.messages import Message
from app.sim.simulation import Simulation

# Where a last try's worker stalls (app.sim.faults.last_try_stall), and the error its call
# then gives: a submit after the server took it, a scale call before the platform heard it.
_LAST_TRY_POINTS: dict[str, type[TransientError]] = {
    "admin.submit.after": ServerUnavailable,
    "driver.scale": DriverTransientError,
}


class Races:
    """Interleavings and pauses at hook points, each on a random stream of its own (drawn only
    where the profile has them, so the other profiles' seeds are unchanged)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        seed = sim.seed
        self._rng_stall = random.Random(f"{seed}/stall")  # drawn only where stalls happen
        self._rng_last_try = random.Random(f"{seed}/last-try")  # only at a step's last try
        self._rng_slow_scale = random.Random(f"{seed}/slow-scale")  # only at a scale call
        self._last_try_seen: set[int] = set()

    def at_hook(self, point: str, net: str | None, fired: bool) -> None:
        """Inside a worker, at `point` (`fired`: a caller's call armed for this moment was
        just sent): another worker may run a message, or this one may pause."""
        sim = self.sim
        faults = sim.faults
        slot = sim.running[-1]
        if (
            faults.interleave
            and len(sim.running) == 1
            # Inside a bundle fetch this worker holds the job's cache lock (flock): another
            # worker would wait for it, which one thread cannot model (it would deadlock).
            and not point.startswith("s3.")
            and not sim.conn.in_transaction
            # A caller's message sent at this very moment is taken by another worker at
            # once half the time: that is the race the trigger was armed for.
            and sim.rng.random() < (0.5 if fired else faults.interleave)
        ):
            due = sim.broker.due(sim.clock.t)
            if due:
                message = self._pick_concurrent(due)
                sim.broker.take(message)
                sim.stats["interleaved"] += 1
                if sim.tracing:
                    sim.trace(f"   || w1 runs {message.label()} during {point}")
                sim.deliver(message, 1)
        if (
            faults.stall
            and len(sim.running) == 1
            and sim.stalled is None
            # At a call to a server or a driver: where a task acts on what it read before
            # (a claim, a lease, a snapshot of runs), the moment a pause matters.
            and point.startswith(("admin.", "driver."))
            and not sim.conn.in_transaction
            and self._rng_stall.random() < faults.stall
        ):
            sim.pause(slot, point, self._rng_stall.uniform(30.0, faults.stall_max_s))
        if (
            faults.slow_scale_call
            and point == "driver.scale"
            and len(sim.running) == 1
            and sim.stalled is None
            and not sim.conn.in_transaction
            and self._rng_slow_scale.random() < faults.slow_scale_call
        ):
            # The platform answers late and the call lands then: the same pause to the
            # worker, its length drawn around the lease its stop holds (STUCK_AFTER_S).
            stuck = sim.settings.stuck_after_s
            sim.pause(slot, point, self._rng_slow_scale.uniform(5.0, 2 * stuck))
        if faults.last_try_stall and point in _LAST_TRY_POINTS and self._last_try_stalls(point):
            sim.pause(slot, point, self._rng_last_try.uniform(30.0, 60.0))
            sim.trace(f"   zz w{slot}'s {point} timed out while it was paused")
            raise _LAST_TRY_POINTS[point](f"{net}: {point} timed out, worker paused (simulated)")

    def _last_try_stalls(self, point: str) -> bool:
        """The last try of a pipeline step (its retries spent), at its first server or driver
        call, on a random stream of its own (seeds without last tries are unchanged)."""
        sim = self.sim
        if len(sim.running) != 1 or sim.stalled is not None or sim.conn.in_transaction:
            return False
        message = sim.current[-1]
        spec = HANDLERS[message.task]
        # Its retries after an error, not its polls (wait_ready's, warm_up's).
        if spec.kind is not Kind.PIPELINE or message.error_retries < sim.settings.retry_max:
            return False
        if message.id in self._last_try_seen:
            return False
        self._last_try_seen.add(message.id)
        return self._rng_last_try.random() < sim.faults.last_try_stall

    def _pick_concurrent(self, due: list[Message]) -> Message:
        """The message another worker runs now: half the time one that conflicts with the
        current one (same job, or a claim/scale step against housekeeping), since races
        between those are the ones that matter."""
        outer = self.sim.current[0]
        conflicting = [m for m in due if _conflicts(outer, m)]
        rng = self.sim.rng_msg
        if conflicting and rng.random() < 0.7:
            return rng.choice(conflicting)
        return rng.choice(due)


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
