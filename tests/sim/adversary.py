"""The adversary: what goes wrong in a world, and when. It schedules the faults the seed's
profile draws (servers killed, partitions, broken kits and drivers, drift, bundle changes,
lost submit replies, outages of an always-on net, a PER_JOB_FL_SERVER flip, redeploys, a
poison row), hints sent at a claim's very instant and bursts (the sweep's prewarm worlds),
replaces a bundle between two attempts of a job, races another worker against the running
one or pauses it at hook points (tests.sim.races), and fails database statements
(tests.sim.dbfaults). `Simulation(..., adversary=Adversary())`; the workload's own calls are the
caller's (app.sim.caller), the drain at the horizon the simulation's."""

from __future__ import annotations

import functools
import random
from typing import Any

from sqlalchemy import event

from app.handlers import Kind
from app.sim.bundles import S3_DEFINITION
from app.sim.db import Unchanged
from app.sim.simulation import Simulation
from app.sim.state import _uuid
from models import NetState
from tests.sim import (
    abort_blip,
    bursts,
    claim_prewarms,
    dbfaults,
    drains,
    early_abort,
    flower_faults,
    gone_bundle,
    kits,
    kombu_values,
    late_starts,
    left_starts,
    link_out,
    long_queue,
    misfit,
    platform_faults,
    poison,
    refusal_repeat,
    repeats,
    stale_starts,
    unnameable,
)
from tests.sim.call_invariants import CallInvariants
from tests.sim.races import Races
from tests.sim.redeploy import plan as plan_redeploys


class Adversary:
    """The moments of a seed's profile, played against one simulation."""

    sim: Simulation

    def start(self, sim: Simulation) -> None:
        """Act on `sim` from now on (before its first worker starts)."""
        self.sim = sim
        seed = sim.seed
        adversary = random.Random(f"{seed}/bundle-adversary")
        self._bundle_adversary = (
            adversary if not sim.profile.clean and adversary.random() < 0.5 else None
        )
        self._requeues_seen = 0  # the last job event read for requeues
        self._requeues_read = Unchanged(sim.conn)  # (no row written since: none to read)
        self._flip_window: tuple[float, float] | None = None
        self._races = Races(sim)
        self._db_faults = (
            dbfaults.DatabaseFaults(sim, sim.engine, seed) if sim.profile.db_error else None
        )
        event.listen(sim.engine, "handle_error", self._poison_refused)
        flower = flower_faults.plan(seed, sim.world, sim.profile)
        self._flower = None if flower is None else flower_faults.FlowerAdversary(sim, flower)
        self._kits = kits.KitAdversary(sim)
        self._left_start = left_starts.LeftStart(sim)
        self._platform_fault = platform_faults.PlatformFault(sim)
        self._early_abort = early_abort.EarlyAbort(sim)  # (round 16: its own band)
        self._gone_bundle = gone_bundle.GoneBundle(sim)  # (round 16: its own band)
        self._late_start = late_starts.LateStart(sim)
        self.refusal_repeat = refusal_repeat.RefusalRepeat(sim)  # (round 17: its own band)
        self.kombu_values = kombu_values.KombuValues(sim, self._gone_bundle)  # (round 17)
        self.stale_start = stale_starts.StaleStart(sim)  # (round 19: its own band)
        self.abort_blip = abort_blip.AbortBlip(sim)  # (round 22: its own band)
        self.link_out = link_out.LinkOut(sim)  # (round 23: its own band)
        misfits = flower is not None and flower.misfit is not None
        self._misfit = misfit.MisfitAdversary(sim, flower) if misfits and flower else None

    def stop(self) -> None:
        """Take the database faults' listeners off the engine (the process's, shared)."""
        if self._db_faults is not None:
            self._db_faults.remove()
        self._early_abort.stop()
        self.refusal_repeat.stop()
        event.remove(self.sim.engine, "handle_error", self._poison_refused)

    def _poison_refused(self, context: Any) -> None:
        """What the handler read of a run's end so far is not written when the poison row
        refuses its write (chaos seed 791: a monitor round read a run's end, the poison
        refused the job's row, a partition then hid the server past the grace and the job
        was rightly requeued as lost): it did not see that end, as with a database error
        (`dbfaults.DatabaseFaults`)."""
        reader = self.sim.reader()
        if reader is not None and poison.POISON in str(context.original_exception):
            self.sim.cluster.unsee_reads(reader)

    def moments(self) -> None:
        """Hints at a claim's instant and bursts (armed), then the profile's faults."""
        sim = self.sim
        claim_prewarms.schedule(sim, sim.caller.arm)
        bursts.schedule(sim, sim.caller.arm, sim.caller.enqueue_payload)
        repeats.schedule(sim, sim.caller.arm)
        drains.schedule(sim)
        unnameable.schedule(sim)  # (round 16: its own band)
        long_queue.schedule(sim)  # (round 20: its own band)
        self.refusal_repeat.schedule()
        self.kombu_values.schedule()
        self.stale_start.schedule()
        self.abort_blip.schedule()
        self.link_out.schedule()
        self._kits.schedule()
        self._schedule_faults()

    def at_hook(self, point: str, net: str | None, fired: bool) -> None:
        """Races and pauses at a hook point (tests.sim.races), then the Flower faults'
        (tests.sim.flower_faults: their own stream, drawn only at a Flower net's start-run);
        at a commit inside a worker's start, the other worker's claim (tests.sim.kits). An
        admin call is the checker's first (`misconfigured-net-called`): it draws nothing."""
        if point == "start.commit":
            self._kits.at_start_commit()
            return
        checker = self.sim.checker
        if point.startswith("admin.") and net is not None and isinstance(checker, CallInvariants):
            checker.at_admin_call(point, net)
        self._gone_bundle.at_hook(point, net)
        self.stale_start.at_hook(point, net)
        self.refusal_repeat.at_hook(point)  # (round 22: a copy at a refusal's record)
        self._races.at_hook(point, net, fired)
        if self._flower is not None:
            self._flower.at_hook(point, net)
        if self._misfit is not None:
            self._misfit.at_hook(point, net)
        self.abort_blip.at_hook(point, net)  # last: its error ends the call

    def after_step(self) -> None:
        """The flip's moment, a bundle change between two attempts of a job, and a Flower
        fault that never ends (tests.sim.flower_faults)."""
        self._maybe_flip()
        self._left_start.after_step()
        self._platform_fault.after_step()
        self._gone_bundle.after_step()
        self._late_start.after_step()
        self.stale_start.after_step()
        if self._flower is not None:
            self._flower.after_step()
        if self._bundle_adversary is not None and not self._requeues_read.holds():
            for event_id, job_hex in self.sim.conn.execute(
                "SELECT id, job_id FROM job_events WHERE id > ? AND to_state = 'QUEUED'"
                " AND from_state IS NOT NULL ORDER BY id",
                (self._requeues_seen,),
            ).fetchall():
                self._requeues_seen = event_id
                self.on_requeued(_uuid(job_hex))

    def at_drain(self) -> None:
        """A flip still waiting for its moment happens now."""
        if self._flip_window is not None:
            self._flip_window = (self._flip_window[0], self.sim.clock.t)
            self._maybe_flip()

    def excuse(self, kind: Kind, exc: BaseException) -> str | None:
        """A database error or a poison row it injected, out of a task whose work another
        message redoes (or which is about the poisoned row)."""
        if dbfaults.excused(kind, exc):
            return "a database error"
        if poison.excused(kind, exc):
            return "a poison row"
        return None

    def refused(self, kind: Kind, exc: BaseException) -> bool:
        """The poison row's refusal: a caller's request about that job fails with it."""
        return poison.excused(kind, exc)

    def on_requeued(self, job_id: str) -> None:
        """The adversary's moment for a bundle change: between two attempts of a job (in
        half the worlds, half the time)."""
        sim = self.sim
        if not self._bundle_adversary or self._bundle_adversary.random() < 0.5:
            return
        spec = sim.job_spec(job_id)
        if spec is None:
            return
        which = sim.s3 if spec.definition == S3_DEFINITION else sim.local_bundle
        sim.trace(f"== bundle {spec.definition} replaced between attempts of {job_id[:8]}")
        which.replace()

    def _schedule_faults(self) -> None:
        sim = self.sim
        p = sim.profile
        horizon = sim.workload.horizon_s
        rng = random.Random(f"{sim.seed}/events")
        for net in sim.world.nets:
            name = net.name
            for _ in range(_poisson(rng, p.restart_rate * horizon / 3600)):
                down = rng.uniform(3.0, 15.0)
                sim.at(
                    rng.uniform(0, horizon),
                    f"server {name} killed and restarted",
                    functools.partial(self._crash, name, down),
                )
            for _ in range(_poisson(rng, p.partition_rate * horizon / 3600)):
                length = rng.uniform(10.0, p.partition_max_s)
                sim.at(
                    rng.uniform(0, horizon),
                    f"network partition of {name} ({length:.0f}s)",
                    functools.partial(self._partition, name, length),
                )
            for _ in range(_poisson(rng, p.kit_broken_rate * horizon / 3600)):
                length = rng.uniform(30.0, 150.0)
                sim.at(
                    rng.uniform(0, horizon),
                    f"admin kit of {name} broken ({length:.0f}s)",
                    functools.partial(self._break_kit, name, length),
                )
            for _ in range(_poisson(rng, p.driver_broken_rate * horizon / 3600)):
                length = rng.uniform(20.0, 90.0)
                sim.at(
                    rng.uniform(0, horizon),
                    f"driver of {name} misconfigured ({length:.0f}s)",
                    functools.partial(self._break_driver, name, length),
                )
            for _ in range(_poisson(rng, p.drift_rate * horizon / 3600)):
                sim.at(
                    rng.uniform(0, horizon),
                    f"someone scales {name} by hand",
                    functools.partial(self._drift, name),
                )
        changes = random.Random(f"{sim.seed}/bundle-changes")
        if not p.clean and changes.random() < 0.5:
            for _ in range(changes.randint(1, 3)):
                which = changes.choice((sim.local_bundle, sim.s3))
                sim.at(
                    changes.uniform(0, horizon),
                    f"bundle {which.bundle.definition} replaced",
                    which.replace,
                )
        outage = random.Random(f"{sim.seed}/outage")
        for net in sim.world.nets:
            if net.kind == "static" and p.outage_p and outage.random() < p.outage_p:
                length = outage.uniform(90.0, p.outage_max_s)
                label = f"always-on {net.name} unreachable ({length:.0f}s)"
                send = functools.partial(self._partition, net.name, length)
                arm = functools.partial(sim.caller.arm, f"net:{net.name}", "BUSY", label, send)
                sim.at(outage.uniform(0, horizon / 2), f"{label} once BUSY", arm)
        loss = random.Random(f"{sim.seed}/reply-loss")
        for net in sim.world.nets:
            for _ in range(_poisson(loss, p.reply_loss_rate * horizon / 3600)):
                start = loss.uniform(0, horizon)
                window = (start, start + loss.uniform(30.0, 100.0))
                sim.cluster.servers[net.name].reply_loss.append(window)
                sim.trace(f"== submit replies of {net.name} lost {window[0]:.0f}-{window[1]:.0f}s")
        if rng.random() < p.settings_flip:
            start = rng.uniform(30.0, horizon - 30.0)
            self._flip_window = (start, start + rng.uniform(30.0, 120.0))
        plan_redeploys(self.sim, random.Random(f"{sim.seed}/redeploy"), p.redeploy_p)
        poison.schedule(self.sim, sim.caller.arm)
        broker = random.Random(f"{sim.seed}/broker")
        if p.broker_outage_p and broker.random() < p.broker_outage_p:
            for _ in range(broker.randint(1, 2)):
                length = broker.uniform(5.0, 90.0)
                start = broker.uniform(0.0, max(1.0, horizon - length))
                sim.broker.outages.append((start, start + length))
                sim.trace(f"== broker down {start:.0f}-{start + length:.0f}s")
        steps = random.Random(f"{sim.seed}/clock")
        if p.clock_step_p and steps.random() < p.clock_step_p:
            slot = steps.randrange(len(sim.process_clocks))
            step = steps.uniform(1.0, 30.0) * steps.choice((-1.0, 1.0))
            # A worker ahead of beat by more than a beat period finds every beat message
            # expired (Celery judges `expires` by the worker's clock): a documented limit
            # (app/entrypoints/README.md, clock skew), seen as ended-run-settled on flaky
            # seed 100 with a 25.6 s step. Forward steps stay under a second; backward ones
            # go to 30 s.
            step = min(step, steps.uniform(0.1, 1.0)) if step > 0 else step
            start = steps.uniform(0.0, horizon)
            back = start + steps.uniform(20.0, 180.0)
            stepped = functools.partial(self._step_clock, slot, step)
            put_right = functools.partial(self._step_clock, slot, 0.0)
            sim.at(start, f"w{slot}'s clock stepped {step:+.1f}s", stepped)
            sim.at(back, f"w{slot}'s clock put right", put_right)

    def _step_clock(self, slot: int, offset: float) -> None:
        self.sim.process_clocks[slot].offset = offset

    def _crash(self, net: str, down_s: float) -> None:
        sim = self.sim
        sim.cluster.crash(net, sim.clock.t, down_s)

    def _drift(self, net: str) -> None:
        """Drift between the nets table and the platform: a hand-made scale change."""
        sim = self.sim
        driver = sim.cluster.drivers[net]
        if driver.pinned:
            return
        sim.cluster.advance(sim.clock.t)
        target = 0 if driver.desired or driver.running else 1
        sim.trace(f"   {net}: desired {driver.desired} -> {target} by hand")
        driver.apply(target, sim.clock.t)
        driver.by_hand = target == 0

    def _partition(self, net: str, length: float) -> None:
        sim = self.sim
        sim.cluster.servers[net].partition(sim.clock.t, sim.clock.t + length)

    def _break_kit(self, net: str, length: float) -> None:
        sim = self.sim
        sim.cluster.servers[net].kit_broken = True
        sim.at(sim.clock.t + length, f"admin kit of {net} fixed", lambda: self._fix_kit(net))

    def _fix_kit(self, net: str) -> None:
        self.sim.cluster.servers[net].kit_broken = False

    def _break_driver(self, net: str, length: float) -> None:
        sim = self.sim
        sim.cluster.drivers[net].broken = True
        sim.at(
            sim.clock.t + length,
            f"driver of {net} fixed",
            lambda: setattr(sim.cluster.drivers[net], "broken", False),
        )

    def _maybe_flip(self) -> None:
        """A redeploy that flips PER_JOB_FL_SERVER, preferably while a net is STOPPING or
        UNHEALTHY (the adversary picks the moment within its window)."""
        sim = self.sim
        if self._flip_window is None:
            return
        start, end = self._flip_window
        t = sim.clock.t
        if t < start:
            return
        states = {r[0] for r in sim.conn.execute("SELECT state FROM nets")}
        if t < end and not states & {NetState.STOPPING.value, NetState.UNHEALTHY.value}:
            return
        self._flip_window = None
        sim.per_job_fl_server = not sim.per_job_fl_server
        sim.apply_settings(f"PER_JOB_FL_SERVER={sim.per_job_fl_server} (nets {sorted(states)})")


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
