"""Where a task may be interrupted, and what happens there. Every adapter call, new session
and send is a hook point: the simulation spends the call's latency there, and the profile
may kill the worker (WorkerKilled); the caller's calls armed for the moment a job or net is
in a state are sent; then the adversary, if any, may let the other worker run a message
meanwhile or pause this one (`pause`: the world moves on while it is stalled)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.sim.view import SimView


class WorkerKilled(BaseException):
    """The worker process died here (SIGKILL): nothing after this point runs on it.

    A BaseException, so no `except Exception` in the code under test swallows it; its
    message is not acked and comes back later (acks_late, reject_on_worker_lost).
    """


class TimeLimitKilled(WorkerKilled):
    """Celery's pool killed the task's process at its hard time limit (a statement hung where
    the soft limit's signal could not reach it): unlike a worker lost, its message is
    acknowledged when the task's acks_on_timeout (`ACKS.on_timeout`) says so, else requeued.
    """


class HookedSessions:
    """`Runtime.sessions`: the real sessionmaker, with a hook before every new session (a
    point where another worker may run, or this one may die, between two transactions)."""

    def __init__(self, factory: sessionmaker[Session], sim: SimView) -> None:
        self._factory = factory
        self._sim = sim

    def __call__(self, **kwargs: Any) -> Session:
        self._sim.hook("db.session", None)
        return self._factory(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory, name)


class Interleaving:
    """The hook points' side of a simulation."""

    def __init__(self, sim: SimView) -> None:
        self.sim = sim

    def hook(self, point: str, net: str | None) -> None:
        """A point where time passes, the worker may die, or another worker may run."""
        sim = self.sim
        faults = sim.faults
        running = sim.running
        slot = running[-1] if running else 0
        sim.resumed = None
        if slot in sim.dead:
            raise WorkerKilled(point)
        if point.startswith("admin."):
            latency = faults.submit_latency_max_s if point == "admin.submit" else 0.0
            latency += faults.admin_latency_max_s
            if latency:
                sim.clock.advance(sim.rng.uniform(0.0, latency))
        if not running:
            return  # not inside a worker (the harness itself)
        if faults.worker_kill and sim.rng.random() < faults.worker_kill:
            sim.dead.add(slot)
            sim.stats["kills"] += 1
            sim.trace(f"   xx worker w{slot} killed at {point}")
            raise WorkerKilled(point)
        if point.startswith(("admin.", "driver.")) and sim.conn.in_transaction:
            sim.report(
                "adapter-outside-transaction",
                point,
                f"{point} on net {net} called while a transaction holds the database",
            )
        fired = sim.armed() and not sim.conn.in_transaction and sim.fire_triggers()
        sim.at_hook(point, net, fired)

    def pause(
        self, slot: int, point: str, length_s: float, done: Callable[[], bool] | None = None
    ) -> None:
        """The worker in `slot` stops at `point` for `length_s` (or, given `done`, until the
        world is as the adversary waits for, looked at after every step, `length_s` at
        most): meanwhile the other worker takes every message that comes due, beat ticks and
        the world's events happen, and every invariant is checked as ever. A lease its task
        holds may pass, and the job may move on, before the task resumes. A worker restarted
        meanwhile (a redeploy) dies at the next hook point, its message redelivered."""
        sim = self.sim
        # A pause right after another at the same call (two adversaries' in one hook) is one
        # stall as long as both: the worker has not moved on in between.
        before = sim.resumed[1] if sim.resumed is not None and sim.resumed[0] == point else 0.0
        began = sim.clock.t
        until = sim.clock.t + length_s
        sim.stalled = slot
        sim.stats["stalls"] = sim.stats.get("stalls", 0) + 1
        upto = "up to " if done is not None else ""
        sim.trace(f"   zz worker w{slot} stalls {upto}{length_s:.0f}s at {point}")
        try:
            while (
                sim.clock.t < until
                and not (sim.fail_fast and sim.violations)
                and not (done is not None and done())
            ):
                if sim.step(1 - slot):
                    continue
                if sim.next_change() > until:
                    sim.clock.advance_to(until)
                    break
                sim.advance()
        finally:
            sim.stalled = None
        sim.trace(f"   zz worker w{slot} resumes at {point}")
        if slot in sim.dead:
            raise WorkerKilled(point)
        # How long it stood here: the whole length, or until `done` ended it sooner.
        stood = length_s if done is None else sim.clock.t - began
        sim.resumed = (point, before + stood)
