"""Invariants, checked after every step of a simulation and once more at quiescence.

They read the database directly (raw SQL on the simulation's one connection: cheap) and the
cluster's TRUE record of runs and replicas. Time bounds derive from the settings the world
runs with plus a slack for what the fault profile may legitimately delay; a clean world gets
no slack beyond two beat ticks.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from app.sim.clock import seconds_of
from app.sim.faults import HUMAN_FIX_DELAY_S
from app.sim.servers import Run
from app.usecases import services
from app.usecases.dispatch import submit_try_s
from models import (
    ACTIVE_JOB_STATES,
    ASSIGNABLE_NET_STATES,
    JOB_TRANSITIONS,
    NET_TRANSITIONS,
    TERMINAL_JOB_STATES,
    JobState,
    NetState,
)

if TYPE_CHECKING:
    from app.sim.simulation import Simulation

J = JobState
N = NetState
BUNDLE_REFUSED = "rejected: "  # dispatch._reject_definition's reason


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which, when (simulated seconds), about what, and details."""

    invariant: str
    t: float
    subject: str
    detail: str

    def line(self) -> str:
        return f"[{self.invariant}] t={self.t:.1f}s {self.subject}: {self.detail}"


@dataclass(frozen=True)
class JobRow:
    id: str  # canonical UUID text, as in submit tokens
    state: JobState
    net: str | None
    nvflare_id: str | None
    token: str | None
    changed_s: float
    dispatched_s: float | None
    requested_net: str | None
    attempt: int = 0


@dataclass(frozen=True)
class NetRow:
    name: str
    state: NetState
    changed_s: float


_SECS: dict[str, float] = {}
_UUIDS: dict[str, str] = {}


def _secs(text: str | None) -> float | None:
    """A stored timestamp as simulation seconds (memoised: the same values recur)."""
    if text is None:
        return None
    value = _SECS.get(text)
    if value is None:
        if len(_SECS) > 100_000:
            _SECS.clear()
        value = _SECS[text] = seconds_of(datetime.fromisoformat(text))
    return value


def _uuid(hex_text: str) -> str:
    """A stored UUID (32 hex digits on SQLite) in its canonical text form."""
    value = _UUIDS.get(hex_text)
    if value is None:
        if len(_UUIDS) > 100_000:
            _UUIDS.clear()
        value = _UUIDS[hex_text] = str(uuid.UUID(hex_text))
    return value


class Bounds:
    """How long each bounded condition may last (simulated seconds): what the settings
    promise, plus what this fault profile may legitimately add to that one path."""

    def __init__(self, sim: Simulation) -> None:
        world = sim.world
        p = sim.profile
        tick = world.housekeeping_interval_s
        reconcile = 2 * tick
        budget = world.retry_budget_s() if not p.clean else 0.0
        stuck = world.stuck_after_s
        abort_timeout = float(getattr(sim.settings, "abort_timeout_s", stuck))
        # Slack common to every path: a beat tick or two, delayed or redelivered messages,
        # slow admin calls.
        common = 2 * tick + p.msg_delay_max_s + p.admin_latency_max_s * 4 + p.submit_latency_max_s
        if p.worker_kill:
            common += p.worker_restart_s
        if p.stall:
            common += p.stall_max_s  # a task paused mid-way finishes its step that much later
        if p.retry_backlog:
            common += 90.0  # a retry that runs late behind a broker backlog
        partition = p.partition_max_s if (p.partition_rate or p.lost_reply_partition) else 0.0
        stop_s = 20.0 if p.driver_slow else 4.0
        # Every net the platform has, with the timeouts NETS gives it now (or last gave it).
        nets = {n.name: n for n in (*world.nets, *world.spare)}
        nets |= {n.name: n for n in sim.declared.nets}
        self.assigned = {
            n.name: n.ready_timeout_s + stuck + 2 * reconcile + common for n in nets.values()
        }
        # A submit is abandoned once its tries' own budget (every retry's wait and every
        # try's time, dispatch.submit_try_s) and STUCK_AFTER_S have passed.
        tries = world.retry_max * (world.retry_backoff_max_s + submit_try_s(sim.settings))
        self.dispatching = stuck + 2 * reconcile + max(budget, tries) + common
        self.aborting = max(abort_timeout, stuck) + 2 * reconcile + budget + common
        # A driver broken for a while (up to 90 s, simulation._schedule_faults) cannot scale
        # anything down until it is fixed.
        broken = 90.0 if p.driver_broken_rate else 0.0
        self.idle = {
            n.name: max(n.idle_timeout_s, stuck, n.ready_timeout_s)
            + 2 * reconcile
            + stop_s
            + broken
            + common
            for n in nets.values()
        }
        self.orphan = stuck + 2 * reconcile + budget + common
        self.unaccounted = 2 * tick + common
        # A free net may legitimately refuse new jobs while it settles stray runs.
        self.starved = self.orphan + partition
        self.settle = max(world.server_lost_grace_s, partition) + 3 * tick + common
        self.max_run = world.max_run_s + 3 * tick + common
        self.finishing = world.report_timeout_s + 2 * tick + common
        # Every job ends within `liveness_s(its max_attempts)` after faults stop: a human's
        # fix of a broken setting, each attempt given up at its readiness deadline and
        # waiting its turn again, then a whole run, then some ticks.
        self.per_attempt = max(self.assigned.values()) + self.starved
        self.liveness = HUMAN_FIX_DELAY_S + world.max_run_s + 8 * tick


class Checker:
    """Keeps what it needs between steps (last history rows seen, since-when clocks)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.bounds = Bounds(sim)
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str]] = set()
        self._job_event_id = 0
        self._net_event_id = 0
        self._job_state: dict[str, JobState] = {}
        self._net_state: dict[str, NetState] = {}
        self._unneeded_since: dict[str, float] = {}
        self._orphan_since: dict[str, float] = {}
        self._dead_since: dict[str, float] = {}
        self._completions: dict[str, bool] = {}
        self._seen_answering: dict[str, float] = {}
        self._starved_since: dict[str, float] = {}
        self._undeclared_at: dict[str, float] = {}  # net -> last seen undeclared
        self._claims_seen: set[tuple[str, int]] = set()
        self.jobs: list[JobRow] = []
        self.nets: list[NetRow] = []
        self._read_at_changes = -1  # conn.total_changes when jobs and nets were read
        self._strays_of: dict[str, bool] = {}  # job id -> has a stray run
        self._strays_at_changes = -1
        self._has_strays = (
            sim.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'stray_runs'"
            ).fetchone()
            is not None
        )

    # --- reporting ---------------------------------------------------------------------------

    def report(self, invariant: str, subject: str, detail: str) -> None:
        """Record a violation once per (invariant, subject)."""
        key = (invariant, subject)
        if key in self._seen:
            return
        self._seen.add(key)
        violation = Violation(invariant, self.sim.clock.t, subject, detail)
        self.violations.append(violation)
        self.sim.trace(f"!! {violation.line()}")

    # --- reading the world --------------------------------------------------------------------

    def read(self) -> None:
        """The jobs and nets tables, again only if a row changed since the last read (the
        connection's change counter: every INSERT, UPDATE and DELETE, rolled back or not)."""
        conn = self.sim.conn
        changes = conn.total_changes
        if changes == self._read_at_changes:
            return
        self._read_at_changes = changes
        self.jobs = [
            JobRow(
                id=_uuid(row[0]),
                state=JobState(row[1]),
                net=row[2],
                nvflare_id=row[3],
                token=row[4],
                changed_s=_secs(row[5]) or 0.0,
                dispatched_s=_secs(row[6]),
                requested_net=row[7],
                attempt=row[8],
            )
            for row in conn.execute(
                "SELECT id, state, net_name, nvflare_job_id, submit_token, state_changed_at,"
                " dispatched_at, requested_net, attempts FROM jobs ORDER BY created_at, id"
            )
        ]
        self.nets = [
            NetRow(row[0], NetState(row[1]), _secs(row[2]) or 0.0)
            for row in conn.execute("SELECT name, state, state_changed_at FROM nets ORDER BY name")
        ]

    def job(self, job_id: str) -> JobRow | None:
        for job in self.jobs:
            if job.id == job_id:
                return job
        return None

    def counts(self, run: Run) -> bool:
        """Whether the dispatcher counts this run as its job's run."""
        job = self.job(run.job_id)
        if job is None or job.state not in ACTIVE_JOB_STATES or job.net != run.net:
            return False
        if job.nvflare_id is not None:
            return job.nvflare_id == run.nvflare_id
        return job.token == run.token and job.state in (J.DISPATCHING, J.ABORTING)

    def recorded_stray(self, run: Run) -> bool:
        """The dispatcher knows this run is a stray (a stray_runs row, where that table
        exists: it does not on the code before the fix)."""
        if not self._has_strays:
            return False
        row = self.sim.conn.execute(
            "SELECT 1 FROM stray_runs WHERE net_name = ? AND (nvflare_job_id = ? OR"
            " submit_token = ?) LIMIT 1",
            (run.net, run.nvflare_id, run.token),
        ).fetchone()
        return row is not None

    def _waits_for_its_stray(self, job_id: str) -> bool:
        if not self._has_strays:
            return False
        changes = self.sim.conn.total_changes
        if changes != self._strays_at_changes:  # answers hold until a row changes
            self._strays_at_changes = changes
            self._strays_of.clear()
        known = self._strays_of.get(job_id)
        if known is None:
            row = self.sim.conn.execute(
                "SELECT 1 FROM stray_runs WHERE replace(job_id, '-', '') = ? LIMIT 1",
                (job_id.replace("-", ""),),
            ).fetchone()
            known = self._strays_of[job_id] = row is not None
        return known

    def _counted_completion(self, run: Run, t: float) -> bool:
        """A completed run counts if the dispatcher could have seen it complete: after it
        completed, while its job still held its id, its server answered (and still knew it) for
        a whole housekeeping interval, so a monitor round could ask. (A run that finished
        while its server was unreachable, or just before the server died, cannot be told
        from a lost run.)"""
        counted = self._completions.get(run.nvflare_id)
        if counted is not None:
            return counted
        server = self.sim.cluster.servers[run.net]
        job = self.job(run.job_id)
        # Held by its id: a run known only by its submit token (a DISPATCHING job whose
        # reply was lost) is seen only when a submit or token lookup reaches the server.
        held = job is not None and job.nvflare_id == run.nvflare_id
        if not held or run.poisoned:  # a status that never answers hides the completion
            self._completions[run.nvflare_id] = False
            return False
        if server.reachable(t) and run.nvflare_id in server.store:
            since = self._seen_answering.setdefault(run.nvflare_id, t)
            if t - since >= self.sim.world.housekeeping_interval_s:
                self._completions[run.nvflare_id] = True  # a monitor round saw it answer
                return True
        else:
            self._seen_answering.pop(run.nvflare_id, None)
        return False  # undecided: asked again at the next step

    def _removal_slack(self, net: str | None) -> float:
        """A job on a net NETS no longer declares is settled only once no process has
        declared the net for `services.undeclared_after_s` (a rolling deploy may still be
        adding it), then by the next reconcile rounds: its bounds grow by that much."""
        if net is None or self.sim.declared_net(net):
            return 0.0
        reconcile = 2 * self.sim.world.housekeeping_interval_s
        return services.undeclared_after_s(self.sim.settings) + 2 * reconcile

    def needed(self, net: str) -> bool:
        """A net's server is needed: an active job on it, or a QUEUED job that could take
        it while it is assignable."""
        if any(j.net == net and j.state in ACTIVE_JOB_STATES for j in self.jobs):
            return True
        row = next((n for n in self.nets if n.name == net), None)
        if row is None or row.state not in ASSIGNABLE_NET_STATES:
            return False
        # Only a job that could be claimed: one waiting for its own stray run (on this net
        # or another) cannot run here, so it keeps no server up.
        return any(
            j.state == J.QUEUED
            and j.requested_net in (None, net)
            and not self._waits_for_its_stray(j.id)
            for j in self.jobs
        )

    # --- the checks ----------------------------------------------------------------------------

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
        self._scale_to_zero(t)

    def _history(self) -> None:
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
                self.sim.on_requeued(job_id)
            if dst == J.FAILED and reason.startswith(BUNDLE_REFUSED):
                # Every bundle the simulation serves is usable (a folder under JOB_ROOT, an
                # S3 prefix with a deploy map, the console's folder placeholders at most).
                self.report("bundle-refused", f"job {job_id[:8]}", reason[:300])
        for event_id, net, src, dst, reason in conn.execute(
            "SELECT id, net_name, from_state, to_state, reason FROM net_events"
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
            if dst in (N.UNHEALTHY, N.OUTAGE) and "waiting for sites" in reason:
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
            age = t - job.changed_s
            if job.state in ACTIVE_JOB_STATES and job.net is not None:
                state = net_state.get(job.net)
                if state in (N.STOPPED, N.STOPPING):
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
                and t - job.dispatched_s > b.max_run + self._removal_slack(job.net)
            ):
                self.report(
                    "max-run-enforced",
                    f"job {job.id[:8]}",
                    f"RUNNING for {t - job.dispatched_s:.0f}s (MAX_RUN_S bound {b.max_run:.0f}s)",
                )

    def _runs(self, t: float) -> None:
        b = self.bounds
        live: dict[str, list[Run]] = defaultdict(list)
        completed: dict[str, list[Run]] = defaultdict(list)
        by_id: dict[str, Run] = {}
        for run in self.sim.cluster.runs:
            by_id[run.nvflare_id] = run
            if run.live(t):
                live[run.job_id].append(run)
            elif run.completed(t) and self._counted_completion(run, t):
                completed[run.job_id].append(run)
        per_net: dict[str, list[Run]] = defaultdict(list)
        for runs in live.values():
            for run in runs:
                per_net[run.net].append(run)
        for net, runs in sorted(per_net.items()):
            if len(runs) > 1:
                self.report(
                    "one-run-per-server",
                    f"net {net}",
                    "live runs "
                    + ", ".join(f"{r.nvflare_id} (job {r.job_id[:8]}-{r.attempt})" for r in runs),
                )
        for job_id, runs in live.items():
            if len(runs) > 1:
                self.report(
                    "one-live-run",
                    f"job {job_id[:8]}",
                    "live runs " + ", ".join(f"{r.nvflare_id} ({r.token[-2:]})" for r in runs),
                )
            for run in runs:
                if self.counts(run):
                    self._orphan_since.pop(run.nvflare_id, None)
                    if self.recorded_stray(run):
                        # Counted twice: the net could be settled under its job, or the job
                        # held back by a run it owns.
                        self.report(
                            "counted-once",
                            f"run {run.nvflare_id}",
                            f"counted by its job {job_id[:8]} and recorded as a stray run",
                        )
                    continue
                since = self._orphan_since.setdefault(run.nvflare_id, t)
                job = self.job(job_id)
                job_state, job_net = (str(job.state), str(job.net)) if job else ("?", "?")
                where = f"its job {job_id[:8]} is {job_state} on {job_net}"
                if t - since > b.unaccounted and not self.recorded_stray(run):
                    self.report(
                        "unaccounted-run",
                        f"run {run.nvflare_id}",
                        f"live for {t - since:.0f}s (bound {b.unaccounted:.0f}s), neither counted"
                        f" by its job nor recorded as a stray run: {where}",
                    )
                if not self.sim.declared_net(run.net):
                    # A server NETS no longer declares is the operator's (README, "A net
                    # removed from NETS": nothing of the dispatcher reaches it); its runs
                    # are the dispatcher's to stop again only from the net's next
                    # declaration on.
                    self._undeclared_at[run.net] = t
                    continue
                since = max(since, self._undeclared_at.get(run.net, since))
                if t - since > b.orphan:
                    self.report(
                        "stray-run-stopped",
                        f"run {run.nvflare_id}",
                        f"live for {t - since:.0f}s (bound {b.orphan:.0f}s) while {where}",
                    )
        for job_id, runs in completed.items():
            if len(runs) > 1:
                self.report(
                    "one-counted-run",
                    f"job {job_id[:8]}",
                    "completed runs " + ", ".join(r.nvflare_id for r in runs),
                )
        for job in self.jobs:
            if job.state not in (J.RUNNING, J.ABORTING) or job.nvflare_id is None:
                self._dead_since.pop(job.id, None)
                continue
            recorded = by_id.get(job.nvflare_id)
            if recorded is None or recorded.live(t) or recorded.poisoned:
                # A run whose status the server never gives cannot be seen to end: only
                # MAX_RUN_S (max-run-enforced) bounds it.
                self._dead_since.pop(job.id, None)
                continue
            since = self._dead_since.setdefault(job.id, t)
            if t - since > b.settle + self._removal_slack(job.net):
                how = _how_ended(recorded, t)
                self.report(
                    "ended-run-settled",
                    f"job {job.id[:8]}",
                    f"{job.state} for {t - since:.0f}s after its run {job.nvflare_id} {how}"
                    f" (bound {b.settle:.0f}s)",
                )

    def _claims(self, t: float) -> None:
        """A net with a live run never takes another job: when a claim is first seen (the
        step right after it), no run of another job or attempt lives on the net."""
        for job in self.jobs:
            if job.state != J.ASSIGNED or job.net is None:
                continue
            key = (job.id, job.attempt)
            if key in self._claims_seen:
                continue
            self._claims_seen.add(key)
            beside = [
                r
                for r in self.sim.cluster.runs
                if r.net == job.net
                and r.live(t)
                and (r.job_id != job.id or r.attempt != job.attempt)
            ]
            if beside:
                self.report(
                    "claim-beside-live-run",
                    f"net {job.net}",
                    f"job {job.id[:8]} (attempt {job.attempt}) claimed it while run "
                    + ", ".join(f"{r.nvflare_id} (job {r.job_id[:8]}-{r.attempt})" for r in beside)
                    + " lives there",
                )

    def _queued_while_free(self, t: float) -> None:
        """A QUEUED job does not wait while a net it may run on is free (assignable, no
        active job): assign runs every tick and after every release."""
        busy = {j.net for j in self.jobs if j.state in ACTIVE_JOB_STATES}
        declared = self.sim.declared_net
        free = [
            n.name
            for n in self.nets
            if n.state in ASSIGNABLE_NET_STATES and n.name not in busy and declared(n.name)
        ]
        for job in self.jobs:
            if job.state != J.QUEUED or not any(job.requested_net in (None, n) for n in free):
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
                    f" {', '.join(n for n in free if job.requested_net in (None, n))} is free",
                )

    def _scale_to_zero(self, t: float) -> None:
        sim = self.sim
        for net in self.nets:
            if not sim.scales_to_zero(net.name):
                self._unneeded_since.pop(net.name, None)
                continue
            if self.needed(net.name):
                self._unneeded_since.pop(net.name, None)
                continue
            since = self._unneeded_since.setdefault(net.name, t)
            bound = self.bounds.idle[net.name]
            if t - since > bound and sim.cluster.replicas(net.name) > 0:
                self.report(
                    "idle-net-at-zero",
                    f"net {net.name}",
                    f"{net.state} with no job needing it for {t - since:.0f}s (bound "
                    f"{bound:.0f}s) but the platform still runs its server",
                )

    # --- quiescence ------------------------------------------------------------------------------

    def unsettled(self) -> list[str]:
        """Why the world is not at rest yet (empty: at rest)."""
        sim = self.sim
        t = sim.clock.t
        sim.cluster.advance(t)
        self.read()
        reasons = []
        for job in self.jobs:
            # Liveness: once faults stop, every job ends (not only: none is stuck where a
            # net could take it). The one wait the design leaves to an operator: a job whose
            # own stray run on an always-on net has a status its server never gives.
            if job.state not in TERMINAL_JOB_STATES and not self._left_to_operator(job):
                reasons.append(f"job {job.id[:8]} {job.state} on {job.net}")
        for net in self.nets:
            if (
                sim.scales_to_zero(net.name)
                and not self.needed(net.name)
                and sim.cluster.replicas(net.name) > 0
            ):
                reasons.append(f"net {net.name} {net.state} still has a server")
        for run in sim.cluster.live_runs(t):
            if sim.declared_net(run.net):  # else the operator's (see stray-run-stopped)
                reasons.append(f"run {run.nvflare_id} of job {run.job_id[:8]} still live")
        if sim.broker.work_pending():
            reasons.append("messages pending")
        if sim.world.callbacks:
            reasons += [f"callbacks {line}" for line in self.undelivered()]
        return reasons

    def storable(self) -> None:
        """Every text the run stored could be stored on PostgreSQL too (the simulation's
        SQLite takes anything): no NUL in a text column, no lone surrogate in a JSON one
        (json.dumps escapes it; PostgreSQL refuses the escape's value in text it extracts,
        and no callback can encode it)."""
        conn = self.sim.conn
        texts = {
            "jobs": ("caller_key", "definition", "last_error"),
            "job_events": ("reason",),
            "net_events": ("reason",),
            "nets": ("last_error",),
            "stray_runs": ("reason",),
            "rejected_requests": ("caller_key", "reason", "callback_last_error"),
            "callback_cursors": ("last_error",),
        }
        for table, columns in texts.items():
            for column in columns:
                row = conn.execute(
                    f"SELECT rowid, {column} FROM {table} WHERE instr({column}, char(0)) > 0"  # noqa: S608 (our own names)
                ).fetchone()
                if row is not None:
                    self.report(
                        "postgres-storable", f"{table}.{column}", f"row {row[0]} holds a NUL"
                    )
        for (text,) in conn.execute("SELECT metadata FROM jobs WHERE metadata IS NOT NULL"):
            try:
                json.dumps(json.loads(text), ensure_ascii=False).encode()
            except UnicodeEncodeError:
                self.report("postgres-storable", "jobs.metadata", "holds a lone surrogate")

    def liveness_s(self, max_attempts: int) -> float:
        """How long after faults stop a job with this many attempts must have ended."""
        return self.bounds.liveness + max_attempts * self.bounds.per_attempt

    def undelivered(self) -> list[str]:
        """Job events and refused enqueues neither delivered (the receiver accepted them) nor
        visibly undeliverable (settled as failed, with the error kept on the job's cursor or
        the rejection's row), one line per job or rejection."""
        conn = self.sim.conn
        accepted = self.sim.receiver.accepted
        lines = []
        cursors = {
            _uuid(job): (settled, failed, error)
            for job, settled, failed, error in conn.execute(
                "SELECT job_id, settled_through, failed, last_error FROM callback_cursors"
            )
        }
        events: dict[str, list[int]] = defaultdict(list)
        for event_id, job_hex in conn.execute("SELECT id, job_id FROM job_events ORDER BY id"):
            events[_uuid(job_hex)].append(event_id)
        for job_id, ids in events.items():
            settled, failed, error = cursors.get(job_id, (0, 0, None))
            delivered = set(accepted.get(job_id, ()))
            missing = [i for i in ids if i not in delivered]
            visible = [i for i in missing if i <= settled and failed and error]
            hidden = [i for i in missing if i not in visible]
            if hidden:
                lines.append(f"{job_id[:8]} events {hidden} neither delivered nor failed visibly")
        for row_id, settled_at, failed, error in conn.execute(
            "SELECT id, callback_settled_at, callback_failed, callback_last_error"
            " FROM rejected_requests"
        ):
            if f"rejected-{row_id}" in self.sim.receiver.accepted_rejections:
                continue
            if settled_at is None or not (failed and error):
                lines.append(f"rejected-{row_id} neither delivered nor failed visibly")
        return lines

    def _left_to_operator(self, job: JobRow) -> bool:
        if job.state != J.QUEUED or not self._has_strays:
            return False
        rows = self.sim.conn.execute(
            "SELECT net_name, nvflare_job_id, submit_token FROM stray_runs"
            " WHERE replace(job_id, '-', '') = ?",
            (job.id.replace("-", ""),),
        ).fetchall()
        for net, nvflare_id, token in rows:
            if self.sim.scales_to_zero(net):
                continue
            key = nvflare_id or token
            run = next((r for r in self.sim.cluster.runs if key in (r.nvflare_id, r.token)), None)
            if run is not None and run.poisoned:
                return True
        return False

    def quiescence(self, reasons: list[str]) -> None:
        """The world did not come to rest within the liveness bound (`Bounds.liveness` after
        faults stopped): report what stayed unsettled; a job not ended is a liveness
        violation."""
        for reason in reasons:
            if reason == "messages pending":
                continue
            subject = reason.split(" ", 2)[0] + " " + reason.split(" ")[1]
            t = self.sim.clock.t - self.sim.workload.horizon_s
            if reason.startswith("job "):
                self.report(
                    "liveness",
                    subject,
                    f"{reason}: not ended {t:.0f}s after faults stopped (bound: "
                    f"{self.bounds.liveness:.0f}s + max_attempts x {self.bounds.per_attempt:.0f}s)",
                )
            elif reason.startswith("callbacks "):
                self.report(
                    "callback-delivered",
                    subject,
                    f"{reason} {t:.0f}s after faults stopped",
                )
            else:
                self.report("quiescence", subject, reason)


def _how_ended(run: Run, t: float) -> str:
    if run.aborted_at is not None:
        return f"was aborted at {run.aborted_at:.0f}s"
    if run.killed_at is not None:
        return f"died with its server at {run.killed_at:.0f}s"
    return f"finished {run.status(t)} at {run.end_at:.0f}s"
