"""The adversary: when the world's events happen. It schedules flip-api's calls (enqueues,
reports and aborts, some armed for the moment a job reaches a state) and the faults the
seed's profile draws (servers killed, partitions, broken kits and drivers, drift, bundle
changes, lost submit replies, a PER_JOB_FL_SERVER flip, redeploys), replaces a bundle
between two attempts of a job, applies new settings as a redeploy does, and at the horizon
stops the faults (drain)."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable

from app import names
from app.schemas import job_id_for
from app.sim import bursts, claim_prewarms, poison
from app.sim.bundles import S3_DEFINITION
from app.sim.faults import HUMAN_FIX_DELAY_S
from app.sim.host import SimHost
from app.sim.redeploy import plan as plan_redeploys
from app.sim.workload import JobSpec
from models import NetState


class Adversary(SimHost):
    """The scheduled events' side of a simulation."""

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

    def _schedule(self) -> None:
        # Hints first: one sent at the moment of its job's submission goes before the job.
        for hint in self.workload.prewarms:
            if hint.cancel:
                cancel = self._caller(names.CANCEL_PREWARM, {"caller_key": hint.key})
                self.at(hint.at_s, f"flip-api cancels prewarm {hint.key}", cancel)
                continue
            prewarm: dict[str, object] = {
                "caller_key": hint.key,
                "within_s": float(hint.within_s),
                "required_sites": list(hint.sites),
            }
            if hint.net is not None:
                prewarm["net"] = hint.net
            label = f"flip-api prewarms for {hint.key}"
            send = self._caller(names.PREWARM, prewarm)
            if hint.on_state is not None and hint.net is not None:
                # Armed on the net's state (a "net:" subject), dropped at the horizon.
                arm = functools.partial(
                    self._arm, f"net:{hint.net}", hint.on_state, f"{label} on {hint.net}", send
                )
                self.at(hint.at_s, f"{label} once {hint.net} is {hint.on_state}", arm)
                continue
            self.at(hint.at_s, label, send)
        claim_prewarms.schedule(self, self._arm)
        bursts.schedule(self, self._arm, self._enqueue_payload)
        sent_later = {k for b in self.workload.bursts for k in (b.plain, b.hinted)}
        for job in self.workload.jobs:
            if job.key in sent_later:
                continue
            payload = self._enqueue_payload(job)
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

    def _enqueue_payload(self, job: JobSpec) -> dict[str, object]:
        """flip-api's enqueue of the job, as Celery's JSON carries it."""
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
        if job.prewarm_key is not None:
            payload["prewarm_key"] = job.prewarm_key
        sent: dict[str, object] = json.loads(json.dumps(payload))
        return sent

    def _arm(self, job_id: str, state: str, label: str, send: Callable[[], None]) -> None:
        subject = job_id if job_id.startswith("net:") else job_id.replace("-", "")
        self._triggers.append((subject, state, label, send))

    def _fire_triggers(self) -> bool:
        """Send the caller events waiting for a job state the job is in right now."""
        fired = False
        for trigger in list(self._triggers):
            if trigger not in self._triggers:
                continue  # fired by a message one of these ran at once (claim_prewarms)
            job_hex, state, label, send = trigger
            if job_hex == bursts.SUBJECT:
                # Two READY nets free and unheld (a burst): dropped at the horizon.
                if self._draining:
                    self._triggers.remove(trigger)
                    continue
                row = (bursts.state(self),)
            elif job_hex.startswith("net:"):
                # A prewarm armed on a net's state: the caller's hints stop at the horizon.
                if self._draining:
                    self._triggers.remove(trigger)
                    continue
                query = "SELECT state FROM nets WHERE name = ?"
                row = self.conn.execute(query, (job_hex[4:],)).fetchone()
            else:
                row = self.conn.execute(
                    "SELECT state FROM jobs WHERE id = ?", (job_hex,)
                ).fetchone()
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
        outage = random.Random(f"{self.seed}/outage")
        for net in self.world.nets:
            if net.kind == "static" and p.outage_p and outage.random() < p.outage_p:
                length = outage.uniform(90.0, p.outage_max_s)
                label = f"always-on {net.name} unreachable ({length:.0f}s)"
                send = functools.partial(self._partition, net.name, length)
                arm = functools.partial(self._arm, f"net:{net.name}", "BUSY", label, send)
                self.at(outage.uniform(0, horizon / 2), f"{label} once BUSY", arm)
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
        poison.schedule(self, self._arm)
        broker = random.Random(f"{self.seed}/broker")
        if p.broker_outage_p and broker.random() < p.broker_outage_p:
            for _ in range(broker.randint(1, 2)):
                length = broker.uniform(5.0, 90.0)
                start = broker.uniform(0.0, max(1.0, horizon - length))
                self.broker.outages.append((start, start + length))
                self.trace(f"== broker down {start:.0f}-{start + length:.0f}s")
        steps = random.Random(f"{self.seed}/clock")
        if p.clock_step_p and steps.random() < p.clock_step_p:
            slot = steps.randrange(len(self.process_clocks))
            step = steps.uniform(1.0, 30.0) * steps.choice((-1.0, 1.0))
            start = steps.uniform(0.0, horizon)
            back = start + steps.uniform(20.0, 180.0)
            self.at(
                start,
                f"w{slot}'s clock stepped {step:+.1f}s",
                functools.partial(self._step_clock, slot, step),
            )
            self.at(
                back, f"w{slot}'s clock put right", functools.partial(self._step_clock, slot, 0.0)
            )

    def _step_clock(self, slot: int, offset: float) -> None:
        self.process_clocks[slot].offset = offset

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
            # Paged for an always-on net in OUTAGE whose platform failed to start its server,
            # or whose service someone scaled to 0 by hand (the dispatcher never scales such
            # a net): the operator redeploys it (seeds 1157 and 2499: jobs waited for ever).
            for name, driver in self.cluster.drivers.items():
                if self.scales_to_zero(name):
                    continue
                if driver.failure is not None or driver.desired == 0:
                    why = "failed to start" if driver.failure is not None else "was scaled to 0"
                    driver.failure = None
                    self.trace(f"   a human redeploys {name}: its server {why}")
                    driver.apply(1, self.clock.t)

        self.at(
            t + HUMAN_FIX_DELAY_S,
            "a human restarts the workers if a net is MISCONFIGURED, and redeploys an always-on "
            "net whose server failed to start",
            human,
        )

    def _net_states(self) -> set[NetState]:
        return {NetState(r[0]) for r in self.conn.execute("SELECT state FROM nets")}


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
