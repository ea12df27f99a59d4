"""A QUEUED job's place in line and the reason it waits (issue 40: `GET /jobs/{id}`, `job`),
read as the claim would decide now. Reads only, in one or two statements.

**Place in line**: 1 + the number of other QUEUED jobs the claim would take before it now:
those a claim may take (no earlier run of theirs still settling, their project below its
cap), that come before it in the claim's order (`fair_share`: aged jobs first, then project
usage, priority, age), and that may run on a net it may run on (a net NETS declares, the
job's own if it is pinned, with the sites either job needs where the net declares its
sites). A job of a project at its cap is given the place it would have once the cap frees,
as the order stands now: its own project's jobs before it count, those of other capped
projects do not.

**Waiting reason**, the first that holds:

- `earlier run settling`: a run of an earlier attempt may still be alive (a stray run): the
  job is not claimed again until its server says that run is over;
- `project at its cap`: its project holds its `max_nets` nets (PROJECT_SHARES);
- `net drained`: every net it may run on is drained (`drain`);
- `no free net`: no net it may run on is free (each is busy, coming down, out of service,
  or settling a stray run of another job), or there is none;
- `claim pending`: a net it may run on is free: the next claim takes it, or a job ahead of
  it (the assigner runs at once on every enqueue and freed net, else every
  HOUSEKEEPING_INTERVAL_S).

A prewarm hold never makes a job wait: it only orders the free nets (a held net goes to any
job when no other as warm is free), so it is no reason of its own.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, Text, bindparam, cast, exists, func, or_, select, tuple_
from sqlalchemy.orm import Session, aliased
from sqlalchemy.orm import outerjoin as sa_outerjoin

from app.net_config import NetConfig
from app.project_shares import Shares
from app.read_models import WaitingReason
from app.settings import Settings
from app.usecases import fair_share
from app.usecases.claims import claimable, drained
from models import ACTIVE_JOB_STATES, ASSIGNABLE_NET_STATES, Job, Net, NetState, StrayRun

_AHEAD = aliased(Job, name="ahead")  # a job that may come before it
_JOB = aliased(Job, name="queued")  # the job asked about


@dataclass(frozen=True)
class QueuePlace:
    """Where a QUEUED job stands: its place in line (1: the next claim that can take it
    does) and why it waits."""

    place: int
    reason: WaitingReason


@dataclass(frozen=True)
class _NetNow:
    name: str
    state: NetState
    drained: bool
    active: bool  # a job holds it
    stray: bool  # a run no job counts: it takes no job until that is settled

    @property
    def free(self) -> bool:
        return self.state in ASSIGNABLE_NET_STATES and not (
            self.drained or self.active or self.stray
        )


def may_run(requested: str | None, sites: Sequence[str], net: NetConfig) -> bool:
    """A job pinned to `requested` (None: unpinned) needing `sites` may run on `net`."""
    return requested in (None, net.name) and not net.lacks(list(sites))


class QueuedJob(Protocol):
    """What the place of a job is read from (a Job row has it)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def requested_net(self) -> str | None: ...
    @property
    def required_sites(self) -> list[str]: ...
    @property
    def project_id(self) -> str | None: ...


def queue_place(
    session: Session, job: QueuedJob, settings: Settings | None, now: datetime
) -> QueuePlace:
    """The QUEUED `job`'s place in line and waiting reason, now (see the module), in two
    statements. Without `settings`, every net the database holds may be one of its nets,
    sites aside."""
    return queue_places(session, [job], settings, now)[job.id]


def queue_places(
    session: Session, jobs: Sequence[QueuedJob], settings: Settings | None, now: datetime
) -> dict[uuid.UUID, QueuePlace]:
    """Each QUEUED job's place in line and waiting reason, now, as `queue_place` gives one's:
    one statement for the jobs' and their nets' states (a row per job and net), then one per
    set of nets the jobs wait for (most queues: one or a few), not two per job."""
    if not jobs:
        return {}
    conn = session.connection()  # Core statements: no ORM entity is read
    shares = settings.shares if settings is not None else Shares()
    if settings is not None:
        nets = {
            j.id: [n.name for n in settings.nets if may_run(j.requested_net, j.required_sites, n)]
            for j in jobs
        }
    else:
        known = list(session.scalars(select(Net.name).order_by(Net.name)))
        nets = {j.id: [n for n in known if j.requested_net in (None, n)] for j in jobs}
    every_net = sorted({n for names in nets.values() for n in names})
    params = {"jobs": [j.id for j in jobs], "nets": every_net}
    stray: dict[uuid.UUID, bool] = {}
    holding: dict[uuid.UUID, int] = {}
    states: dict[str, _NetNow] = {}
    for row in conn.execute(_built("state", _state), params):
        stray[row[0]], holding[row[0]] = row[1], row[2]
        if row[3] is not None:
            states[row[3]] = _NetNow(*row[3:])
    reasons: dict[uuid.UUID, WaitingReason] = {}
    # The nets each waits for: those not drained, or, while every one is, all of them (its
    # place once they are undrained); the jobs waiting for the same nets are counted together.
    waits_for: dict[tuple[str, ...], list[uuid.UUID]] = {}
    for job in jobs:
        # A net NETS declares that has no row yet (a deploy just added it) is none of its nets
        # until a worker start or an enqueue creates the row.
        mine = [states[n] for n in nets[job.id] if n in states]
        open_nets = [n.name for n in mine if not n.drained] or [n.name for n in mine]
        waits_for.setdefault(tuple(open_nets), []).append(job.id)
        cap = shares.cap(job.project_id)
        capped = cap is not None and holding[job.id] >= cap
        # No declared net may run it (a redeploy edited the sites of the nets that had its
        # sites, or removed the one it is pinned to): no net will free for it.
        unfit = settings is not None and not nets[job.id]
        reason = _reason(stray[job.id], capped, mine)
        reasons[job.id] = "no declared net fits it" if unfit else reason
    ahead: dict[uuid.UUID, int] = {}
    aged_before = now - shares.aging
    for waited, ids in waits_for.items():
        ahead |= _before(conn, settings, ids, waited, aged_before)
    return {j.id: QueuePlace(1 + ahead.get(j.id, 0), reasons[j.id]) for j in jobs}


# Built once per process (and shares) with bind parameters, as the claim's statements are:
# a view read many times (the simulator reads every queued job's at every step) must not
# build its SQL each time. Keyed by the helper a test patches too (the simulation's
# safeguards), so a statement built with its patch is not used once the patch is undone.
_BUILT: dict[tuple[object, ...], Any] = {}


def _built(name: str, build: Callable[..., Any], *args: Any) -> Any:
    key = (name, _not_capped_unless_mine, *args)
    found = _BUILT.get(key)
    if found is None:
        found = _BUILT[key] = build(*args)
    return found


def _state() -> Any:
    """SQL: each job's own state (`jobs`: its id, a stray run of it, its project's nets) and
    each of the nets' (`nets`), a row per job and net (a job's row of NULLs when none)."""
    return (
        select(
            _JOB.id,
            exists().where(StrayRun.job_id == _JOB.id),
            fair_share.held_by(_JOB.project_id),
            Net.name,
            Net.state,
            drained(Net.name),
            exists().where(Job.net_name == Net.name, Job.state.in_(ACTIVE_JOB_STATES)),
            exists().where(StrayRun.net_name == Net.name),
        )
        .select_from(_JOB)
        .outerjoin(Net, Net.name.in_(bindparam("nets", expanding=True)))
        .where(_JOB.id.in_(bindparam("jobs", expanding=True)))
    )


def _before(
    conn: Connection,
    settings: Settings | None,
    job_ids: Sequence[uuid.UUID],
    nets: Sequence[str],
    aged_before: datetime,
) -> dict[uuid.UUID, int]:
    """How many jobs the claim would take before each of `job_ids`, which may run on one of
    `nets` (a job with none ahead may be left out)."""
    if not nets:
        return {}
    shares = settings.shares if settings is not None else Shares()
    params = {"jobs": list(job_ids), "nets": list(nets), "aged_before": aged_before}
    if settings is None or all(settings.net(n).sites is None for n in nets):
        return dict(conn.execute(_built("ahead", _ahead, True, shares), params).all())
    # Some declare their sites: the jobs ahead are counted by their pin and sites (a row per
    # queued job and shape: a queue has few shapes; a row per pair was quadratic, 3,600 rows
    # and as many JSON reads at 60 queued), each shape checked against the nets in Python,
    # as the claim checks them.
    found = conn.execute(_built("ahead shapes", _ahead, False, shares), params)
    configs = [settings.net(n) for n in nets]
    fits: dict[tuple[str | None, str], bool] = {}
    counted: Counter[uuid.UUID] = Counter()
    for job_id, pinned, sites, ahead in found:
        shape = (pinned, sites)
        if shape not in fits:
            fits[shape] = any(may_run(pinned, json.loads(sites), n) for n in configs)
        if fits[shape]:
            counted[job_id] += ahead
    return dict(counted)


def _ahead(count: bool, shares: Shares) -> Any:
    """SQL: the jobs (`_AHEAD`) the claim would take before each of the jobs `jobs` (`_JOB`)
    that may run on one of `nets` (sites aside): how many for each, or how many for each
    and each pin and sites (the sites as the JSON text stored: PostgreSQL's json type has
    no equality to group by)."""
    shape = (_AHEAD.requested_net, cast(_AHEAD.required_sites, Text))
    what = (func.count(),) if count else (*shape, func.count())
    aged_before: Any = bindparam("aged_before", type_=Job.created_at.type)
    # Each project's usage counted once, as the claim counts it (`fair_share.usage_by_project`,
    # materialised on PostgreSQL), and joined to both jobs: counted per queued job (correlated
    # subqueries), a view took 100-135 ms median at 5,000 queued, 9-12 ms so
    # (tests/bench/bench_enqueue_claim.py --place, tests/bench/README.md).
    projects = fair_share.usage_by_project(shares)
    theirs, mine = projects.alias("ahead_usage"), projects.alias("queued_usage")
    found = (
        select(_JOB.id, *what)
        .select_from(
            sa_outerjoin(_JOB, mine, mine.c.project == fair_share.project_key(_JOB)),
            sa_outerjoin(_AHEAD, theirs, theirs.c.project == fair_share.project_key(_AHEAD)),
        )
        .where(
            _JOB.id.in_(bindparam("jobs", expanding=True)),
            _AHEAD.id != _JOB.id,
            claimable(_AHEAD),
            *_not_capped_unless_mine(theirs, shares),
            or_(
                _AHEAD.requested_net.is_(None),
                _AHEAD.requested_net.in_(bindparam("nets", expanding=True)),
            ),
            tuple_(*fair_share.order_key(_AHEAD, func.coalesce(theirs.c.usage, 0), aged_before))
            < tuple_(*fair_share.order_key(_JOB, func.coalesce(mine.c.usage, 0), aged_before)),
        )
    )
    return found.group_by(_JOB.id) if count else found.group_by(_JOB.id, *shape)


def _not_capped_unless_mine(theirs: Any, shares: Shares) -> tuple[Any, ...]:
    """SQL: the job ahead's project is below its cap, or is the asked job's own: a job of a
    project at its cap is given its place once that cap frees, and then its project's jobs
    before it are taken first (left out, two jobs of a capped project both showed 1)."""
    below = fair_share.below_cap(_AHEAD, func.coalesce(theirs.c.held, 0), shares)
    if not below:
        return ()
    same = fair_share.project_key(_AHEAD) == fair_share.project_key(_JOB)
    return (or_(same, *below),)


def _reason(stray: bool, capped: bool, nets: Sequence[_NetNow]) -> WaitingReason:
    if stray:
        return "earlier run settling"
    if capped:
        return "project at its cap"
    if nets and all(n.drained for n in nets):
        return "net drained"
    return "claim pending" if any(n.free for n in nets) else "no free net"
