"""What the invariants keep between steps and read from the world: the jobs and nets
tables (raw SQL on the simulation's one connection: cheap, and read again only when a row
changed), the cluster's TRUE record of runs, and the since-when clocks the bounded checks
use. The checks themselves are the families built on it (app.sim.invariants,
app.sim.run_invariants, app.sim.quiescence)."""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from app.sim import bounds
from app.sim.bounds import Bounds
from app.sim.clock import SimClock, seconds_of
from app.sim.cluster import Cluster
from app.sim.messages import Broker
from app.sim.receiver import SimReceiver
from app.sim.report import Violation
from app.sim.servers import Run
from app.sim.workload import Workload
from app.usecases import services
from models import ACTIVE_JOB_STATES, ASSIGNABLE_NET_STATES, JobState, NetState

J = JobState


class Host(bounds.Host, Protocol):
    """What the invariants read from the simulation they check."""

    conn: sqlite3.Connection
    clock: SimClock
    cluster: Cluster
    broker: Broker
    receiver: SimReceiver
    workload: Workload

    def trace(self, line: str) -> None: ...

    def on_requeued(self, job_id: str) -> None: ...

    def declared_net(self, net: str | None) -> bool: ...

    def scales_to_zero(self, net: str) -> bool: ...


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


class Observer:
    """Keeps what it needs between steps (last history rows seen, since-when clocks)."""

    def __init__(self, sim: Host) -> None:
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
        self._unreachable_at: dict[str, float] = {}  # net -> last seen not answering
        self._held_runs: dict[str, str] = {}  # job id -> the run id it held at the last step
        self._claims_seen: set[tuple[str, int]] = set()
        self.jobs: list[JobRow] = []
        self.nets: list[NetRow] = []
        self.holds: list[HoldRow] = []  # read only in a world with prewarms
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
        exists: it does not on the code before the fix). A row names its run by id, or by
        token where no id is known, as settle_stray_runs finds it (a token's later run,
        submitted again on a new process, is not the row's)."""
        if not self._has_strays:
            return False
        row = self.sim.conn.execute(
            "SELECT 1 FROM stray_runs WHERE net_name = ? AND (nvflare_job_id = ? OR"
            " (nvflare_job_id IS NULL AND submit_token = ?)) LIMIT 1",
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
        """A completed run counts if the dispatcher saw it complete (a status read answered
        its end), or could have: after it completed, while its job still held its id, its
        server answered (and still knew it) for three housekeeping intervals, so monitor
        rounds asked, not all of them failed by a per-call fault. (A run that finished while
        its server was unreachable, or just before the server died, cannot be told from a
        lost run.)"""
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
        if run.nvflare_id in server.finished_seen:
            self._completions[run.nvflare_id] = True  # a status read answered its end
            return True
        if server.reachable(t) and run.nvflare_id in server.store:
            since = self._seen_answering.setdefault(run.nvflare_id, t)
            if t - since >= 3 * self.sim.world.housekeeping_interval_s:
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
        """A net's server is needed: an active job on it, a live prewarm hold on it, or a
        QUEUED job that could take it while it is assignable."""
        if any(j.net == net and j.state in ACTIVE_JOB_STATES for j in self.jobs):
            return True
        if self.holds and self.held(net, self.sim.clock.t):
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
