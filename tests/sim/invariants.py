"""Invariants, checked after every step of a simulation and once more at quiescence.

They read the database directly (raw SQL on the simulation's one connection: cheap) and the
cluster's TRUE record of runs and replicas. Time bounds derive from the settings the world
runs with plus a slack for what the fault profile may legitimately delay; a clean world gets
no slack beyond two beat ticks.
"""

from __future__ import annotations

from pathlib import Path

from app.sim.db import Unchanged
from app.sim.messages import Message
from app.sim.simulation import Simulation
from models import (
    ACTIVE_JOB_STATES,
    ASSIGNABLE_NET_STATES,
    JOB_TRANSITIONS,
    NET_TRANSITIONS,
    JobState,
    NetState,
)
from tests.sim import drains, refusal_repeat, repeats
from tests.sim.abort_invariants import AbortWatch
from tests.sim.always_on_starts import AlwaysOnStarts
from tests.sim.call_invariants import CallInvariants
from tests.sim.fair_share import FairShareInvariants
from tests.sim.flower_faults import BadAppWatch
from tests.sim.kits import KitCheck
from tests.sim.lease_invariants import LeaseInvariants
from tests.sim.observer import J, _uuid
from tests.sim.quiescence import Quiescence
from tests.sim.ready_invariants import ReadyInvariants
from tests.sim.rest_window import RestWindow
from tests.sim.run_invariants import RunInvariants
from tests.sim.settle_storm import SettleInvariants
from tests.sim.start_deadlines import StartDeadlines

N = NetState
BUNDLE_REFUSED = "rejected: "  # refused_definitions.fail_job's reason
# Readiness's words for missing sites: NVFLARE's client names sites, Flower's SuperNodes.
WAITING_FOR_SITES = ("waiting for sites", "waiting for SuperNodes")


class Checker(
    RunInvariants,
    Quiescence,
    CallInvariants,
    ReadyInvariants,
    LeaseInvariants,
    FairShareInvariants,
    SettleInvariants,
    AlwaysOnStarts,
    StartDeadlines,
):
    """Every invariant: the checks on histories, jobs, nets and idle servers here, those on
    runs (RunInvariants), at rest (Quiescence), at an adapter call (CallInvariants), at a
    job-less net's READY (ReadyInvariants), on chain jobs no message holds
    (LeaseInvariants) and on starts to settle strays (SettleInvariants); what they keep
    between steps (last history rows seen, since-when clocks) in Observer.

    A `Simulation(..., checker=Checker())` calls `start` once its first worker runs,
    `after_step` after every step and clock move, the fakes' `on_submit` and `on_scale`,
    `after_message` as each delivery ends, `quiescence` if the world is not at rest by the
    liveness bound, and `at_end`."""

    def start(self, sim: Simulation) -> None:
        """Watch `sim` from now on; the malformed Flower App's job, if the world has one."""
        super().start(sim)
        self._bad_app = BadAppWatch(self)
        self._kits = KitCheck(sim)
        self._history_read = Unchanged(sim.conn)
        self._rest_window = RestWindow(sim)
        self._aborts = AbortWatch(sim)

    def on_submit(self, net: str, token: str, folder: Path, *, repeat: bool = False) -> None:
        """A submit reaches a server: the call checks', then nothing in it from outside
        JOB_ROOT (tests.sim.link_out's band worlds)."""
        super().on_submit(net, token, folder, repeat=repeat)
        links = getattr(self.sim.adversary, "link_out", None)
        if links is not None:
            links.on_submit(token, folder)

    def after_message(self, message: Message, finished: bool) -> None:
        """A delivery ended: the call checks', then an answered abort binds its job."""
        super().after_message(message, finished)
        self._aborts.after_message(message, finished)

    def after_step(self) -> None:
        """Every invariant, after one step."""
        self.check()

    def at_end(self) -> None:
        """The checks of what the run left stored."""
        self.storable()
        self.refused_once()
        self._bad_app.at_end()
        refusals = getattr(self.sim.adversary, "refusal_repeat", None)
        plan = refusals.plan if refusals is not None else None
        repeats.repeat_refused(self.sim, refusal_repeat.sent_digests(plan))
        refusal_repeat.one_refusal_per_request(self.sim, plan)
        if refusals is not None and refusals.race is not None:
            refusals.race.check()  # round 22's copies (tests.sim.refusal_race)
        values = getattr(self.sim.adversary, "kombu_values", None)
        if values is not None:
            values.check()  # `request-kept` (tests.sim.kombu_values)

    def check(self) -> None:
        """Every invariant, after one step."""
        sim = self.sim
        t = sim.clock.t
        sim.cluster.advance(t)
        self.read()
        self._history()
        self._nets_and_jobs(t)
        self._runs(t)
        self._claims(t)
        self._queued_while_free(t)
        drains.check(self)
        self._kits.check(sim.conn)
        self._bad_app.check()
        self._fair_share(t)
        self._scale_to_zero(t)
        self._prewarms(t)
        self._net_moves()
        self._step_redriven(t)
        self._always_on_starts(t)
        self._aborts.check()
        links = getattr(sim.adversary, "link_out", None)
        if links is not None:
            links.check()  # `nothing-from-outside-root` (tests.sim.link_out)
        self._held_runs = {j.id: j.nvflare_id for j in self.jobs if j.nvflare_id is not None}

    def _rerun_after_completion(self, job_id: str, reason: str) -> None:
        """A job is never queued again once a run it held completed on a server that still
        answers and knows it: that run's result is the job's, and a second run would redo
        (and double-count) finished work. (A server that does not answer, or did not at the
        workers' last call, or lost the run, cannot tell the dispatcher; a requeue then is the
        lost-job policy's to make.)"""
        run_id = self._held_runs.get(job_id)
        if run_id is None:
            return
        t = self.sim.clock.t
        run = next((r for r in self.sim.cluster.runs if r.nvflare_id == run_id), None)
        if run is None or not run.completed(t) or run.poisoned:
            return  # (a run whose status never answers cannot tell it completed)
        server = self.sim.cluster.servers[run.net]
        # Reachable now, and so at the workers' last call: a partition that ended during the
        # step whose probe it failed is no defect (chaos 2339: probed at 135.x, over at 136.45).
        if server.reachable(t) and not server.refused_last and run_id in server.store:
            self.report(
                "completed-run-rerun",
                f"job {job_id[:8]}",
                f"queued again ({reason[:120]}) after its run {run_id} completed",
            )

    def _history(self) -> None:
        if self._history_read.holds():
            return  # no row written since the last read: no history row either
        conn = self.sim.conn
        for event_id, job_hex, src, dst, _at, reason in conn.execute(
            "SELECT id, job_id, from_state, to_state, at, reason FROM job_events"
            " WHERE id > ? ORDER BY id",
            (self._job_event_id,),
        ):
            self._job_event_id = event_id
            job_id = _uuid(job_hex)
            previous = self._job_state.get(job_id)
            if src is None:
                legal = dst == J.QUEUED and previous is None
            else:
                legal = JobState(dst) in JOB_TRANSITIONS[JobState(src)] and previous == src
            if not legal:
                self.report(
                    "legal-history",
                    f"job {job_id[:8]} event {event_id}",
                    f"{src} -> {dst} (last seen {previous}): {reason}",
                )
            self._job_state[job_id] = JobState(dst)
            if dst == J.QUEUED and src is not None:
                self._rerun_after_completion(job_id, reason)
            if dst == J.FAILED and reason.startswith(BUNDLE_REFUSED):
                # Every bundle the simulation serves is usable (a folder under JOB_ROOT, an
                # S3 prefix with a deploy map, the console's folder placeholders at most).
                self.report("bundle-refused", f"job {job_id[:8]}", reason[:300])
        for event_id, net, src, dst, at, reason in conn.execute(
            "SELECT id, net_name, from_state, to_state, at, reason FROM net_events"
            " WHERE id > ? ORDER BY id",
            (self._net_event_id,),
        ):
            self._net_event_id = event_id
            last = self._net_state.get(net, N.STOPPED)
            if NetState(dst) not in NET_TRANSITIONS[NetState(src)] or src != last:
                self.report(
                    "legal-history",
                    f"net {net} event {event_id}",
                    f"{src} -> {dst} (last seen {last}): {reason}",
                )
            self._net_state[net] = NetState(dst)
            self._rest_window.saw(net, src, dst, reason, self.sim.clock.t)
            self._net_moved(net, src, dst, at, reason)
            if dst == N.STARTING:
                self._prewarm_start(event_id, net, at, reason)
                self._settle_start(net, at)
            elif src == N.STARTING and dst == N.STOPPING:
                self._prewarm_release(event_id, net, at, reason)
            if dst in (N.UNHEALTHY, N.OUTAGE) and any(w in reason for w in WAITING_FOR_SITES):
                # A server that answers while a site never connects is the job's problem
                # (requeued, the site named), never the net's health.
                self.report("sites-not-the-nets", f"net {net} event {event_id}", reason[:300])

    def _nets_and_jobs(self, t: float) -> None:
        b = self.bounds
        net_state = {n.name: n.state for n in self.nets}
        for net in self.nets:
            if net.state == N.BUSY and not any(
                j.net == net.name and j.state in ACTIVE_JOB_STATES for j in self.jobs
            ):
                self.report("busy-without-job", f"net {net.name}", "BUSY with no active job")
        for job in self.jobs:
            # The broker down meanwhile delivers no beat tick, so no round can end the wait.
            age = t - self._after_broker_outages(job.changed_s, t)
            if job.state in ACTIVE_JOB_STATES and job.net is not None:
                state = net_state.get(job.net)
                if state in (N.STOPPED, N.STOPPING, N.MISCONFIGURED):
                    self.report(
                        "job-on-stopped-net",
                        f"job {job.id[:8]}",
                        f"{job.state} on net {job.net} which is {state}",
                    )
            bound = {
                J.ASSIGNED: b.assigned.get(job.net or "", 0.0),
                J.DISPATCHING: b.dispatching,
                J.ABORTING: b.aborting,
                J.FINISHING: b.finishing,
            }.get(job.state)
            if bound is not None:
                bound += self._removal_slack(job.net)
            if bound is not None and age > bound:
                self.report(
                    "job-state-bounded",
                    f"job {job.id[:8]} {job.state}",
                    f"{job.state} for {age:.0f}s (bound {bound:.0f}s) on net {job.net}",
                )
            if (
                job.state == J.RUNNING
                and job.dispatched_s is not None
                and t - self._after_broker_outages(job.dispatched_s, t)
                > b.max_run + self._removal_slack(job.net)
            ):
                self.report(
                    "max-run-enforced",
                    f"job {job.id[:8]}",
                    f"RUNNING for {t - job.dispatched_s:.0f}s (MAX_RUN_S bound {b.max_run:.0f}s)",
                )

    def _queued_while_free(self, t: float) -> None:
        """A QUEUED job does not wait while a net it may run on is free (assignable, no
        active job, not drained): assign runs every tick and after every release. A net that
        declares its sites is not free for a job needing one it lacks (round 20)."""
        busy = {j.net for j in self.jobs if j.state in ACTIVE_JOB_STATES}
        declared = self.sim.declared_net
        free = [
            n.name
            for n in self.nets
            if n.state in ASSIGNABLE_NET_STATES
            and n.name not in busy
            and declared(n.name)
            and not n.drained  # an operator's drain: its queue waits by design
            # A stray on a server that never answers again, or on an always-on one refusing
            # every stop (seed 7349): only an operator settles it, and the claim passes the
            # net by until then (tests.sim.flower_faults).
            and not (self.sim.state.operators_net(n.name) and self.sim.state.holds_stray(n.name))
            # Nor a scale-to-zero one that answers and refuses every stop (DEAF): its stray
            # lives until the idle grace takes the server down (seed 7336).
            and not (self.sim.state.deaf_and_up(n.name) and self.sim.state.holds_stray(n.name))
            and not self._rest_window.resting(n, t)
        ]
        fits = self.sim.state.fits  # pinned to it or to none, its sites among a sited net's
        for job in self.jobs:
            if job.state != J.QUEUED or not any(fits(job, n) for n in free):
                self._starved_since.pop(job.id, None)
                continue
            if self.sim.state.at_cap(job.project):
                # By design: its project holds its max_nets nets (PROJECT_SHARES); the claim
                # takes none of its jobs until one of them ends (project-over-cap).
                self._starved_since.pop(job.id, None)
                continue
            if self._waits_for_its_stray(job.id):
                # By design: a job whose earlier run may still be alive is not started again
                # until that run is settled (one live run per job); stray-run-stopped and
                # unaccounted-run police the settling itself.
                self._starved_since.pop(job.id, None)
                continue
            since = self._starved_since.setdefault(job.id, t)
            if t - since > self.bounds.starved:
                self.report(
                    "queued-while-free",
                    f"job {job.id[:8]}",
                    f"QUEUED for {t - since:.0f}s (bound {self.bounds.starved:.0f}s) while"
                    f" {', '.join(n for n in free if fits(job, n))} is free",
                )

    def _scale_to_zero(self, t: float) -> None:
        sim = self.sim
        # The nets whose driver refused every call since the last step (a setting naming a
        # service that is not there, until a human mends it: tests.sim.misfit, the
        # adversary's broken drivers; an access denial, tests.sim.late_starts; the
        # platform's outage, tests.sim.platform_faults, drift 9798): the dispatcher could
        # take no server down meanwhile.
        last_t, refused = self._refused_at
        drivers = sim.cluster.drivers.items()
        self._refused_at = (t, frozenset(n for n, d in drivers if d.takes_no_scale(t)))
        for net in self.nets:
            if not sim.scales_to_zero(net.name):
                self._unneeded_since.pop(net.name, None)
                continue
            # The grace runs while a server is up for nothing: a net at zero that someone
            # scales up by hand starts it then, not when the net was stopped (seed 231).
            if self.needed(net.name) or sim.cluster.replicas(net.name) == 0:
                self._unneeded_since.pop(net.name, None)
                continue
            since = self._unneeded_since.setdefault(net.name, t)
            if net.name in refused:
                # ... and only while the dispatcher can take it down: the time its driver
                # refused every call does not count (drift 5946: a replica scaled up by hand
                # 130 s before the human's fix, stopped 72 s after it, was reported).
                since = self._unneeded_since[net.name] = min(t, since + (t - last_t))
            bound = self.bounds.idle[net.name]
            if t - since > bound:
                self.report(
                    "idle-net-at-zero",
                    f"net {net.name}",
                    f"{net.state} with no job needing it for {t - since:.0f}s (bound "
                    f"{bound:.0f}s) but the platform still runs its server",
                )
