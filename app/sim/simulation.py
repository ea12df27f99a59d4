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

import contextlib
import dataclasses
import functools
import heapq
import itertools
import json
import math
import random
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from app import names
from app.db import session_factory, unit_of_work
from app.errors import InvalidRequest, MisconfigurationError, NotFound, TransientError
from app.runtime import Runtime
from app.schemas import job_id_for
from app.settings import Settings
from app.sim import messages
from app.sim.admin import SimAdmin
from app.sim.bundles import (
    S3_DEFINITION,
    FakeS3,
    LocalBundle,
    remove_tree,
    serving,
    version_of,
)
from app.sim.clock import SimClock, seconds_of
from app.sim.cluster import Cluster
from app.sim.db import memory_db, scratch_dir
from app.sim.faults import HUMAN_FIX_DELAY_S, FaultProfile, profile_for_seed
from app.sim.invariants import Checker
from app.sim.messages import TASKS, Broker, Message, SimOutbox, TaskSpec
from app.sim.receiver import SECRET, URL, Outage, SimReceiver, random_receiver
from app.sim.redeploy import Declared
from app.sim.redeploy import plan as plan_redeploys
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
from app.usecases import dispatch as dispatch_uc
from app.usecases import services
from app.usecases.dispatch import Step
from models import ASSIGNABLE_NET_STATES, NetState

T = TypeVar("T")
PIPELINE_STEPS_THAT_MARK_MISCONFIGURED = (names.SCALE_UP, names.WAIT_READY, names.DISPATCH)
SETTLED_TICKS = 3  # the world must stay at rest this many beat ticks at the end


_SIMULATIONS = itertools.count()  # each simulation's folder in this process


class WorkerKilled(BaseException):
    """The worker process died here (SIGKILL): nothing after this point runs on it.

    A BaseException, so no `except Exception` in the code under test swallows it; its
    message is not acked and comes back later (acks_late, reject_on_worker_lost).
    """


@dataclass
class Calm:
    """fast_forward's reading of the world between two steps."""

    in_flight: bool = False  # a pipeline, abort, stray, start, stop or message under way
    assign_due: bool = False  # a QUEUED job and a free net it may take
    monitor_due: bool = False  # a run ended, or a job outlived MAX_RUN_S, or a report wait
    awaited_due: bool = False  # monitor_due for a net a QUEUED job could take
    scale_down_due: bool = False  # an idle net past its grace
    reconcile_due: bool = False  # a net to settle, or a job or start past STUCK_AFTER_S
    times: list[float] = field(default_factory=list)  # when the world changes by itself

    def needs(self, task: str) -> bool:
        """Whether a beat loop has anything to do now (keep-alive only pings: always)."""
        if task == names.ASSIGN_NEXT_JOB:
            return self.assign_due
        if task == names.SCALE_DOWN_IDLE_NETS:
            return self.scale_down_due
        if task == names.MONITOR_RUNNING_JOBS:
            return self.monitor_due
        if task == names.MONITOR_AWAITED_RUNS:
            return self.awaited_due
        if task == names.RECONCILE:
            return self.reconcile_due
        return True

    def quiet_until(self, now: float) -> float | None:
        """When nothing is due: the world's next change (None: something is due, or
        nothing will ever change by itself)."""
        if self.in_flight or self.assign_due or self.monitor_due or self.scale_down_due:
            return None
        if self.reconcile_due:
            return None
        until = min(self.times, default=None)
        return until if until is not None and until > now else None


class HookedSessions:
    """`Runtime.sessions`: the real sessionmaker, with a hook before every new session (a
    point where another worker may run, or this one may die, between two transactions)."""

    def __init__(self, factory: sessionmaker[Session], sim: Simulation) -> None:
        self._factory = factory
        self._sim = sim

    def __call__(self, **kwargs: Any) -> Session:
        self._sim.hook("db.session", None)
        return self._factory(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._factory, name)


def settings_for(
    world: WorldSpec,
    per_job_fl_server: bool,
    declared: Declared | None = None,
    root: Path | None = None,
) -> Settings:
    """Settings as the deployment's environment would give them, for this world (and what
    NETS declares after redeploys); `root` holds the simulation's job root and data folder
    (its bundles, caches and prepared copies are its own)."""
    kit = scratch_dir() / "kit"
    if not (kit / "startup" / "fed_admin.json").is_file():
        (kit / "startup").mkdir(parents=True, exist_ok=True)
        (kit / "startup" / "fed_admin.json").write_text("{}")
    if root is None:
        root = scratch_dir()
        # A minimal bundle as NVFLARE exports one: an app folder and a meta.json deploy map.
        (root / "jobs" / "job" / "app" / "config").mkdir(parents=True, exist_ok=True)
        (root / "jobs" / "job" / "meta.json").write_text(
            '{"name": "job", "deploy_map": {"app": ["@ALL"]}, "min_clients": 2}'
        )
    nets = []
    per_job = declared.per_job if declared is not None else {}
    for net in declared.nets if declared is not None else world.nets:
        driver: dict[str, object] = {"kind": net.kind}
        if net.kind == "ecs":
            driver |= {"region": "eu-west-2", "cluster": "sim", "service": f"fl-{net.name}"}
        nets.append(
            {
                "name": net.name,
                "driver": driver,
                "admin": {"kit_dir": str(kit), "username": "admin"},
                "required_sites": list(net.sites),
                "idle_timeout_s": net.idle_timeout_s,
                "ready_timeout_s": net.ready_timeout_s,
                "per_job_fl_server": per_job.get(net.name),
                "sites": list(net.sites) if net.declares_sites else None,
            }
        )
    extra: dict[str, Any] = {}
    if world.callbacks:
        extra = {
            "CALLBACK_URL": URL,
            "CALLBACK_SECRET": SECRET,
            "CALLBACK_TIMEOUT_S": 5.0,
            "CALLBACK_MAX_BACKOFF_S": world.callback_max_backoff_s,
        }
    return Settings(
        **extra,
        FL_DISPATCHER_DATA_DIR=root / "data",
        DATABASE_URL="sqlite://",
        JOB_ROOT=root / "jobs",
        NETS=json.dumps(nets),
        PER_JOB_FL_SERVER="true" if per_job_fl_server else "false",
        MAX_ATTEMPTS=world.max_attempts,
        LOST_JOB_POLICY=world.lost_job_policy,
        MAX_RUN_S=world.max_run_s,
        ABORT_TIMEOUT_S=world.abort_timeout_s,  # ignored by code that predates it
        SERVER_LOST_GRACE_S=world.server_lost_grace_s,
        STUCK_AFTER_S=world.stuck_after_s,
        READY_POLL_S=world.ready_poll_s,
        RETRY_MAX=world.retry_max,
        RETRY_BACKOFF_MAX_S=world.retry_backoff_max_s,
        HOUSEKEEPING_INTERVAL_S=world.housekeeping_interval_s,
        KEEP_ALIVE_INTERVAL_S=world.keep_alive_interval_s,
        QUEUED_POLL_S=world.queued_poll_s,
        RELEASE_AFTER=world.release_after,
        REPORT_TIMEOUT_S=world.report_timeout_s,
    )


def beat_loops(world: WorldSpec) -> list[tuple[str, float]]:
    """Beat's schedule as (task, period), assign first: app.celery_app.beat_schedule's, which
    a unit test holds this to (the simulator does not import Celery)."""
    tick = world.housekeeping_interval_s
    beats = [
        (names.ASSIGN_NEXT_JOB, tick),
        (names.SCALE_DOWN_IDLE_NETS, tick),
        (names.MONITOR_RUNNING_JOBS, tick),
        (names.RECONCILE, 2 * tick),
        (names.KEEP_ALIVE_BUSY_NETS, world.keep_alive_interval_s),
    ]
    if world.queued_poll_s > 0:
        beats.append((names.MONITOR_AWAITED_RUNS, world.queued_poll_s))
    if world.callbacks:
        beats.append((names.DELIVER_CALLBACKS, tick))
    return beats


def always_on(settings: Settings, net: str) -> bool:
    """The settings' verdict on a net (one place, as the API for it is changing)."""
    config = settings.net(net)
    flag = getattr(config, "always_on", None)
    if isinstance(flag, bool):
        return flag
    return bool(getattr(settings, "is_always_on")(config))  # noqa: B009 (gone on main)


class Simulation:
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
        self.engine, self.conn = memory_db()
        self.sessions = session_factory(self.engine)
        self.cluster = Cluster(self, (*world.nets, *world.spare), random.Random(f"{seed}/world"))
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
        self._stalled: int | None = None  # the slot of a stalled worker
        self.receiver: SimReceiver = random_receiver(
            self,
            random.Random(f"{seed}/receiver"),
            workload.horizon_s,
            faulty=not profile.clean or world.receiver_failures_before > 0,
        )
        if world.receiver_failures_before:
            self._receiver_down_before(world.receiver_failures_before)
        self.workers = [self._runtime(slot) for slot in (0, 1)]
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
        self._beats = beat_loops(world)
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
        return cls(world, workload, profile, seed, tracing=tracing, fail_fast=fail_fast)

    # --- wiring ------------------------------------------------------------------------------

    def _runtime(self, slot: int) -> Runtime:
        # A sessionmaker per worker process, as each has its own: the callback kick after
        # commit (app.celery_app.celery_runtime installs it) listens on it.
        factory = session_factory(self.engine) if self.world.callbacks else self.sessions
        rt = Runtime(
            settings=self.settings,
            engine=self.engine,
            sessions=factory,
            clock=self.clock,
            driver_factory=lambda net, _s: self.cluster.drivers[net.name],
            admin_factory=lambda net, _s: SimAdmin(self.cluster, net.name),
            outbox=SimOutbox(self.broker, slot),
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
        with unit_of_work(self.sessions) as session:
            services.sync_nets(session, self.settings, self.clock(), at_start=True)
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

    # --- hooks the fakes, sessions and outbox call ------------------------------------------

    def hook(self, point: str, net: str | None) -> None:
        """A point where time passes, the worker may die, or another worker may run."""
        faults = self.faults
        slot = self._stack[-1] if self._stack else 0
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

    def _pick_concurrent(self, due: list[Message]) -> Message:
        """The message another worker runs now: half the time one that conflicts with the
        current one (same job, or a claim/scale step against housekeeping), since races
        between those are the ones that matter."""
        outer = self._current[0]
        conflicting = [m for m in due if _conflicts(outer, m)]
        if conflicting and self.rng_msg.random() < 0.7:
            return self.rng_msg.choice(conflicting)
        return self.rng_msg.choice(due)

    def on_submit(self, net: str, token: str, folder: Path) -> None:
        """A submit reaches a server: it must be for a job whose current assignment to this
        net passed the readiness check (wait_ready), as the chain promises, and carry its
        bundle as it was when this attempt was claimed, or newer."""
        row = self.conn.execute(
            "SELECT state, net_name, assigned_at, submit_token, definition FROM jobs WHERE id = ?",
            (token[:36].replace("-", ""),),
        ).fetchone()
        if row is None:
            return
        state, job_net, assigned_at, job_token, definition = row
        self._check_bundle(token, definition, assigned_at, folder)
        if job_net == net and self.ready_seen.get((token[:36], net)) == assigned_at:
            return
        self.checker.report(
            "submit-after-ready",
            f"job {token[:8]} on {net}",
            f"submit {token[-2:]} reached {net} while the job is {state} on {job_net}"
            f" (token {str(job_token)[-2:]}) without a readiness check for this assignment",
        )

    def _check_bundle(self, token: str, definition: str, assigned_at: str, folder: Path) -> None:
        bundle = self.s3.bundle if definition == S3_DEFINITION else self.local_bundle.bundle
        submitted = version_of(folder)
        claimed = bundle.version_at(seconds_of(datetime.fromisoformat(assigned_at)))
        if submitted is None:
            self.checker.report(
                "submitted-bundle-current",
                f"submit {token[:8]}-{token[37:]}",
                f"the folder it submits ({folder.name}) is gone or has no {definition} VERSION",
            )
        elif submitted < claimed:
            self.checker.report(
                "submitted-bundle-current",
                f"submit {token[:8]}-{token[37:]}",
                f"carries {definition} v{submitted}; v{claimed} was current when this attempt"
                f" was claimed (now v{bundle.version})",
            )

    def on_requeued(self, job_id: str) -> None:
        """The adversary's moment for a bundle change: between two attempts of a job (in
        half the worlds, half the time)."""
        if not self._bundle_adversary or self._bundle_adversary.random() < 0.5:
            return
        spec = self.job_spec(job_id)
        if spec is None:
            return
        which = self.s3 if spec.definition == S3_DEFINITION else self.local_bundle
        self.trace(f"== bundle {spec.definition} replaced between attempts of {job_id[:8]}")
        which.replace()

    def on_scale(self, net: str, replicas: int) -> None:
        """A scale-down must never take a server from under an active job."""
        if replicas:
            return
        row = self.conn.execute(
            "SELECT id, state FROM jobs WHERE net_name = ? AND state IN"
            " ('ASSIGNED', 'DISPATCHING', 'RUNNING', 'ABORTING')",
            (net,),
        ).fetchone()
        if row is not None:
            self.checker.report(
                "no-scale-down-under-job",
                f"net {net}",
                f"scaled to 0 while job {row[0][:8]} is {row[1]} on it",
            )

    # --- the message layer ---------------------------------------------------------------------

    def _deliver(self, message: Message, slot: int) -> None:
        """One delivery of a message to the worker in `slot`, with tasks/base.py's rules."""
        spec = TASKS[message.task]
        if message.expires_at is not None and self.clock.t > message.expires_at:
            if self.tracing:
                self.trace(f"   expired {message.label()}")
            return
        if (
            self.fast_forward
            and message.task == names.ASSIGN_NEXT_JOB
            and not self._calm().assign_due
        ):
            # No QUEUED job has a free net to go to: assign would read and do nothing.
            self.stats["skipped"] = self.stats.get("skipped", 0) + 1
            return
        self.stats["messages"] += 1
        rt = self.workers[slot]
        self._stack.append(slot)
        self._current.append(message)
        try:
            self._run_task(rt, message, spec, slot)
        except WorkerKilled:
            delay = self.rng.uniform(1.0, max(1.0, self.faults.worker_restart_s))
            self.broker.redeliver(message, delay)
            self._dead.discard(slot)
            self._restart_worker(slot, f"after a kill during {message.label()}")
        finally:
            self._stack.pop()
            self._current.pop()

    def _run_task(self, rt: Runtime, message: Message, spec: TaskSpec, slot: int) -> None:
        retry_max = self.settings.retry_max
        if spec.kind == "callbacks":
            self._deliver_callbacks(rt, message, spec, slot)
            return
        try:
            with self._noting_inline_readiness(message):
                result = spec.call(rt, message.kwargs)
        except TransientError as exc:
            if spec.kind != "pipeline":
                self._escaped(message, spec, exc)
                return
            if message.retries + 1 > retry_max:
                self.trace(f"w{slot} {message.label()} -> retries exhausted: {exc}")
                self._call_hook(
                    message,
                    spec,
                    lambda error=exc: messages.on_failure(rt, message.task, message.kwargs, error),
                )
                return
            self.stats["retries"] += 1
            if self.faults.retry_backlog and self.rng_msg.random() < self.faults.retry_backlog:
                # A backlog on the broker: the retry runs well after its countdown, past the
                # lease its try announced, so reconcile may re-send the same submit meanwhile.
                late = self.rng_msg.uniform(30.0, 90.0)
                self.trace(f"w{slot} {message.label()} -> its retry {late:.0f}s late (backlog)")
            else:
                late = 0.0
            countdown = messages.backoff_s(
                self.rng_msg, message.retries, self.settings.retry_backoff_max_s
            )
            self._call_hook(message, spec, lambda: messages.on_retry(rt, message.kwargs, countdown))
            if self.tracing:
                self.trace(f"w{slot} {message.label()} -> retry in {countdown:.0f}s: {exc}")
            self._push_again(message, countdown + late)
            return
        except Exception as exc:
            self._escaped(message, spec, exc)
            return
        if self.tracing:
            self.trace(f"w{slot} {message.label()} -> {_short_result(result)}")
        if messages.is_poll(spec, result):
            self._push_again(message, self._poll_delay(message.kwargs))
            return
        if message.task == names.WAIT_READY and messages.step_of(result) == Step.DONE:
            self._note_ready(message.kwargs)
        if message.chain and not messages.ends_chain(result):
            (task, kwargs), rest = message.chain[0], message.chain[1:]
            self.broker.push(task, kwargs, chain=rest, origin=message.origin)

    def _deliver_callbacks(self, rt: Runtime, message: Message, spec: TaskSpec, slot: int) -> None:
        """tasks.callbacks.deliver_callbacks: deliver, then come back when the use case says
        (a Celery retry with that countdown, no retry limit)."""
        try:
            report = callbacks_uc.deliver_callbacks(rt, self.receiver)
        except Exception as exc:
            self._escaped(message, spec, exc)
            return
        if self.tracing:
            self.trace(f"w{slot} {message.label()} -> {report}")
        if report.retry_in_s is not None:
            self._push_again(message, report.retry_in_s)

    def _poll_delay(self, kwargs: dict[str, Any]) -> float:
        """READY_POLL_S; with fast_forward and a fixed cold start, the whole number of polls
        until the first one that can see the server ready (or the readiness deadline pass):
        the ones in between would answer NOT_READY and write nothing."""
        poll = self.settings.ready_poll_s
        net = kwargs.get("net_name")
        spec = self.job_spec(str(kwargs.get("job_id")))
        if not self.fast_forward or net not in self.cluster.drivers or spec is None:
            return poll
        driver = self.cluster.drivers[net]
        server = driver.server
        cold = server.spec.cold_start
        if cold is None:
            return poll
        never = any(site not in server.spec.sites for site in spec.sites)
        if driver.start_at is not None:
            ready = driver.start_at + cold.login_s + cold.sites_s
        elif driver.running and server.up_at is not None:
            connects = [server.site_connects_at(site) for site in spec.sites]
            ready = max([server.up_at + server.boot_s, *(c for c in connects if c is not None)])
        else:
            return poll
        row = self.conn.execute(
            "SELECT assigned_at FROM jobs WHERE id = ?", (kwargs["job_id"].replace("-", ""),)
        ).fetchone()
        if row is None or row[0] is None:
            return poll
        deadline = (
            seconds_of(datetime.fromisoformat(row[0])) + self.settings.net(net).ready_timeout_s
        )
        target = deadline if never else min(ready, deadline)
        ahead = target - self.clock.t
        return poll if ahead <= poll else math.ceil(ahead / poll) * poll

    def _push_again(self, message: Message, countdown: float) -> None:
        self.broker.push(
            message.task,
            message.kwargs,
            delay=countdown,
            chain=message.chain,
            retries=message.retries + 1,
            origin=message.origin,
        )

    def _call_hook(self, message: Message, spec: TaskSpec, call: Callable[..., None]) -> None:
        """on_retry/on_failure: use-case calls too, so their errors are findings too."""
        try:
            call()
        except Exception as exc:
            self._escaped(message, spec, exc)

    @contextlib.contextmanager
    def _noting_inline_readiness(self, message: Message) -> Iterator[None]:
        """scale_up runs readiness and the submit itself on a warm net (dispatch.start): a
        readiness check that passes inside it counts for `on_submit` as wait_ready's does.
        Noted by the check's own (job, net), so a message interleaved meanwhile is noted
        for itself, never for this one."""
        if message.task != names.SCALE_UP:
            yield
            return
        original = dispatch_uc.check_ready

        def noting(rt: Runtime, job_id: Any, net_name: str, attempt: int, **kw: Any) -> Any:
            result = original(rt, job_id, net_name, attempt, **kw)
            if result.step == Step.DONE:
                self._note_ready({"job_id": str(job_id), "net_name": net_name})
            return result

        dispatch_uc.check_ready = noting
        try:
            yield
        finally:
            dispatch_uc.check_ready = original

    def _note_ready(self, kwargs: dict[str, Any]) -> None:
        row = self.conn.execute(
            "SELECT assigned_at FROM jobs WHERE id = ?", (kwargs["job_id"].replace("-", ""),)
        ).fetchone()
        if row is not None:
            self.ready_seen[(kwargs["job_id"], kwargs["net_name"])] = row[0]

    def _escaped(self, message: Message, spec: TaskSpec, exc: Exception) -> None:
        """An exception left a use case: a finding, unless the design wants it loud."""
        if spec.kind == "public" and isinstance(exc, (InvalidRequest, NotFound)):
            self.trace(f"   {message.label()} rejected: {exc}")
            return
        if (
            isinstance(exc, MisconfigurationError)
            and message.task in PIPELINE_STEPS_THAT_MARK_MISCONFIGURED
            and self._net_state(message.kwargs.get("net_name")) == NetState.MISCONFIGURED
        ):
            self.trace(f"   {message.label()} failed loud (net misconfigured): {exc}")
            return
        self.stats["escapes"] += 1
        where = _app_frame(exc)
        self.checker.report(
            "no-escape",
            f"{message.task.removeprefix(names.PREFIX)}: {type(exc).__name__} at {where}",
            f"{exc}"[:300],
        )

    def _net_state(self, net: str | None) -> NetState | None:
        if net is None:
            return None
        row = self.conn.execute("SELECT state FROM nets WHERE name = ?", (net,)).fetchone()
        return None if row is None else NetState(row[0])

    # --- scheduled events -----------------------------------------------------------------------

    def at(self, t: float, label: str, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), label, action))

    def _schedule(self) -> None:
        for job in self.workload.jobs:
            payload: dict[str, object] = {
                "caller_key": job.key,
                "definition": job.definition,
                "required_sites": list(job.sites),
                "priority": job.priority,
            }
            if job.net is not None:
                payload["net"] = job.net
            if job.metadata is not None:
                payload["metadata"] = job.metadata
            if job.max_attempts is not None:
                payload["max_attempts"] = job.max_attempts
            self.at(
                job.arrive_s,
                f"flip-api enqueues {job.key}",
                self._caller(names.ENQUEUE_JOB, payload),
            )
        for event in self.workload.events:
            job_id = str(job_id_for(event.key))
            if event.kind == "abort":
                task = names.ABORT_JOB
                payload = {"job_id": job_id, "reason": event.text or "aborted by the user"}
                label = f"flip-api aborts {event.key}"
            else:
                task = names.REPORT_JOB_STATUS
                payload = {"job_id": job_id, "status": event.status}
                if event.text:
                    payload["detail"] = event.text
                label = f"flip-api reports {event.key} {event.status}"
            if event.on_state is None:
                self.at(event.at_s, label, self._caller(task, payload))
            else:
                send = self._caller(task, payload)
                self.at(
                    event.at_s,
                    f"{label} once it is {event.on_state}",
                    functools.partial(self._arm, job_id, event.on_state, label, send),
                )
        self._schedule_faults()
        self.at(self.workload.horizon_s, "drain: faults stop", self._drain)

    def _arm(self, job_id: str, state: str, label: str, send: Callable[[], None]) -> None:
        self._triggers.append((job_id.replace("-", ""), state, label, send))

    def _fire_triggers(self) -> bool:
        """Send the caller events waiting for a job state the job is in right now."""
        fired = False
        for trigger in list(self._triggers):
            job_hex, state, label, send = trigger
            row = self.conn.execute("SELECT state FROM jobs WHERE id = ?", (job_hex,)).fetchone()
            if row is not None and row[0] == state:
                self._triggers.remove(trigger)
                self.trace(f"== {label} (now {state})")
                send()
                fired = True
        return fired

    def _caller(self, task: str, payload: dict[str, object]) -> Callable[[], None]:
        # Celery's JSON serializer carries the payload: what survives json.dumps (as kombu
        # calls it) and json.loads is what the task gets.
        sent = json.loads(json.dumps(payload))

        def send() -> None:
            self.broker.push(task, {"payload": sent}, origin="flip-api")

        return send

    def _schedule_faults(self) -> None:
        p = self.profile
        horizon = self.workload.horizon_s
        rng = random.Random(f"{self.seed}/events")
        for net in self.world.nets:
            name = net.name
            for _ in range(_poisson(rng, p.restart_rate * horizon / 3600)):
                down = rng.uniform(3.0, 15.0)
                self.at(
                    rng.uniform(0, horizon),
                    f"server {name} killed and restarted",
                    functools.partial(self._crash, name, down),
                )
            for _ in range(_poisson(rng, p.partition_rate * horizon / 3600)):
                length = rng.uniform(10.0, p.partition_max_s)
                self.at(
                    rng.uniform(0, horizon),
                    f"network partition of {name} ({length:.0f}s)",
                    functools.partial(self._partition, name, length),
                )
            for _ in range(_poisson(rng, p.kit_broken_rate * horizon / 3600)):
                length = rng.uniform(30.0, 150.0)
                self.at(
                    rng.uniform(0, horizon),
                    f"admin kit of {name} broken ({length:.0f}s)",
                    functools.partial(self._break_kit, name, length),
                )
            for _ in range(_poisson(rng, p.driver_broken_rate * horizon / 3600)):
                length = rng.uniform(20.0, 90.0)
                self.at(
                    rng.uniform(0, horizon),
                    f"driver of {name} misconfigured ({length:.0f}s)",
                    functools.partial(self._break_driver, name, length),
                )
            for _ in range(_poisson(rng, p.drift_rate * horizon / 3600)):
                self.at(
                    rng.uniform(0, horizon),
                    f"someone scales {name} by hand",
                    functools.partial(self._drift, name),
                )
        changes = random.Random(f"{self.seed}/bundle-changes")
        if not p.clean and changes.random() < 0.5:
            for _ in range(changes.randint(1, 3)):
                which = changes.choice((self.local_bundle, self.s3))
                self.at(
                    changes.uniform(0, horizon),
                    f"bundle {which.bundle.definition} replaced",
                    which.replace,
                )
        loss = random.Random(f"{self.seed}/reply-loss")
        for net in self.world.nets:
            for _ in range(_poisson(loss, p.reply_loss_rate * horizon / 3600)):
                start = loss.uniform(0, horizon)
                window = (start, start + loss.uniform(30.0, 100.0))
                self.cluster.servers[net.name].reply_loss.append(window)
                self.trace(f"== submit replies of {net.name} lost {window[0]:.0f}-{window[1]:.0f}s")
        if rng.random() < p.settings_flip:
            start = rng.uniform(30.0, horizon - 30.0)
            self._flip_window = (start, start + rng.uniform(30.0, 120.0))
        plan_redeploys(self, random.Random(f"{self.seed}/redeploy"), p.redeploy_p)

    def _crash(self, net: str, down_s: float) -> None:
        self.cluster.crash(net, self.clock.t, down_s)

    def _drift(self, net: str) -> None:
        """Drift between the nets table and the platform: a hand-made scale change."""
        driver = self.cluster.drivers[net]
        if driver.pinned:
            return
        self.cluster.advance(self.clock.t)
        target = 0 if driver.desired or driver.running else 1
        self.trace(f"   {net}: desired {driver.desired} -> {target} by hand")
        driver.apply(target, self.clock.t)

    def _deploy(self, net: str) -> None:
        self.cluster.drivers[net].apply(1, self.clock.t)

    def _partition(self, net: str, length: float) -> None:
        self.cluster.servers[net].partition(self.clock.t, self.clock.t + length)

    def _break_kit(self, net: str, length: float) -> None:
        self.cluster.servers[net].kit_broken = True
        self.at(self.clock.t + length, f"admin kit of {net} fixed", lambda: self._fix_kit(net))

    def _fix_kit(self, net: str) -> None:
        self.cluster.servers[net].kit_broken = False

    def _break_driver(self, net: str, length: float) -> None:
        self.cluster.drivers[net].broken = True
        self.at(
            self.clock.t + length,
            f"driver of {net} fixed",
            lambda: setattr(self.cluster.drivers[net], "broken", False),
        )

    def _maybe_flip(self) -> None:
        """A redeploy that flips PER_JOB_FL_SERVER, preferably while a net is STOPPING or
        UNHEALTHY (the adversary picks the moment within its window)."""
        if self._flip_window is None:
            return
        start, end = self._flip_window
        t = self.clock.t
        if t < start:
            return
        states = {r[0] for r in self.conn.execute("SELECT state FROM nets")}
        if t < end and not states & {NetState.STOPPING.value, NetState.UNHEALTHY.value}:
            return
        self._flip_window = None
        self.per_job_fl_server = not self.per_job_fl_server
        self.apply_settings(f"PER_JOB_FL_SERVER={self.per_job_fl_server} (nets {sorted(states)})")

    def apply_settings(self, what: str) -> None:
        """A redeploy: new settings, every worker restarted with them; an operator deploys
        at 1 replica each scalable net that is always-on now and was not before."""
        t = self.clock.t
        before = {n.name: self.scales_to_zero(n.name) for n in self.declared.nets}
        self.settings = self._settings()
        self._scales = {}
        self._declared = {}
        self.trace(f"== redeploy: {what}")
        for slot in (0, 1):
            self._restart_worker(slot, "redeploy with new settings")
        for net in self.declared.nets:
            if (
                net.kind == "ecs"
                and before.get(net.name, True)
                and not self.scales_to_zero(net.name)
            ):
                # Always-on now: the operator's deploy runs the service at 1 replica.
                delay = self.rng.uniform(0.0, 60.0)
                self.at(
                    t + delay,
                    f"operator deploys {net.name} at 1 replica",
                    functools.partial(self._deploy, net.name),
                )
        self.checker.bounds = type(self.checker.bounds)(self)

    def _drain(self) -> None:
        """The end of the workload: no new faults (ongoing ones, a broken kit or a partition,
        run their course); a human restarts the workers a while later if a net is still
        MISCONFIGURED."""
        self._draining = True
        self.faults = self.profile.quiet()
        self.receiver.quiet = True
        t = self.clock.t
        if self._flip_window is not None:
            self._flip_window = (self._flip_window[0], t)
            self._maybe_flip()

        def human() -> None:
            if self._net_states() & {NetState.MISCONFIGURED}:
                for slot in (0, 1):
                    self._restart_worker(slot, "a human fixed the settings")

        self.at(
            t + HUMAN_FIX_DELAY_S, "a human restarts the workers if a net is MISCONFIGURED", human
        )

    def _net_states(self) -> set[NetState]:
        return {NetState(r[0]) for r in self.conn.execute("SELECT state FROM nets")}

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
            self.engine.dispose(close=False)
            self.conn.close()
            remove_tree(self.root)

    def _calm(self) -> Calm:
        """fast_forward: which beat loops have something to do now, and when the world next
        changes by itself. Read from the tables and the fake world; errs towards "due" (a
        loop run for nothing costs time, never a decision)."""
        calm = Calm()
        drivers = self.cluster.drivers.values()
        if self.broker.work_pending() or self._triggers or self._flip_window is not None:
            calm.in_flight = True
        if any(d.start_at is not None or d.stop_at is not None for d in drivers):
            calm.in_flight = True
            if any(d.stop_at is not None for d in drivers):
                calm.reconcile_due = True  # a scale-down is confirmed by reconcile
        conn = self.conn
        if conn.execute("SELECT 1 FROM stray_runs LIMIT 1").fetchone() is not None:
            calm.in_flight = calm.reconcile_due = True
        t = self.clock.t
        self.cluster.advance(t)
        if self._events:
            calm.times.append(self._events[0][0])
        queued: list[str | None] = []
        active: set[str] = set()
        to_settle: set[str] = set()  # nets with a run monitor would settle or stop now
        # Reconcile acts on a job or a starting net only past STUCK_AFTER_S (its smallest
        # threshold) or ABORT_TIMEOUT_S in that state.
        stuck_s = min(self.world.stuck_after_s, self.world.abort_timeout_s)
        for state, net, requested, nvflare_id, dispatched, changed in conn.execute(
            "SELECT state, net_name, requested_net, nvflare_job_id, dispatched_at,"
            " state_changed_at FROM jobs WHERE state IN ('QUEUED', 'RUNNING', 'ASSIGNED',"
            " 'DISPATCHING', 'FINISHING', 'ABORTING')"
        ):
            if state == "QUEUED":
                queued.append(requested)
                continue
            if net is not None:
                active.add(net)
            if state in ("FINISHING", "ABORTING"):
                calm.monitor_due = True  # monitor settles aborts and report waits
                if state == "ABORTING" and net is not None:
                    to_settle.add(net)
            if state != "RUNNING" or net is None or nvflare_id is None or dispatched is None:
                calm.in_flight = True  # a step of the pipeline, an abort, a report wait
                if t - seconds_of(datetime.fromisoformat(changed)) > stuck_s:
                    calm.reconcile_due = True
                continue
            run = self.cluster.servers[net].store.get(nvflare_id)
            if run is None or not run.live(t):
                calm.monitor_due = True  # ended: the next monitor round settles it
                to_settle.add(net)
                continue
            config = self.settings.net(net)
            max_run_s = config.max_run_s if config.max_run_s is not None else self.world.max_run_s
            deadline = seconds_of(datetime.fromisoformat(dispatched)) + max_run_s
            if deadline <= t:
                calm.monitor_due = True
                to_settle.add(net)
            calm.times.append(deadline)
            if run.end_at is not None:
                calm.times.append(run.end_at)
        calm.awaited_due = any(any(r in (None, n) for r in queued) for n in to_settle)
        for name, state, idle_since, changed in conn.execute(
            "SELECT name, state, idle_since, state_changed_at FROM nets"
        ):
            up = self.cluster.replicas(name) > 0
            if (
                state in ASSIGNABLE_NET_STATES
                and name not in active
                and any(r in (None, name) for r in queued)
            ):
                calm.assign_due = True  # assign places a job there
            if state == "STOPPED" and not up:
                continue
            if state == "BUSY" and name in active and up:
                continue
            if state == "STARTING" and name in active:
                calm.in_flight = True  # a cold start for a job: its pipeline drives it
                if t - seconds_of(datetime.fromisoformat(changed)) > stuck_s:
                    calm.reconcile_due = True
                continue
            if state != "READY" or name in active or not up:
                calm.in_flight = calm.reconcile_due = True  # stopping, unhealthy, drifted...
                continue
            if self.scales_to_zero(name):
                since = seconds_of(datetime.fromisoformat(idle_since or changed))
                expiry = since + self.settings.net(name).idle_timeout_s
                if expiry <= t:
                    calm.scale_down_due = True
                calm.times.append(expiry)
        return calm

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

    def _beats_to_skip(
        self, beats: list[tuple[str, float]], next_beat: list[float]
    ) -> tuple[set[str], Calm]:
        """The beat loops due now that would find nothing to do (not sent), and, when no
        loop has anything to do, every beat moved on to its first tick at or after the
        world's next change (fast_forward)."""
        calm = self._calm()
        skip = {task for task, _ in beats if not calm.needs(task)}
        until = calm.quiet_until(self.clock.t)
        if until is not None:
            for i, (_, period) in enumerate(beats):
                if next_beat[i] < until:
                    next_beat[i] += math.ceil((until - next_beat[i]) / period) * period
        return skip, calm

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


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth), for event counts."""
    if mean <= 0:
        return 0
    limit, k, p = pow(2.718281828459045, -mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _short_result(result: object) -> str:
    step, detail = getattr(result, "step", None), getattr(result, "detail", "")
    if step is not None:
        result = f"{step}: {detail}" if detail else str(step)
    text = repr(result) if not isinstance(result, str) else result
    return text if len(text) < 160 else text[:157] + "..."


def _app_frame(exc: BaseException) -> str:
    """The innermost frame of the code under test (app/, models/) in the traceback."""
    where = "?"
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = Path(frame.filename).parts
        if "app" in parts or "models" in parts:
            if "tests" in parts:
                continue
            idx = max(i for i, p in enumerate(parts) if p in ("app", "models"))
            where = f"{'/'.join(parts[idx:])}:{frame.name}:{frame.lineno}"
    return where


def run_seed(
    seed: int,
    profile: FaultProfile | None = None,
    *,
    tracing: bool = False,
    fail_fast: bool = False,
) -> Result:
    """One seed, from scratch (fail_fast: stop at the first violation)."""
    return Simulation.from_seed(seed, profile, tracing=tracing, fail_fast=fail_fast).run()
