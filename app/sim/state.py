"""The world as its tables and the platform say it is now: the jobs, nets and prewarm holds
(raw SQL on the simulation's one connection: cheap, and read again only when a row changed),
which nets a job or a hold still needs, and why the world is not at rest yet. The run loop
ends a run once the world stays at rest (`unsettled()` empty) for a few beat ticks; the
harness's invariants (tests/sim) read the same rows."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from app.sim.clock import seconds_of
from app.sim.view import SimView
from models import ACTIVE_JOB_STATES, ASSIGNABLE_NET_STATES, TERMINAL_JOB_STATES, JobState, NetState

J = JobState


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
    project: str | None = None  # jobs.project_id (issue 40), where the column exists
    sites: tuple[str, ...] = ()  # jobs.required_sites


@dataclass(frozen=True)
class HoldRow:
    """An accepted prewarm, with the end of its hold as the checker counts it: the earliest
    of its hint's end, created + PREWARM_MAX_S, and when it ended (cancelled, used, failed)."""

    key: str
    net: str | None
    created_s: float
    end_s: float
    outcome: str | None
    ended_s: float | None

    def live(self, t: float) -> bool:
        return self.created_s <= t < self.end_s


@dataclass(frozen=True)
class NetRow:
    name: str
    state: NetState
    changed_s: float
    drained: bool = False  # an operator drained it (app.usecases.drains): it takes no claim


_SECS: dict[str, float] = {}
_UUIDS: dict[str, str] = {}
_SITES: dict[str, tuple[str, ...]] = {}
T = TypeVar("T")


def _memoised(cache: dict[str, T], text: str, parse: Callable[[str], T]) -> T:
    """`parse(text)`, kept in `cache` (the same stored values recur at every read; the cache
    starts again past 100,000 of them)."""
    value = cache.get(text)
    if value is None:
        if len(cache) > 100_000:
            cache.clear()
        value = cache[text] = parse(text)
    return value


def _parse_secs(text: str) -> float:
    return seconds_of(datetime.fromisoformat(text))


def _parse_uuid(hex_text: str) -> str:
    return str(uuid.UUID(hex_text))


def _parse_sites(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text))


def _secs(text: str | None) -> float | None:
    """A stored timestamp as simulation seconds."""
    if text is None:
        return None
    return _memoised(_SECS, text, _parse_secs)


def _uuid(hex_text: str) -> str:
    """A stored UUID (32 hex digits on SQLite) in its canonical text form."""
    return _memoised(_UUIDS, hex_text, _parse_uuid)


def _sites(text: str | None) -> tuple[str, ...]:
    """A job's stored required_sites (JSON text) as a tuple."""
    if text is None:
        return ()
    return _memoised(_SITES, text, _parse_sites)


_JOBS = (
    "SELECT id, state, net_name, nvflare_job_id, submit_token, state_changed_at, dispatched_at,"
    " requested_net, attempts, project_id, required_sites FROM jobs ORDER BY created_at, id"
)
_JOBS_BEFORE_PROJECTS = _JOBS.replace("project_id", "NULL")
_NETS = (
    "SELECT name, state, state_changed_at,"
    " EXISTS (SELECT 1 FROM drains WHERE scope IN (nets.name, '*')) FROM nets ORDER BY name"
)
_NETS_BEFORE_DRAINS = "SELECT name, state, state_changed_at, 0 FROM nets ORDER BY name"
_STRAY_OF_JOB = "SELECT 1 FROM stray_runs WHERE replace(job_id, '-', '') = ? LIMIT 1"
_STRAY_ON_NET = "SELECT 1 FROM stray_runs WHERE net_name = ? LIMIT 1"


class WorldState:
    """The jobs, nets and holds as last read, and what they still need."""

    def __init__(self, sim: SimView) -> None:
        self.sim = sim
        self.jobs: list[JobRow] = []
        self.nets: list[NetRow] = []
        self.holds: list[HoldRow] = []  # read only in a world with prewarms
        self._read_at_changes = -1  # conn.total_changes when jobs and nets were read
        self._strays_of: dict[str, bool] = {}  # query=value -> a stray run matches
        self._strays_at_changes = -1
        self.has_strays = self._has_table("stray_runs")
        self.has_drains = self._has_table("drains")
        self.has_projects = self._has_column("jobs", "project_id")

    def _has_column(self, table: str, column: str) -> bool:
        found = self.sim.conn.execute(f"PRAGMA table_info({table})").fetchall()
        return any(row[1] == column for row in found)

    def _has_table(self, name: str) -> bool:
        found = self.sim.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return found is not None

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
                project=row[9],
                sites=_sites(row[10]),
            )
            for row in conn.execute(_JOBS if self.has_projects else _JOBS_BEFORE_PROJECTS)
        ]
        self.nets = [
            NetRow(row[0], NetState(row[1]), _secs(row[2]) or 0.0, bool(row[3]))
            for row in conn.execute(_NETS if self.has_drains else _NETS_BEFORE_DRAINS)
        ]
        if self.sim.workload.prewarms:
            self.holds = self._read_holds()

    def _read_holds(self) -> list[HoldRow]:
        max_s = self.sim.settings.prewarm_max_s
        holds = []
        for key, net, created, within, ended, outcome in self.sim.conn.execute(
            "SELECT caller_key, net_name, created_at, within_s, ended_at, outcome FROM prewarms"
            " WHERE NOT refused ORDER BY id"
        ):
            created_s = _secs(created) or 0.0
            ended_s = _secs(ended)
            end_s = created_s + min(float(within or 0.0), max_s)
            if ended_s is not None:
                end_s = min(end_s, ended_s)
            holds.append(HoldRow(key, net, created_s, end_s, outcome, ended_s))
        return holds

    def held(self, net: str, t: float) -> bool:
        """A live prewarm holds the net (as the checker counts the hold's end)."""
        return any(h.net == net and h.live(t) for h in self.holds)

    def job(self, job_id: str) -> JobRow | None:
        for job in self.jobs:
            if job.id == job_id:
                return job
        return None

    def waits_for_its_stray(self, job_id: str) -> bool:
        """The job has a stray run recorded (it is not claimed again until that settles)."""
        return self._stray_where(_STRAY_OF_JOB, job_id.replace("-", ""))

    def holds_stray(self, net: str) -> bool:
        """The net has a stray run recorded (the claim passes it by until that settles)."""
        return self._stray_where(_STRAY_ON_NET, net)

    def _stray_where(self, query: str, value: str) -> bool:
        if not self.has_strays:
            return False
        changes = self.sim.conn.total_changes
        if changes != self._strays_at_changes:  # answers hold until a row changes
            self._strays_at_changes = changes
            self._strays_of.clear()
        key = f"{query}={value}"
        known = self._strays_of.get(key)
        if known is None:
            row = self.sim.conn.execute(query, (value,)).fetchone()
            known = self._strays_of[key] = row is not None
        return known

    def needed(self, net: str) -> bool:
        """A net's server is needed: an active job on it, a live prewarm hold on it, or a
        QUEUED job that could take it while it is assignable."""
        if any(j.net == net and j.state in ACTIVE_JOB_STATES for j in self.jobs):
            return True
        if self.holds and self.held(net, self.sim.clock.t):
            return True
        row = next((n for n in self.nets if n.name == net), None)
        if row is None or row.state not in ASSIGNABLE_NET_STATES or row.drained:
            return False  # (a drained net's queue keeps no server up: it waits for undrain)
        # Only a job that could be claimed: one waiting for its own stray run (on this net
        # or another) cannot run here, nor one whose project holds its max_nets nets
        # (PROJECT_SHARES), nor any while the net holds a stray, so it keeps no server up.
        if self.holds_stray(net):
            return False
        return any(
            j.state == J.QUEUED
            and self.fits(j, net)
            and not self.waits_for_its_stray(j.id)
            and not self.at_cap(j.project)
            for j in self.jobs
        )

    def fits(self, job: JobRow, net: str) -> bool:
        """The job may run on the net: pinned to it or to none, and needing no site the net
        lacks where NETS declares its sites (a claim never gives it such a job: enqueue took
        it for another net that has them, tests.sim.long_queue)."""
        if job.requested_net not in (None, net):
            return False
        settings = self.sim.settings
        return not settings.has_net(net) or not settings.net(net).lacks(job.sites)

    def at_cap(self, project: str | None) -> bool:
        """The project holds as many nets (its active jobs) as PROJECT_SHARES lets it."""
        cap = self.sim.settings.shares.cap(project) if project is not None else None
        if cap is None:
            return False
        held = sum(1 for j in self.jobs if j.project == project and j.state in ACTIVE_JOB_STATES)
        return held >= cap

    # --- at rest ------------------------------------------------------------------------------

    def unsettled(self) -> list[str]:
        """Why the world is not at rest yet (empty: at rest)."""
        sim = self.sim
        t = sim.clock.t
        sim.cluster.advance(t)
        self.read()
        reasons = []
        for job in self.jobs:
            # Liveness: once faults stop, every job ends (not only: none is stuck where a
            # net could take it). The waits the design leaves to an operator: a job whose
            # own stray run has a status its always-on server never gives, or is on a server
            # that never answers again or an always-on one refusing every stop, and a job
            # pinned to that net (`_left_to_operator`).
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
            # An undeclared net's runs are the operator's (see stray-run-stopped), and so are
            # those of an always-on net whose server refuses every stop (`deaf_for_good`).
            if sim.declared_net(run.net) and not self.deaf_for_good(run.net):
                reasons.append(f"run {run.nvflare_id} of job {run.job_id[:8]} still live")
        # Every prewarm's row has its outcome (a live hold keeps the world going).
        reasons += self.open_prewarms()
        if sim.broker.work_pending():
            reasons.append("messages pending")
        if sim.world.callbacks:
            reasons += [f"callbacks {line}" for line in self.undelivered()]
        return reasons

    def open_prewarms(self) -> list[str]:
        """Prewarms whose row has no outcome yet (the world is not at rest)."""
        return [f"prewarm {h.key[:40]} open on {h.net}" for h in self.holds if h.outcome is None]

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

    def gone_for_good(self, net: str | None) -> bool:
        """The net's server runs but nothing answers it, for good (a fault that never ends,
        tests.sim.flower_faults): only an operator can settle what it holds."""
        server = self.sim.cluster.servers.get(net or "")
        gone = getattr(server, "gone", None)
        return gone is not None and bool(gone(self.sim.clock.t))

    def deaf_for_good(self, net: str | None) -> bool:
        """The net is always-on and its server refuses every stop for good (DEAF,
        tests.sim.flower_faults, on a net a PER_JOB_FL_SERVER flip made always-on: seed
        7349): nothing of the dispatcher restarts an always-on server, so only an operator
        settles what it holds (README, `FlDispatcherStrayRunsNeedOperator`)."""
        name = net or ""
        server = self.sim.cluster.servers.get(name)
        refuses = getattr(server, "refuses_stops", None)
        return (
            refuses is not None
            and bool(refuses(self.sim.clock.t))
            and self.sim.declared_net(name)
            and not self.sim.scales_to_zero(name)
        )

    def deaf_and_up(self, net: str) -> bool:
        """The net scales to zero, its SuperLink refuses every stop for good (DEAF) and answers:
        a stray run on it ends only with the server's take-down at the idle grace (README: a
        Flower net is never taken down for its strays), which `idle-net-at-zero` bounds."""
        server = self.sim.cluster.servers.get(net)
        refuses = getattr(server, "refuses_stops", None)
        t = self.sim.clock.t
        return (
            server is not None
            and refuses is not None
            and bool(refuses(t))
            and self.sim.scales_to_zero(net)
            and server.answering(t)
        )

    def operators_net(self, net: str | None) -> bool:
        """Only an operator can settle the net's strays: its server never answers again, or
        it is always-on and refuses every stop."""
        return self.gone_for_good(net) or self.deaf_for_good(net)

    def _only_nets_left_to_operator(self, job: JobRow) -> bool:
        """Every declared net the job may run on is the operator's (`operators_net`) and
        holds a stray (none: not so)."""
        if job.requested_net is not None:
            nets = [job.requested_net]
        else:
            sites = self.sim.conn.execute(
                "SELECT required_sites FROM jobs WHERE replace(id, '-', '') = ?",
                (job.id.replace("-", ""),),
            ).fetchone()
            wanted = json.loads(sites[0]) if sites and sites[0] else []
            nets = [n.name for n in self.sim.settings.nets if not n.lacks(wanted)]
        return bool(nets) and all(self.operators_net(n) and self.holds_stray(n) for n in nets)

    def _left_to_operator(self, job: JobRow) -> bool:
        """A QUEUED job whose wait only an operator can end: its own stray run on an always-on
        net whose status its server never gives, or on a net only an operator can settle
        (`operators_net`); or every net it may run on (the one it is pinned to) is such a net
        holding a stray (the claim passes each by; seed 1760: the other net removed from
        NETS)."""
        if job.state != J.QUEUED or not self.has_strays:
            return False
        if self._only_nets_left_to_operator(job):
            return True
        rows = self.sim.conn.execute(
            "SELECT net_name, nvflare_job_id, submit_token FROM stray_runs"
            " WHERE replace(job_id, '-', '') = ?",
            (job.id.replace("-", ""),),
        ).fetchall()
        for net, nvflare_id, token in rows:
            if self.operators_net(net):
                return True
            if self.sim.scales_to_zero(net):
                continue
            key = nvflare_id or token
            run = next((r for r in self.sim.cluster.runs if key in (r.nvflare_id, r.token)), None)
            if run is not None and run.poisoned:
                return True
        return False
