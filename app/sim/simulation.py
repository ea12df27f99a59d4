"""A deterministic, seeded simulation of the whole dispatcher: the REAL use cases and
tables on an in-memory copy of the migrated schema, driven by a simulated clock, a message
layer standing in for Celery (app.sim.messages), beat ticks, a caller (flip-api:
app.sim.caller), and fake servers, drivers and admin clients (app.sim.servers,
app.sim.cluster, app.sim.admin) that are slow, fail (as the fault profile says), lose replies
and restart.

A simulation may be given a checker (its invariants, checked after every step: the
harness's `Checker`, tests/sim) and an adversary (its moments: faults scheduled, races and
pauses at hook points, redeploys); `fl-dispatcher simulate` replays a trace with neither.

Everything random comes from `random.Random` streams seeded from the seed (the workload,
the world's delays, the faults, the message order), nothing reads the wall clock, nothing
iterates a set, and there are no threads: a seed replays exactly.

    result = Simulation(world, workload, CLEAN, seed=0).run()
    assert result.ok, result.summary()
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import insert

from app import names
from app.db import session_factory, unit_of_work
from app.handlers import Kind, beat_loops
from app.runtime import Runtime
from app.schemas import job_id_for
from app.settings import Settings
from app.sim import worker_start
from app.sim.bounds import Bounds
from app.sim.bundles import FakeS3, LocalBundle, remove_tree, serving
from app.sim.caller import Caller
from app.sim.calm import Calm
from app.sim.clock import ProcessClock, SimClock
from app.sim.cluster import Cluster
from app.sim.db import memory_db, scratch_dir
from app.sim.delivery import Delivery
from app.sim.deployment import Declared, always_on, settings_for
from app.sim.fast_forward import FastClock
from app.sim.faults import HUMAN_FIX_DELAY_S, FaultProfile
from app.sim.flower_admin import admin_for
from app.sim.interleaving import HookedSessions, Interleaving
from app.sim.messages import Broker, Message, SimOutbox
from app.sim.operator import Operator
from app.sim.receiver import Outage, SimReceiver, random_receiver
from app.sim.report import Result, Violation
from app.sim.state import WorldState
from app.sim.view import Checks, Moves
from app.sim.worker_start import WorkerStart
from app.sim.workload import JobSpec, Workload, WorldSpec
from app.usecases import callbacks as callbacks_uc
from app.usecases.callbacks import receiver as callback_receiver_uc
from models import CallbackReceiver

T = TypeVar("T")
SETTLED_TICKS = 3  # the world must stay at rest this many beat ticks at the end


_SIMULATIONS = itertools.count()  # each simulation's folder in this process


class Simulation:
    """A world (nets, settings), a workload, a fault profile and a seed; `run()` plays it,
    checked by `checker` and played against by `adversary` if given."""

    def __init__(
        self,
        world: WorldSpec,
        workload: Workload,
        profile: FaultProfile,
        seed: int,
        *,
        checker: Checks[Simulation] | None = None,
        adversary: Moves[Simulation] | None = None,
        tracing: bool = False,
        fail_fast: bool = False,
        fast_forward: bool = False,
    ) -> None:
        if fast_forward and (not profile.clean or adversary is not None):
            # Skipping beat ticks would skip the faults they would have met.
            raise ValueError("fast_forward needs a fault-free profile and no adversary")
        self.world = world
        self.fail_fast = fail_fast
        self.fast_forward = fast_forward
        self.workload = workload
        self.profile = profile
        self.faults = profile  # the profile, or its quiet copy once the workload has ended
        self.seed = seed
        self.tracing = tracing
        self.lines: list[str] = []
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str]] = set()
        self.rng = random.Random(f"{seed}/faults")
        self.rng_msg = random.Random(f"{seed}/messages")
        self.clock = SimClock()
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
            flower_rng=random.Random(f"{seed}/flower"),
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
        self.settings = self._settings()
        self._scales: dict[str, bool] = {}
        self._declared: dict[str | None, bool] = {}
        self._jobs = {str(job_id_for(j.key)): j for j in workload.jobs}
        self._events: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.running: list[int] = []  # worker slots of the messages being processed
        self.current: list[Message] = []  # the messages being processed, outermost first
        self.dead: set[int] = set()  # slots whose current message was killed
        self.stalled: int | None = None  # the slot of a stalled worker
        self.resumed: tuple[str, float] | None = None  # see app.sim.view.SimView
        self.starting_worker = False
        self.draining = False
        self.rest_not_before = 0.0  # the run ends at rest only from then on (flower_faults)
        self.receiver: SimReceiver = random_receiver(self, seed, profile, world, workload.horizon_s)
        if world.receiver_failures_before:
            self._receiver_down_before(world.receiver_failures_before)
        self.checker = checker
        self.adversary = adversary
        self.caller = Caller(self)
        self.delivery = Delivery(self)
        self.fast = FastClock(self)
        self.interleaving = Interleaving(self)
        self.operator = Operator(self)
        self._unhook = ExitStack()  # the runtimes' listeners, removed when the run ends
        self.workers = [self._runtime(slot) for slot in (0, 1)]
        self.starts = WorkerStart(self)
        if adversary is not None:
            adversary.start(self)
        self.restart_worker(0, "start")
        self.bounds = self._bounds()
        self.state = WorldState(self)
        if checker is not None:
            checker.start(self)
        self.ready_seen: dict[tuple[str, str], str] = {}  # (job, net) -> assigned_at seen ready
        counted = ("steps", "messages", "retries", "kills", "interleaved", "escapes")
        self.stats: dict[str, int | float] = dict.fromkeys(counted, 0)
        self._beats = [(h.name, period) for h, period in beat_loops(self.settings)]
        self._next_beat = [period for _, period in self._beats]  # each loop's next tick

    # --- wiring ------------------------------------------------------------------------------

    def _runtime(self, slot: int) -> Runtime:
        # A sessionmaker per worker process, as each has its own (the callback kick listens).
        factory = session_factory(self.engine) if self.world.callbacks else self.sessions
        rt = Runtime(
            settings=self.settings,
            engine=self.engine,
            sessions=factory,
            clock=self.process_clocks[slot],
            monotonic=lambda: self.clock.t,
            driver_factory=lambda net, _s: self.cluster.drivers[net.name],
            admin_factory=lambda net, _s: admin_for(self.cluster, net),
            outbox=SimOutbox(self.broker, slot),
            callback_sender=self.receiver,
        )
        if self.world.callbacks:
            kicker = dataclasses.replace(rt, outbox=SimOutbox(self.broker, slot, hooked=False))
            self._unhook.callback(callbacks_uc.send_after_commit(kicker))
        rt.sessions = HookedSessions(factory, self)  # type: ignore[assignment]
        return rt

    def _settings(self) -> Settings:
        return settings_for(self.world, self.per_job_fl_server, self.declared, self.root)

    def _bounds(self) -> Bounds:
        return Bounds(self.world, self.profile, self.settings, self.declared)

    def _receiver_down_before(self, failures: int) -> None:
        """The world starts in the middle of a long receiver outage: `failures` tries in a
        row have failed, and it stays down a while longer."""
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
        """Record a violation once per (invariant, subject): found by the checker, by the
        delivery of a message (an escaping exception, a lost request) or by a fake."""
        key = (invariant, subject)
        if key in self._seen:
            return
        self._seen.add(key)
        violation = Violation(invariant, self.clock.t, subject, detail)
        self.violations.append(violation)
        self.trace(f"!! {violation.line()}")

    def restart_worker(self, slot: int, why: str) -> None:
        """A (new) worker process: fresh runtime and admin sessions, and the worker_init
        signal's start (app.sim.worker_start: the nets' files checked, MISCONFIGURED nets
        reset or marked again). A stalled worker is replaced: its task dies when it would
        resume."""
        if slot == self.stalled:
            self.dead.add(slot)
        self.workers[slot] = self._runtime(slot)
        self.starts.run(slot)  # its check of the nets' files, then its transaction
        self.trace(f"   worker w{slot} (re)started: {why}")

    def reconfigure(self) -> None:
        """New settings from the world and what NETS declares now (a redeploy's)."""
        self.settings = self._settings()
        self._scales = {}
        self._declared = {}
        self.bounds = self._bounds()

    def apply_settings(self, what: str) -> None:
        """A redeploy (app.sim.operator)."""
        self.operator.redeploy(what)

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
        """Each enqueued job's state by its caller key (as the tables were last read)."""
        return {
            self._jobs[row.id].key: str(row.state)
            for row in self.state.jobs
            if row.id in self._jobs
        }

    def trace(self, line: str) -> None:
        if self.tracing:
            # Hostile payloads put lone surrogates in labels: printable all the same.
            line = line.encode("utf-8", "backslashreplace").decode("utf-8")
            self.lines.append(f"{self.clock.t:8.2f} {line}")

    def at(self, t: float, label: str, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), label, action))

    def next_event_time(self) -> float | None:
        return self._events[0][0] if self._events else None

    # --- the parts, as one calls another (app.sim.view.SimView) -----------------------------

    def hook(self, point: str, net: str | None) -> None:
        self.interleaving.hook(point, net)

    def pause(
        self, slot: int, point: str, length_s: float, done: Callable[[], bool] | None = None
    ) -> None:
        self.interleaving.pause(slot, point, length_s, done)

    def deliver(self, message: Message, slot: int) -> None:
        self.delivery.deliver(message, slot)

    def armed(self) -> bool:
        return bool(self.caller.triggers)

    def fire_triggers(self) -> bool:
        return self.caller.fire_triggers()

    def calm(self) -> Calm:
        return self.fast.calm()

    def poll_delay(self, kwargs: dict[str, Any]) -> float:
        return self.fast.poll_delay(kwargs)

    def on_submit(self, net: str, token: str, folder: Path, *, repeat: bool = False) -> None:
        if self.checker is not None:
            self.checker.on_submit(net, token, folder, repeat=repeat)

    def on_scale(self, net: str, replicas: int) -> None:
        if self.checker is not None:
            self.checker.on_scale(net, replicas)

    def reader(self) -> int | None:
        return self.current[-1].id if self.current else None

    def after_message(self, message: Message, finished: bool) -> None:
        self.cluster.reads_done(message.id, seen=finished)
        if self.checker is not None:
            self.checker.after_message(message, finished)

    def at_hook(self, point: str, net: str | None, fired: bool) -> None:
        if self.adversary is not None:
            self.adversary.at_hook(point, net, fired)

    def excuse(self, kind: Kind, exc: BaseException) -> str | None:
        return self.adversary.excuse(kind, exc) if self.adversary is not None else None

    def refused(self, kind: Kind, exc: BaseException) -> bool:
        return self.adversary is not None and self.adversary.refused(kind, exc)

    # --- the run loop ----------------------------------------------------------------------------

    def run(self) -> Result:
        """Play the workload, then drain until the world is at rest (or a deadline)."""
        return self.run_then(lambda _sim: None)[0]

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
            if self.adversary is not None:
                self.adversary.stop()
            worker_start.reset()  # the product's start record is per process, not per seed
            self._unhook.close()
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

    def _after_step(self) -> None:
        if self.adversary is not None:
            self.adversary.after_step()
        if self.checker is not None:
            self.checker.after_step()

    def step(self, slot: int) -> bool:
        """Deliver one due message (the broker's pick) to the worker in `slot`, then check
        every invariant; False when no message is due."""
        due = self.broker.due(self.clock.t)
        if not due:
            return False
        message = self.rng_msg.choice(due)
        self.broker.take(message)
        self.deliver(message, slot)
        self.stats["steps"] += 1
        if self.caller.triggers:
            self.caller.fire_triggers()
        self.clock.advance(self.rng_msg.uniform(0.01, 0.2))
        self._after_step()
        return True

    def next_change(self) -> float:
        """When the next message, beat tick or scheduled event is due."""
        candidates = [t for t in (self.broker.next_time(), min(self._next_beat)) if t is not None]
        if self._events:
            candidates.append(self._events[0][0])
        return min(candidates)

    def advance(self) -> bool:
        """Nothing is due: move the clock to the next change, run the scheduled events and
        beat ticks due by then, and check every invariant. True if assign's tick fired (a
        beat tick, for the settling count)."""
        beats, next_beat = self._beats, self._next_beat
        if self.fast_forward:
            self.fast.beats_to_skip(beats, next_beat)
        self.clock.advance_to(self.next_change())
        now = self.clock.t
        while self._events and self._events[0][0] <= now:
            _, _, label, action = heapq.heappop(self._events)
            self.trace(f"== {label}")
            action()
        beat_fired = False
        idle: set[str] = set()
        if self.fast_forward and any(t <= now for t in next_beat):
            idle, _ = self.fast.beats_to_skip(beats, list(next_beat))
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
        self._after_step()
        return beat_fired

    def _schedule(self) -> None:
        self.caller.schedule_prewarms()
        if self.adversary is not None:
            self.adversary.moments()
        self.caller.schedule_calls()
        self.at(self.workload.horizon_s, "drain: faults stop", self._drain)

    def _drain(self) -> None:
        """The end of the workload: no new faults (ongoing ones, a broken kit or a partition,
        run their course); later, a human restarts the workers if a net is MISCONFIGURED."""
        self.draining = True
        self.faults = self.profile.quiet()
        self.receiver.quiet = True
        t = self.clock.t
        if self.adversary is not None:
            self.adversary.at_drain()

        self.at(
            t + HUMAN_FIX_DELAY_S,
            "a human restarts the workers if a net is MISCONFIGURED, and redeploys an always-on "
            "net whose server failed to start",
            self.operator.human_fix,
        )

    def _run(self) -> Result:
        self._schedule()
        checker = self.checker
        # Time for the slowest legitimate tail: a human fix, then a job's whole run.
        bounds = self.bounds
        attempts = max(j.max_attempts or self.world.max_attempts for j in self.workload.jobs)
        deadline = self.workload.horizon_s + bounds.liveness_s(attempts)
        if self.workload.prewarms:
            # A hint sent by the horizon holds at most PREWARM_MAX_S, then its net's grace.
            grace = max(bounds.idle.values())
            deadline += self.world.prewarm_max_s + bounds.prewarm_settle + grace
        settled_ticks = 0
        while True:
            if self.step(0):
                if self.fail_fast and self.violations:
                    break
                continue
            beat_fired = self.advance()
            if self.fail_fast and self.violations:
                break
            if beat_fired and self.draining:
                reasons = self.state.unsettled()
                settled_ticks = 0 if reasons else settled_ticks + 1
                if settled_ticks >= SETTLED_TICKS and self.clock.t >= self.rest_not_before:
                    break
                if self.clock.t > max(deadline, self.rest_not_before + bounds.liveness):
                    if checker is not None:
                        checker.quiescence(reasons)
                    break
        if checker is not None:
            checker.at_end()
        self.cluster.advance(self.clock.t)  # timed changes nobody looked at since
        self.stats["sim_s"] = round(self.clock.t, 1)
        self.stats["runs"] = len(self.cluster.runs)
        return Result(
            seed=self.seed,
            profile=self.profile.name,
            violations=list(self.violations),
            stats=dict(self.stats),
            trace=self.lines,
        )
