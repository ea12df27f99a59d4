"""The invariants of fair share between projects (issue 40, app/usecases/fair_share.py and
app/usecases/queue_place.py), in every world (jobs without a project are one default project,
and AGING_S applies to all):

- `fair-share-order` (at each claim): the job a claim took is the first, in this module's
  own reading of the documented order, of the jobs the net could take at that instant: QUEUED,
  no stray run of theirs, pinned to the net or unpinned, with sites the net has where it
  declares them, of a project below its cap; first the jobs QUEUED for AGING_S since their
  enqueue (the oldest first), then the lowest project usage (nets held / weight), the highest
  priority, the oldest, the lowest id. A temporary trigger writes down, inside the claim's
  own transaction, the queue and the nets each project held just before it (a claim rolled
  back takes its rows back);
- `aging-bound` (at each claim): no claim passes an aged job that fits the net for a younger
  job: once QUEUED for AGING_S, a job is taken before every job enqueued after it, so it
  waits at most AGING_S plus the time the nets that fit it take to serve the aged jobs
  enqueued before it (its project below its cap);
- `project-over-cap` (every step): no project holds more nets (active jobs) than its
  max_nets;
- `place-in-line` (every step the tables or the set of aged jobs changed): each QUEUED job's
  place in line and waiting reason, as `GET /jobs/{id}` reads them
  (app.usecases.queue_place), are what this module computes from the rows."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import StaticPool

from app.project_shares import Shares
from app.settings import Settings
from app.sim.db import Unchanged
from app.sim.simulation import Simulation
from app.usecases.queue_place import queue_places
from models import ACTIVE_JOB_STATES, ASSIGNABLE_NET_STATES, NetState
from tests.sim.observer import Observer

_ACTIVE = ", ".join(f"'{s.value}'" for s in sorted(ACTIVE_JOB_STATES))
_SCHEMA = f"""
CREATE TEMP TABLE sim_claim (seq INTEGER PRIMARY KEY, job TEXT, net TEXT, at TEXT);
CREATE TEMP TABLE sim_claim_queue (
    claim INTEGER, job TEXT, project TEXT, priority INTEGER, created TEXT, requested TEXT,
    sites TEXT, stray INTEGER
);
CREATE TEMP TABLE sim_claim_held (claim INTEGER, project TEXT, held INTEGER);
CREATE TEMP TRIGGER sim_fair_claim AFTER UPDATE OF state ON main.jobs
WHEN NEW.state = 'ASSIGNED' AND OLD.state = 'QUEUED'
BEGIN
    INSERT INTO sim_claim (job, net, at) VALUES (NEW.id, NEW.net_name, NEW.assigned_at);
    INSERT INTO sim_claim_queue
    SELECT (SELECT max(seq) FROM sim_claim), j.id, j.project_id, j.priority, j.created_at,
        j.requested_net, j.required_sites,
        EXISTS (SELECT 1 FROM main.stray_runs s WHERE s.job_id = j.id)
    FROM main.jobs j WHERE j.state = 'QUEUED' OR j.id = NEW.id;
    INSERT INTO sim_claim_held
    SELECT (SELECT max(seq) FROM sim_claim), project_id, count(*) FROM main.jobs
    WHERE state IN ({_ACTIVE}) AND id != NEW.id GROUP BY project_id;
END;
"""
_STORED = "%Y-%m-%d %H:%M:%S.%f"  # how SQLite stores a UTCDateTime (SQLAlchemy's format)


@dataclass(frozen=True)
class Queued:
    """A QUEUED job as the order reads it."""

    id: str  # as stored: 32 hex digits
    project: str | None
    priority: int
    created: str  # as stored: compared as the product's SQL compares it
    requested: str | None
    sites: tuple[str, ...]
    stray: bool


@dataclass(frozen=True)
class _AsRead:
    """A QUEUED job as queue_place reads one (app.usecases.queue_place.QueuedJob)."""

    id: uuid.UUID
    requested_net: str | None
    required_sites: list[str]
    project_id: str | None


def install(conn: sqlite3.Connection) -> None:
    """Write down the queue and the nets held at every claim, from now on."""
    conn.executescript(_SCHEMA)


def key(
    job: Queued, held: Counter[str | None], shares: Shares, aged_before: str
) -> tuple[Any, ...]:
    """The documented order (app/usecases/README.md "The claim's order"), ascending."""
    if job.created < aged_before:
        return (0, 0, 0, job.created, job.id)
    usage = held[job.project] / shares.weight(job.project) if shares.weights else held[job.project]
    return (1, usage, -job.priority, job.created, job.id)


def capped(project: str | None, held: Counter[str | None], shares: Shares) -> bool:
    cap = shares.cap(project)
    return cap is not None and held[project] >= cap


def fits(job: Queued, net: str, settings: Settings) -> bool:
    """The job may run on this declared net (pinned to it or unpinned, with its sites)."""
    return job.requested in (None, net) and not settings.net(net).lacks(list(job.sites))


def aged_before(at: datetime, shares: Shares) -> str:
    """The claim's now - AGING_S, as stored; before year 1, the first instant (no job is
    aged): the checker reads on where the product's own subtraction fails, so what the
    sweep reports is the product's failure (an AGING_S past its bound), not the checker's."""
    try:
        return (at - timedelta(seconds=shares.aging_s)).astimezone(UTC).strftime(_STORED)
    except OverflowError:
        return "0001-01-01 00:00:00.000000"


def _queued(row: tuple[Any, ...]) -> Queued:
    job, project, priority, created, requested, sites, stray = row
    return Queued(job, project, priority, created, requested, tuple(json.loads(sites)), bool(stray))


class FairShareInvariants(Observer):
    """The fair-share checks (state: the claims read so far, the last place-in-line key)."""

    def start(self, sim: Simulation) -> None:
        super().start(sim)
        self._claim_seen = 0
        self._places_key: tuple[Any, ...] | None = None
        self._claims_read = Unchanged(sim.conn)
        self._places_rows = Unchanged(sim.conn)  # the rows below last read, unchanged since
        self._places_read: tuple[list[Queued], tuple[Any, ...]] = ([], ())
        self._fair = sim.state.has_projects  # (code before issue 40 has no projects)
        if self._fair:
            install(sim.conn)
        # The product's reads, on an engine of their own over the simulation's connection:
        # the workers' engine carries the database faults (tests.sim.dbfaults), whose draws a
        # read of the checker's (a worker stalled mid-message) would move, or fail.
        conn = sim.conn
        self._reader = sessionmaker(
            create_engine("sqlite://", creator=lambda: conn, poolclass=StaticPool)
        )

    def _fair_share(self, t: float) -> None:
        if not self._fair:
            return
        self._claim_order()
        self._over_cap()
        self._places()

    def _claim_order(self) -> None:
        if self._claims_read.holds():
            return  # no row written since the last read: no claim either
        conn = self.sim.conn
        settings = self.sim.settings
        shares = settings.shares
        for seq, job, net, at in conn.execute(
            "SELECT seq, job, net, at FROM sim_claim WHERE seq > ? ORDER BY seq",
            (self._claim_seen,),
        ).fetchall():
            self._claim_seen = seq
            if not settings.has_net(net):
                continue  # a claim takes no net NETS does not declare
            queue = [
                _queued(row)
                for row in conn.execute(
                    "SELECT job, project, priority, created, requested, sites, stray"
                    " FROM sim_claim_queue WHERE claim = ?",
                    (seq,),
                )
            ]
            held: Counter[str | None] = Counter(
                {
                    p: n
                    for p, n in conn.execute(
                        "SELECT project, held FROM sim_claim_held WHERE claim = ?", (seq,)
                    )
                }
            )
            claimed_at = datetime.fromisoformat(at).replace(tzinfo=UTC)
            before = aged_before(claimed_at, shares)
            takeable = [
                q
                for q in queue
                if not q.stray and fits(q, net, settings) and not capped(q.project, held, shares)
            ]
            ordered = sorted(takeable, key=lambda q: key(q, held, shares, before))
            took = next((q for q in queue if q.id == job), None)
            if not ordered or took is None or ordered[0].id != job:
                first = ordered[0].id[:8] if ordered else "none"
                self.report(
                    "fair-share-order",
                    f"job {str(uuid.UUID(job))[:8]} on {net}",
                    f"claimed at {at}; the order's first of {len(takeable)} takeable was {first}"
                    f" (held per project {dict(held)})",
                )
            aged = [q for q in takeable if q.created < before]
            if aged and took is not None and min(aged, key=lambda q: (q.created, q.id)) != took:
                oldest = min(aged, key=lambda q: (q.created, q.id))
                self.report(
                    "aging-bound",
                    f"job {str(uuid.UUID(oldest.id))[:8]}",
                    f"aged (enqueued {oldest.created}, AGING_S {shares.aging_s:.0f}) and fitting"
                    f" {net}, passed at {at} by job {str(uuid.UUID(job))[:8]}, enqueued"
                    f" {took.created}",
                )

    def _over_cap(self) -> None:
        shares = self.sim.settings.shares
        if not shares.caps:
            return
        held = Counter(j.project for j in self.jobs if j.state in ACTIVE_JOB_STATES)
        for project, cap in shares.caps:
            if held[project] > cap:
                self.report(
                    "project-over-cap",
                    f"project {project}",
                    f"holds {held[project]} nets (max {cap})",
                )

    def _places(self) -> None:
        """Each QUEUED job's place in line and waiting reason, as the product reads them,
        against this module's own reading of the rows (when something they depend on
        changed: a job's or a net's state, a drain, a stray run, which jobs are aged)."""
        sim = self.sim
        conn = sim.conn
        if conn.in_transaction or not any(j.state == "QUEUED" for j in self.jobs):
            return  # (a worker's open transaction: the product cannot read beside it)
        settings = sim.settings
        now = sim.clock()
        before = aged_before(now, settings.shares)
        if not self._places_rows.holds():
            # Read again only after a row changed (most steps only move the clock).
            queue = [
                _queued(row)
                for row in conn.execute(
                    "SELECT id, project_id, priority, created_at, requested_net, required_sites,"
                    " EXISTS (SELECT 1 FROM stray_runs s WHERE s.job_id = jobs.id)"
                    " FROM jobs WHERE state = 'QUEUED'"
                )
            ]
            strays = conn.execute("SELECT job_id, net_name FROM stray_runs ORDER BY id")
            jobs = tuple((j.id, j.state, j.net) for j in self.jobs)
            self._places_read = (queue, (jobs, tuple(self.nets), tuple(strays.fetchall())))
        queue, rows = self._places_read
        aged = frozenset(q.id for q in queue if q.created < before)
        # What a place and a reason depend on (not every write: callbacks, histories).
        seen = (*rows, aged, id(settings))
        if seen == self._places_key:
            return
        self._places_key = seen
        expected = expected_places(conn, settings, queue, before)
        asked = [_AsRead(uuid.UUID(q.id), q.requested, list(q.sites), q.project) for q in queue]
        with self._reader() as session:
            try:
                # Every queued job's at once, as `GET /jobs/{id}` reads each (queue_place).
                places = queue_places(session, asked, settings, now)
            except Exception as exc:  # the view itself failing is what is reported
                self.report(
                    "place-in-line",
                    f"{len(asked)} queued jobs",
                    f"the view raised {type(exc).__name__}: {str(exc)[:120]}",
                )
                return
            for q, job in zip(queue, asked, strict=True):
                found = places[job.id]
                if (found.place, found.reason) != expected[q.id]:
                    self.report(
                        "place-in-line",
                        f"job {str(uuid.UUID(q.id))[:8]}",
                        f"shown {found.place}, {found.reason!r}; the rows say "
                        f"{expected[q.id][0]}, {expected[q.id][1]!r}",
                    )


def expected_places(
    conn: sqlite3.Connection, settings: Settings, queue: list[Queued], before: str
) -> dict[str, tuple[int, str]]:
    """Each QUEUED job's place in line and waiting reason, from the rows (the definitions
    of tasks/README.md "Place in line", read independently of app.usecases.queue_place)."""
    shares = settings.shares
    held: Counter[str | None] = Counter(
        {
            p: n
            for p, n in conn.execute(
                f"SELECT project_id, count(*) FROM jobs WHERE state IN ({_ACTIVE})"
                " GROUP BY project_id"
            )
        }
    )
    nets = {
        name: (NetState(state), bool(drained), bool(active), bool(stray))
        for name, state, drained, active, stray in conn.execute(
            "SELECT name, state,"
            " EXISTS (SELECT 1 FROM drains WHERE scope IN (nets.name, '*')),"
            f" EXISTS (SELECT 1 FROM jobs WHERE net_name = nets.name AND state IN ({_ACTIVE})),"
            " EXISTS (SELECT 1 FROM stray_runs WHERE net_name = nets.name) FROM nets"
        )
    }
    out = {}
    for job in queue:
        its = [n.name for n in settings.nets if n.name in nets and fits(job, n.name, settings)]
        undrained = [n for n in its if not nets[n][1]] or its
        mine = key(job, held, shares, before)
        ahead = sum(
            1
            for other in queue
            if other.id != job.id
            and not other.stray
            # (its own project's count when it is capped: its place once that cap frees)
            and (other.project == job.project or not capped(other.project, held, shares))
            and key(other, held, shares, before) < mine
            and any(fits(other, n, settings) for n in undrained)
        )
        if not any(fits(job, n.name, settings) for n in settings.nets):
            reason = "no declared net fits it"  # a redeploy took its sites' nets away
        elif job.stray:
            reason = "earlier run settling"
        elif capped(job.project, held, shares):
            reason = "project at its cap"
        elif its and all(nets[n][1] for n in its):
            reason = "net drained"
        elif any(nets[n][0] in ASSIGNABLE_NET_STATES and not any(nets[n][1:]) for n in its):
            reason = "claim pending"
        else:
            reason = "no free net"
        out[job.id] = (1 + ahead, reason)
    return out
