"""A deterministic, seeded simulation of the whole dispatcher: the REAL use cases and
tables on an in-memory copy of the migrated schema, driven by a simulated clock, a message
layer standing in for Celery (app.sim.messages), beat ticks, a caller (flip-api), and fake
servers, drivers and admin clients (app.sim.servers, app.sim.cluster, app.sim.admin) that
are slow, fail, lose replies and restart. The invariants (app.sim.invariants) are checked
after every step.

Everything random comes from `random.Random` streams seeded from the seed (the workload,
the world's delays, the faults, the message order), nothing reads the wall clock, nothing
iterates a set, and there are no threads: a seed replays exactly.

    result = Simulation.from_seed(123).run()
    assert result.ok, result.report()
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Callable
from typing import TypeVar

from app import names
from app.db import session_factory, unit_of_work
from app.handlers import beat_loops
from app.runtime import Runtime
from app.schemas import job_id_for
from app.settings import Settings
from app.sim import dbfaults
from app.sim.admin import SimAdmin
from app.sim.adversary import Adversary
from app.sim.bundles import FakeS3, LocalBundle, remove_tree, serving
from app.sim.call_invariants import CallInvariants
from app.sim.clock import ProcessClock, SimClock
from app.sim.cluster import Cluster
from app.sim.db import memory_db, scratch_dir
from app.sim.delivery import Delivery
from app.sim.deployment import always_on, settings_for
from app.sim.fast_forward import FastForward
from app.sim.faults import FaultProfile, profile_for_seed
from app.sim.interleaving import HookedSessions, Interleaving
from app.sim.invariants import Checker
from app.sim.messages import Broker, Message, SimOutbox
from app.sim.prewarms import with_prewarms
from app.sim.receiver import Outage, SimReceiver, random_receiver
from app.sim.redeploy import Declared
from app.sim.report import Result
from app.sim.workload import (
    JobSpec,
    NetSpec,
    Workload,
    WorldSpec,
    random_workload,
    random_world,
)
from app.usecases import callback_receiver as callback_receiver_uc
from app.usecases import callbacks as callbacks_uc
from app.usecases import services

T = TypeVar("T")
SETTLED_TICKS = 3  # the world must stay at rest this many beat ticks at the end


_SIMULATIONS = itertools.count()  # each simulation's folder in this process


class Simulation(Interleaving, Delivery, FastForward, Adversary, CallInvariants):
    """A world (nets, settings), a workload, a fault profile and a seed; `run()` plays it."""

    def __init__(
        self,
        world: WorldSpec,
        workload: Workload,
        profile: FaultProfile,
        seed: int,
        *,
        tracing: bool = False,
        fail_fast: bool = False,
        check_invariants: bool = True,
        fast_forward: bool = False,
    ) -> None:
        if fast_forward and not profile.clean:
            # Skipping beat ticks would skip the faults they would have met.
            raise ValueError("fast_forward needs a fault-free profile")
        self.world = world
        self.fail_fast = fail_fast
        self.check_invariants = check_invariants
        self.fast_forward = fast_forward
        self.workload = workload
        self.profile = profile
        self.faults = profile
        self.seed = seed
        self.tracing = tracing
        self.lines: list[str] = []
        self.rng = random.Random(f"{seed}/faults")
        self.rng_msg = random.Random(f"{seed}/messages")
        self.clock = SimClock()
        # Each worker process reads its own clock (one may be stepped: FaultProfile.clock_step_p).
        self.process_clocks = [ProcessClock(self.clock), ProcessClock(self.clock)]
        self.engine, self.conn = memory_db()
        self.sessions = session_factory(self.engine)
        self.cluster = Cluster(
            self,
            (*world.nets, *world.spare),
            random.Random(f"{seed}/world"),
            crash_rng=random.Random(f"{seed}/crash-before-submit"),
            deaf_rng=random.Random(f"{seed}/deaf-runs"),
            start_rng=random.Random(f"{seed}/slow-starts"),
        )
        self.broker = Broker(self)
        self.per_job_fl_server = world.per_job_fl_server
        self.declared = Declared(list(world.nets), {})
        self.root = scratch_dir() / f"sim-{next(_SIMULATIONS)}"
        bundles = random.Random(f"{seed}/bundles")
        placeholders = bundles.random() < 0.5
        reproducible = bundles.random() < 0.5
        self.local_bundle = LocalBundle(self.root / "jobs", self, reproducible=reproducible)
        self.s3 = FakeS3(self, placeholders=placeholders)
        adversary = random.Random(f"{seed}/bundle-adversary")
        self._bundle_adversary = (
            adversary if not profile.clean and adversary.random() < 0.5 else None
        )
        self.settings = self._settings()
        self._scales: dict[str, bool] = {}
        self._declared: dict[str | None, bool] = {}
        self._jobs = {str(job_id_for(j.key)): j for j in workload.jobs}
        self._events: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._stack: list[int] = []  # worker slots of the messages being processed
        self._dead: set[int] = set()  # slots whose current message was killed
        self._rng_stall = random.Random(f"{seed}/stall")  # drawn only where stalls happen
        self._rng_last_try = random.Random(f"{seed}/last-try")  # only at a step's last try
        self._rng_slow_scale = random.Random(f"{seed}/slow-scale")  # only at a scale call
        self._last_try_seen: set[int] = set()
        self._net_events_at_start: dict[int, int] = {}
        self._stalled: int | None = None  # the slot of a stalled worker
        # Where the running worker last resumed from a stall, and after how long; cleared at
        # its next hook point (so an adapter call can tell it was paused right before it).
        self._resumed: tuple[str, float] | None = None
        # Late scale-downs each message's step made: (net, its index in the driver's calls).
        self._late_stops: dict[int, list[tuple[str, int]]] = {}
        self.receiver: SimReceiver = random_receiver(
            self,
            random.Random(f"{seed}/receiver"),
            workload.horizon_s,
            faulty=not profile.clean or world.receiver_failures_before > 0,
        )
        if world.receiver_failures_before:
            self._receiver_down_before(world.receiver_failures_before)
        self.workers = [self._runtime(slot) for slot in (0, 1)]
        self._db_faults = (
            dbfaults.DatabaseFaults(self, self.engine, seed) if profile.db_error else None
        )
        self._restart_worker(0, "start")
        self.checker = Checker(self)
        self.ready_seen: dict[tuple[str, str], str] = {}  # (job, net) -> assigned_at seen ready
        self.stats: dict[str, int | float] = dict.fromkeys(
            ("steps", "messages", "retries", "kills", "interleaved", "escapes"), 0
        )
        self._flip_window: tuple[float, float] | None = None
        self._triggers: list[tuple[str, str, str, Callable[[], None]]] = []
        self._current: list[Message] = []  # the messages being processed, outermost first
        self._draining = False
        self.claim_prewarms = False  # a replay's hints are its trace's alone
        self._beats = [(h.name, period) for h, period in beat_loops(self.settings)]
        self._next_beat = [period for _, period in self._beats]  # each loop's next tick

    @classmethod
    def from_seed(
        cls,
        seed: int,
        profile: FaultProfile | None = None,
        *,
        tracing: bool = False,
        fail_fast: bool = False,
    ) -> Simulation:
        """The seed's random world, workload and (unless given) fault profile."""
        profile = profile or profile_for_seed(seed)
        rng = random.Random(f"{seed}/workload")
        world = random_world(rng)
        workload = random_workload(rng, world, abort_p=profile.abort_p, report_p=profile.report_p)
        # Half the worlds run without the awaited-run poll (QUEUED_POLL_S=0, a supported
        # setting): both ways must keep every invariant. Its own generator leaves the world
        # and the workload of every seed as they were before the poll existed.
        poll = random.Random(f"{seed}/queued-poll").choice((0.0, 1.0))
        world = dataclasses.replace(world, queued_poll_s=poll)
        # A third of the worlds hold a finished run's server for flip-api's results report
        # (RELEASE_AFTER=reported), so reports and aborts meet FINISHING jobs too.
        extra = random.Random(f"{seed}/world-extra")
        if extra.random() < 0.35:
            world = dataclasses.replace(
                world, release_after="reported", report_timeout_s=extra.choice((20.0, 60.0))
            )
        # Where NETS may change, the platform often runs a net NETS declares only later.
        if profile.redeploy_p and extra.random() < 0.5:
            world = dataclasses.replace(world, spare=(NetSpec("net-z", idle_timeout_s=20.0),))
        # Half the worlds declare each net's sites (a job needing site-9 is then refused at
        # enqueue, where the nets' sites are known).
        if extra.random() < 0.5:
            nets = tuple(dataclasses.replace(n, declares_sites=True) for n in world.nets)
            world = dataclasses.replace(world, nets=nets)
        # Most worlds push job status to a callback receiver (app.usecases.callbacks); some
        # start in the middle of a receiver outage thousands of tries long.
        if extra.random() < 0.6:
            world = dataclasses.replace(
                world,
                callbacks=True,
                callback_max_backoff_s=extra.choice((4.0, 8.0, 30.0)),
                receiver_failures_before=1020 if extra.random() < 0.1 else 0,
            )
        # A third of the worlds get prewarm hints and cancels at any moment, on a stream of
        # their own (app.sim.prewarms): the others run exactly as before.
        world, workload = with_prewarms(seed, world, workload)
        sim = cls(world, workload, profile, seed, tracing=tracing, fail_fast=fail_fast)
        sim.claim_prewarms = True  # and hints at a claim's instant (app.sim.claim_prewarms)
        return sim

    # --- wiring ------------------------------------------------------------------------------

    def _runtime(self, slot: int) -> Runtime:
        # A sessionmaker per worker process, as each has its own: the callback kick after
        # commit (app.celery_app.celery_runtime installs it) listens on it.
        factory = session_factory(self.engine) if self.world.callbacks else self.sessions
        rt = Runtime(
            settings=self.settings,
            engine=self.engine,
            sessions=factory,
            clock=self.process_clocks[slot],
            driver_factory=lambda net, _s: self.cluster.drivers[net.name],
            admin_factory=lambda net, _s: SimAdmin(self.cluster, net.name),
            outbox=SimOutbox(self.broker, slot),
            callback_sender=self.receiver,
        )
        if self.world.callbacks:
            kicker = dataclasses.replace(rt, outbox=SimOutbox(self.broker, slot, hooked=False))
            callbacks_uc.send_after_commit(kicker)
        rt.sessions = HookedSessions(factory, self)  # type: ignore[assignment]
        return rt

    def _settings(self) -> Settings:
        return settings_for(self.world, self.per_job_fl_server, self.declared, self.root)

    def _receiver_down_before(self, failures: int) -> None:
        """The world starts in the middle of a long receiver outage: `failures` tries in a
        row have failed, and it stays down a while longer."""
        from sqlalchemy import insert

        from models import CallbackReceiver

        with unit_of_work(self.sessions) as session:
            session.execute(
                insert(CallbackReceiver).values(
                    id=callback_receiver_uc.RECEIVER_ID,
                    failures=failures,
                    next_attempt_at=self.clock(),
                    last_error="ConnectError: connection refused (before the simulation)",
                )
            )
        self.receiver.outages.append(Outage(0.0, self.receiver.rng.uniform(100.0, 170.0), "down"))

    def report(self, invariant: str, subject: str, detail: str) -> None:
        """A violation found by a fake (the receiver)."""
        self.checker.report(invariant, subject, detail)

    def _restart_worker(self, slot: int, why: str) -> None:
        """A (new) worker process: fresh runtime and admin sessions, and the worker_init
        signal's sync_nets(at_start=True), which resets MISCONFIGURED nets. A stalled worker
        is replaced: its task dies when it would resume."""
        if slot == self._stalled:
            self._dead.add(slot)
        self.workers[slot] = self._runtime(slot)
        # A real worker whose start fails on the database starts again: not a case here.
        faults = getattr(self, "_db_faults", None)
        if faults is not None:
            faults.paused = True
        try:
            with unit_of_work(self.sessions) as session:
                services.sync_nets(session, self.settings, self.clock(), at_start=True)
        finally:
            if faults is not None:
                faults.paused = False
        self.trace(f"   worker w{slot} (re)started: {why}")

    def scales_to_zero(self, net: str) -> bool:
        """The settings' verdict; False for a net NETS no longer declares (the dispatcher
        does not scale it: its server is the operator's)."""
        cached = self._scales.get(net)
        if cached is None:
            declared = self.settings.has_net(net)
            cached = self._scales[net] = declared and not always_on(self.settings, net)
        return cached

    def declared_net(self, net: str | None) -> bool:
        declared = self._declared.get(net)
        if declared is None:
            declared = self._declared[net] = self.settings.has_net(net)
        return declared

    def job_spec(self, job_id: str) -> JobSpec | None:
        return self._jobs.get(job_id)

    def job_states(self) -> dict[str, str]:
        """Each enqueued job's state by its caller key (as the checker last read it)."""
        return {
            self._jobs[row.id].key: str(row.state)
            for row in self.checker.jobs
            if row.id in self._jobs
        }

    def trace(self, line: str) -> None:
        if self.tracing:
            # Hostile payloads put lone surrogates in labels: printable all the same.
            line = line.encode("utf-8", "backslashreplace").decode("utf-8")
            self.lines.append(f"{self.clock.t:8.2f} {line}")

    def at(self, t: float, label: str, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), label, action))

    # --- the run loop ----------------------------------------------------------------------------

    def run(self) -> Result:
        """Play the workload, then drain until the world is at rest (or a deadline)."""
        import logging

        logging.disable(logging.CRITICAL)
        try:
            with serving(self.s3):
                return self._run()
        finally:
            logging.disable(logging.NOTSET)
            if self._db_faults is not None:
                self._db_faults.remove()
            self.engine.dispose(close=False)
            self.conn.close()
            remove_tree(self.root)

    def run_then(self, read: Callable[[Simulation], T]) -> tuple[Result, T]:
        """`run()`, then `read(self)` while the database is still open (figures a caller
        wants from the tables the run left behind)."""
        import logging

        logging.disable(logging.CRITICAL)
        try:
            with serving(self.s3):
                result = self._run()
            return result, read(self)
        finally:
            logging.disable(logging.NOTSET)
            if self._db_faults is not None:
                self._db_faults.remove()
            self.engine.dispose(close=False)
            self.conn.close()
            remove_tree(self.root)

    def _callbacks_pending(self) -> bool:
        """A job event or a refused enqueue not settled yet (callbacks._pending_events)."""
        row = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM job_events e LEFT JOIN callback_cursors c"
            " ON c.job_id = e.job_id WHERE e.id > coalesce(c.settled_through, 0)),"
            " EXISTS (SELECT 1 FROM rejected_requests WHERE callback_settled_at IS NULL)"
        ).fetchone()
        return bool(row[0] or row[1])

    def _maybe_awaited(self) -> bool:
        """A QUEUED job and a run under way: monitor_awaited_runs may have work."""
        row = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'QUEUED'),"
            " EXISTS (SELECT 1 FROM jobs WHERE state IN ('RUNNING', 'ABORTING'))"
        ).fetchone()
        return bool(row[0] and row[1])

    def _step(self, slot: int) -> bool:
        """Deliver one due message (the broker's pick) to the worker in `slot`, then check
        every invariant; False when no message is due."""
        due = self.broker.due(self.clock.t)
        if not due:
            return False
        message = self.rng_msg.choice(due)
        self.broker.take(message)
        self._deliver(message, slot)
        self.stats["steps"] += 1
        if self._triggers:
            self._fire_triggers()
        self.clock.advance(self.rng_msg.uniform(0.01, 0.2))
        self._maybe_flip()
        if self.check_invariants:
            self.checker.check()
        return True

    def _next_change(self) -> float:
        """When the next message, beat tick or scheduled event is due."""
        candidates = [t for t in (self.broker.next_time(), min(self._next_beat)) if t is not None]
        if self._events:
            candidates.append(self._events[0][0])
        return min(candidates)

    def _advance(self) -> bool:
        """Nothing is due: move the clock to the next change, run the scheduled events and
        beat ticks due by then, and check every invariant. True if assign's tick fired (a
        beat tick, for the settling count)."""
        beats, next_beat = self._beats, self._next_beat
        if self.fast_forward:
            self._beats_to_skip(beats, next_beat)
        self.clock.advance_to(self._next_change())
        now = self.clock.t
        while self._events and self._events[0][0] <= now:
            _, _, label, action = heapq.heappop(self._events)
            self.trace(f"== {label}")
            action()
        beat_fired = False
        idle: set[str] = set()
        if self.fast_forward and any(t <= now for t in next_beat):
            idle, _ = self._beats_to_skip(beats, list(next_beat))
        for i, (task, period) in enumerate(beats):
            if next_beat[i] <= now:
                next_beat[i] += period
                beat_fired = beat_fired or i == 0
                if task in idle:
                    continue  # fast_forward: it would read the tables and do nothing
                if task == names.DELIVER_CALLBACKS and not self._callbacks_pending():
                    continue  # the sweep would read, find nothing due, and return
                if task == names.MONITOR_AWAITED_RUNS and not self._maybe_awaited():
                    # Nothing queued behind a run: the poll would only read the tables
                    # (sending it every second would swamp the sweep's message order).
                    continue
                self.broker.push(task, {}, expires_in=period, origin="beat")
        self._maybe_flip()
        if self.check_invariants:
            self.checker.check()
        return beat_fired

    def _run(self) -> Result:
        self._schedule()
        checker = self.checker
        # Time for the slowest legitimate tail: a human fix, then a job's whole run.
        attempts = max(j.max_attempts or self.world.max_attempts for j in self.workload.jobs)
        deadline = self.workload.horizon_s + checker.liveness_s(attempts)
        if self.workload.prewarms:
            # A hint sent by the horizon holds at most PREWARM_MAX_S, then its net's grace.
            grace = max(checker.bounds.idle.values())
            deadline += self.world.prewarm_max_s + checker.bounds.prewarm_settle + grace
        settled_ticks = 0
        while True:
            if self._step(0):
                if self.fail_fast and checker.violations:
                    break
                continue
            beat_fired = self._advance()
            if self.fail_fast and checker.violations:
                break
            if beat_fired and self._draining:
                reasons = checker.unsettled()
                settled_ticks = 0 if reasons else settled_ticks + 1
                if settled_ticks >= SETTLED_TICKS:
                    break
                if self.clock.t > deadline:
                    checker.quiescence(reasons)
                    break
        if self.check_invariants:
            checker.storable()
            checker.refused_once()
        self.cluster.advance(self.clock.t)  # timed changes nobody looked at since
        self.stats["sim_s"] = round(self.clock.t, 1)
        self.stats["runs"] = len(self.cluster.runs)
        return Result(
            seed=self.seed,
            profile=self.profile.name,
            violations=list(checker.violations),
            stats=dict(self.stats),
            trace=self.lines,
        )


def run_seed(
    seed: int,
    profile: FaultProfile | None = None,
    *,
    tracing: bool = False,
    fail_fast: bool = False,
) -> Result:
    """One seed, from scratch (fail_fast: stop at the first violation)."""
    return Simulation.from_seed(seed, profile, tracing=tracing, fail_fast=fail_fast).run()
