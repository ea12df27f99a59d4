"""Claims: which QUEUED job goes to which free net (the fair-share order of
`app.usecases.fair_share`: aged jobs first, then the project furthest below its share, then
priority and age; a warm net first), taken without two claimers ever getting the same job or
net; and the questions the housekeeping loops ask of the queue (is a net wanted, would a job
fit it). SQL only."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, aliased

from app.net_config import NetConfig
from app.project_shares import Shares
from app.settings import Settings
from app.usecases import fair_share, site_fit
from app.usecases.fair_share import below_cap, held_by
from app.usecases.step_leases import handoff_lease_s, hold
from models import (
    ACTIVE_JOB_STATES,
    ALL_NETS,
    ASSIGNABLE_NET_STATES,
    Drain,
    Job,
    JobState,
    Net,
    NetState,
    Prewarm,
    PrewarmOutcome,
    StrayRun,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assignment:
    """A job claimed for a net; the caller starts the pipeline after commit."""

    job_id: uuid.UUID
    net_name: str
    net_state: NetState  # the net's state after the claim: STARTING needs a scale-up
    attempt: int = 0  # the job's attempt number: every chain step checks it
    traceparent: str | None = None  # the job's trace (app/traces.py), read with its row


def _active_job_on(net_name_column: object) -> object:
    return exists().where(and_(Job.net_name == net_name_column, Job.state.in_(ACTIVE_JOB_STATES)))


def _claimable(job: Any = Job) -> ColumnElement[bool]:
    """A QUEUED job that may be claimed: one whose earlier run may still be alive (a stray
    run) waits, so a job never has two live runs. (`job`: Job, or an alias of it.)"""
    return and_(job.state == JobState.QUEUED, ~exists().where(StrayRun.job_id == job.id))


def claimable(job: Any = Job) -> ColumnElement[bool]:
    """SQL: a QUEUED job that may be claimed now (see `_claimable`; `job`: Job, or an alias
    of it)."""
    return _claimable(job)


def takeable(shares: Shares, job: Any = Job) -> ColumnElement[bool]:
    """SQL: a claimable QUEUED job whose project is below its cap (`fair_share.below_cap`):
    the jobs a claim may take now. (`job`: Job, or an alias of it.)"""
    return and_(_claimable(job), *below_cap(job, held_by(job.project_id), shares))


def wanted_by_queued_job(net_name_column: Any, shares: Shares | None = None) -> ColumnElement[bool]:
    """SQL: a claimable QUEUED job could run on this net (an unpinned job fits every net, a
    pinned one only its own); with `shares`, only a job the claim may take now (its project
    below its cap), as the claim and the idle check count it. Without, any: the awaited-run
    poll watches the runs a capped job awaits too, since one ending may free its cap."""
    queued = _claimable() if shares is None else takeable(shares)
    # Only claimable jobs pin a net (test_a_net_pinned_only_by_finished_jobs_is_not_wanted).
    # No NULL filter: an unpinned job's NULL never matches a name, and with one queued the
    # exists() below is true anyway.
    pinned = select(Job.requested_net).where(queued)
    return or_(exists().where(queued, Job.requested_net.is_(None)), net_name_column.in_(pinned))


def _live_hold_on(net_name_column: Any, now: Any) -> ColumnElement[bool]:
    """SQL: a prewarm holds this net now (open, its deadline still ahead: a hold is live on
    [created_at, hold_until); a refusal is never open)."""
    return and_(
        Prewarm.net_name == net_name_column,
        Prewarm.outcome.is_(None),
        Prewarm.hold_until > now,
    )


def _may_run_on(job: Any, net_name_column: Any) -> ColumnElement[bool]:
    return or_(job.requested_net.is_(None), job.requested_net == net_name_column)


# The job active on the net a claim locked, read again after the lock (`_next_jobs`): an
# alias, so the EXISTS is not correlated to the queued job it filters.
_ON_NET = aliased(Job, name="on_net")

# One alias for every claim: a fresh `aliased(Job)` per claim costs its column proxies again
# (1.8 ms of SQL building per claim against 0.46 ms; a quarter of a simulated seed's time).
_AHEAD = aliased(Job, name="ahead")


def _hinted_here(net_name_column: Any, now: Any, shares: Shares) -> ColumnElement[bool]:
    """SQL: the job names (prewarm_key) a live hold on this net, may run on it (a job
    pinned elsewhere leaves the net held for a job still to come), and is the one this net
    would take next: no job the claim may take that may run on it comes before it (in the
    claim's own order, `fair_share.comes_before`, which `_next_jobs` sorts by). Otherwise
    the net, first of its warmth, would go to that earlier job, which would end the hold as
    its own while an unheld net as warm was free and the hinted job waited (the net the
    claim locks is given to the first job that fits it). A job whose project is at its cap
    is not taken: it is hinted nowhere, and passes no other."""
    ahead = _AHEAD
    aged_before: Any = bindparam("aged_before")
    return and_(
        # First, as a plain filter a scan applies: with no job naming a hold (most claims)
        # no job is compared with the queue at all (PostgreSQL otherwise joined the queue
        # with itself before looking at the holds: 100 ms for 500 jobs on 20 nets).
        Job.prewarm_key.is_not(None),
        Job.prewarm_key.in_(
            # Correlated to the nets of the claim's first query, two levels up (named:
            # auto-correlation reaches one level only).
            select(Prewarm.caller_key)
            .where(_live_hold_on(net_name_column, now))
            .correlate(net_name_column.table)
        ),
        _may_run_on(Job, net_name_column),
        *below_cap(Job, held_by(Job.project_id), shares),
        ~exists()
        .where(
            takeable(shares, ahead),
            _may_run_on(ahead, net_name_column),
            fair_share.comes_before(ahead, Job, shares, aged_before),
        )
        .correlate(Job, net_name_column.table),  # the job (one level up) and the net (two)
    )


def claim_next_job(session: Session, settings: Settings, now: datetime) -> Assignment | None:
    """Claim the next QUEUED job (the fair-share order, `app.usecases.fair_share`) and a free
    net for it.

    Both rows are taken with FOR UPDATE SKIP LOCKED (PostgreSQL), so concurrent claimers
    never block each other and never get the same job or net; on SQLite the transaction
    holds the write lock from BEGIN (see app.db). A warm (READY) net is preferred to a cold
    one. Serialised with `scale_down_idle_nets`, which locks the same net row.

    Prewarms (tasks/README.md "Prewarm"): among the nets as warm as each other, a net held for a
    waiting job that names its hold (`prewarm_key`) comes first when that job is the one
    the net would take next (none that may run there is ahead of it), and a net no hold keeps
    comes before one held for a job still to come, so a job that named no hint leaves the
    held net to its job while another as warm is free. A warmer net still comes first: a
    caller that names no hint (its job may be the one held for) meets its warm server, and
    nothing waits for a hold. The jobs keep their order (the claim's): a hint never
    puts its job ahead of one that was waiting (measured: in a burst, that made older jobs
    wait a whole run more). A job that names a hold ends it wherever it goes.

    The first statement lists only the free nets some QUEUED job could run on (an unpinned
    job fits every free net; a pinned one only its own), so a claim that cannot place any
    job returns after that one query, whatever the number of nets or jobs.
    """
    if not settings.nets:
        return None
    shares = settings.shares
    order = {"now": now, "aged_before": now - shares.aging}
    candidates = session.scalars(_statement("candidates", partial(_candidates, shares)), order)
    for name in candidates.all():
        if not settings.has_net(name):
            continue  # a row left by a net no longer declared
        # Lock one net at a time: locking every free net in one statement would let the
        # first claimer hide all nets from the others until it commits.
        net = session.scalar(_statement("lock net", _lock_net), {"name": name})
        # None: a concurrent claimer took the net (or holds its lock) since the read above.
        if net is None:
            continue
        job = _next_job_for(session, settings.net(name), shares, order["aged_before"])
        # A project found at its cap once a concurrent claim of it committed: the net, still
        # locked by this claim, goes to the next job in the order (this statement's fresh
        # snapshot counts that project at its cap), not back to the pool with a job fitting
        # it waiting: a claim that takes nothing ends its round (dispatch.claim_and_start).
        while job is not None and not _cap_holds(session, shares, job):
            job = _next_job_for(session, settings.net(name), shares, order["aged_before"])
        if job is None:
            continue  # none it may run: the next net may
        job.assign(net.name, now)
        # The chain's first step must reach a worker and start within this, or it is
        # re-driven (a lost message, a worker killed holding it).
        hold(job, now, handoff_lease_s(settings))
        if net.state == NetState.STOPPED:
            net.transition(NetState.STARTING, now, f"job {job.id} assigned")
        net.idle_since = None
        if _lock_holds(session, job, net.name, now):
            # None locked, none to end: a hold committed after that read is one made after
            # this claim, as one made after its commit would be (issue 37: a statement fewer
            # for most claims).
            _end_named_hold(session, job, net.name, now)
            _use_holds(session, net.name, job.id, now)
        session.flush()
        log.info("job assigned", extra={"job": str(job.id), "net": net.name})
        return Assignment(job.id, net.name, net.state, job.attempts, job.traceparent)
    return None


# The claim's statements, each built once per process with bind parameters (`now`, the
# net's name...) rather than per claim: building and keying them was a quarter of a
# simulated seed's CPU (issue 37). Keyed by the helpers they are built from too, so a test
# that patches one (the simulation's safeguards) gets a statement built with its patch.
_BUILT: dict[tuple[object, ...], Any] = {}


def _statement(name: str, build: Callable[[], Any]) -> Any:
    # A partial is keyed by what it calls with what: two partials of one builder are never
    # equal, so keyed as themselves each claim would build (and keep) statements anew.
    how = (build.func, build.args) if isinstance(build, partial) else build
    key = (name, how, _hinted_here, _live_hold_on, _claimable)
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = build()
    return built


def _free() -> tuple[ColumnElement[bool], ...]:
    return (
        Net.state.in_(ASSIGNABLE_NET_STATES),
        ~_active_job_on(Net.name),  # type: ignore[operator]
        # A run the server may still hold must be settled before the net takes a new job.
        ~exists().where(StrayRun.net_name == Net.name),
        # Drained (app.usecases.drains): on its own, or with the whole deployment. Read in
        # the candidates' statement and again in the one that locks the net (and, after that
        # lock, in `_next_jobs`): no statement more per claim.
        ~drained(Net.name),
    )


def drained(net_name_column: Any) -> ColumnElement[bool]:
    """SQL: the net is drained (a `drains` row names it, or the whole deployment's)."""
    return exists().where(or_(Drain.scope == net_name_column, Drain.scope == ALL_NETS))


def _candidates(shares: Shares) -> Any:
    """The free nets some job the claim may take may run on, warmest first
    (`claim_next_job`)."""
    now: Any = bindparam("now")
    warm_first = case(
        (Net.state == NetState.READY, 0),
        (Net.state == NetState.STARTING, 1),
        else_=2,  # pragma: no mutate (3, its mutant, is after 0 and 1 too: the same order)
    )
    queued = _claimable()
    hinted = exists().where(queued, _hinted_here(Net.name, now, shares))
    held = exists().where(_live_hold_on(Net.name, now))
    return (
        select(Net.name)
        .where(*_free(), wanted_by_queued_job(Net.name, shares))
        .order_by(
            warm_first,
            ~hinted,  # held for a waiting job that named its hold: first of its warmth
            held,  # held for a job still to come: after the unheld nets as warm
            Net.name,  # a tie-break: the same net whatever order the rows were written in
        )
    )


def _lock_net() -> Any:
    """The net named `name`, locked, if it is still free (SKIP LOCKED: another claimer's)."""
    return (
        select(Net).where(Net.name == bindparam("name"), *_free()).with_for_update(skip_locked=True)
    )


def _named_live_hold(prewarm_key: Any, now: Any) -> ColumnElement[bool]:
    """SQL: the live hold a job names by its prewarm_key, on whichever net."""
    return and_(
        Prewarm.caller_key == prewarm_key,
        Prewarm.outcome.is_(None),
        Prewarm.hold_until > now,
    )


def _lock_holds(session: Session, job: Job, net_name: str, now: datetime) -> bool:
    """Lock the live holds this claim ends (the one its job names, those on its net) in id
    order, before ending them: two claims that each end the other's net's hold would
    otherwise lock the two rows in opposite orders, and PostgreSQL would kill one of them as
    a deadlock (tests/integration/test_pg_state.py). No lock on SQLite (write lock from
    BEGIN). Whether there is any."""
    named = job.prewarm_key is not None
    stmt = _statement("lock named holds" if named else "lock holds", partial(_holds, named))
    found = session.execute(stmt, {"net": net_name, "now": now, "key": job.prewarm_key})
    return found.first() is not None


def _holds(named: bool) -> Any:
    now: Any = bindparam("now")
    ends = _live_hold_on(bindparam("net"), now)
    if named:
        ends = or_(ends, _named_live_hold(bindparam("key"), now))
    return select(Prewarm.id).where(ends).order_by(Prewarm.id).with_for_update()


def _end_named_hold(session: Session, job: Job, net_name: str, now: datetime) -> None:
    """The live hold the claimed job names (its prewarm_key) ends `used` by it, whichever
    net it went to: a hold never keeps a server up for a job already running elsewhere."""
    if job.prewarm_key is None:
        return
    detail = f"job {job.id}, sent for it, was claimed onto net {net_name}"
    params = {"key": job.prewarm_key, "now": now, "job": job.id, "detail": detail}
    session.execute(_statement("end named hold", _end_named), params)


def _end_named() -> Any:
    return _ending(_named_live_hold(bindparam("key"), bindparam("now")))


def _ending(holds: ColumnElement[bool]) -> Any:
    """Those holds end `used` by job `job` at `now`, saying `detail`."""
    return (
        update(Prewarm)
        .where(holds)
        .values(
            outcome=PrewarmOutcome.USED,
            ended_at=bindparam("now"),
            job_id=bindparam("job"),
            detail=bindparam("detail"),
        )
        # No Prewarm row is loaded in a claim's session: nothing to synchronise.
        .execution_options(synchronize_session=False)
    )


def _use_holds(session: Session, net_name: str, job_id: uuid.UUID, now: datetime) -> None:
    """A job claimed onto a net ends its open prewarm holds as `used`, in the claim's own
    transaction, so no read between the claim and a scale-down round shows them held (nor
    expired, then used): the holds a settling round would find used, those still live at the
    claim, i.e. whose deadline is after it (a hold is live on [created_at, hold_until), as
    prewarm_holds.settle_row and prewarm.status_of read it). A refusal is never open: it is
    written with its outcome."""
    detail = f"job {job_id} was claimed onto the net"
    params = {"net": net_name, "now": now, "job": job_id, "detail": detail}
    session.execute(_statement("use holds", _use), params)


def _use() -> Any:
    return _ending(_live_hold_on(bindparam("net"), bindparam("now")))


def _next_job_for(
    session: Session, net: NetConfig, shares: Shares, aged_before: datetime
) -> Job | None:
    """The next QUEUED job (the claim's order) that may run on `net`, locked: a net that
    declares its sites never takes a job needing one it lacks (enqueue refused such a job
    only when no net could run it, so another net may), asked in the same statement
    (`site_fit`), so the first job of the order that fits is found wherever it waits, and
    no job passed over is locked."""
    params: dict[str, object] = {"net": net.name, "aged_before": aged_before}
    if net.sites is None:
        job: Job | None = session.scalar(
            _statement("next job", partial(_next_jobs, shares)), params
        )
        return job
    params |= site_fit.net_sites_param(net.sites)
    sited: Job | None = session.scalar(
        _statement("next job, sited", partial(_next_jobs, shares, sited=True)), params
    )
    return sited


def _next_jobs(shares: Shares, *, sited: bool = False) -> Any:
    """The claim's next job for the net `:net`, in its order, locked; `sited`: only one whose
    sites are among the net's (`:net_sites`)."""
    statement = queue_for_net(shares, sited=sited).limit(1)
    return statement.with_for_update(skip_locked=True, of=Job)


def queue_for_net(shares: Shares, *, sited: bool = False) -> Any:
    """SQL: the QUEUED jobs the net `:net` may take now, in the claim's order, unlocked (a
    Select of Job; `sited` as `_next_jobs`)."""
    # Each project's usage counted once per claim (a join), not once per queued job;
    # materialised, so PostgreSQL joins the queue to its few rows without aggregating them
    # again for each queued job (7.8 -> 4.2 ms for 500 jobs of 10 projects, 2.1 ms without
    # fair share).
    projects = fair_share.usage_by_project(shares)
    used = func.coalesce(projects.c.usage, 0)
    statement = (
        select(Job)
        .outerjoin(projects, projects.c.project == fair_share.project_key(Job))
        .where(
            *((site_fit.sites_within(Job.required_sites),) if sited else ()),
            _claimable(),
            or_(Job.requested_net.is_(None), Job.requested_net == bindparam("net")),
            # Read again after the net's lock, in a snapshot of its own: on PostgreSQL the
            # locking statement's snapshot may predate a drain that committed before that
            # lock was granted (its EXISTS then missed the row), and the drain, finding no
            # active job, said drained (tests/integration/test_drain_pg.py). So may it
            # predate another claim of the net, committed before the lock (a claim that
            # leaves the net row as it was, READY, updates no column the lock re-reads):
            # the net read free, this claim gave it a second job, which the unique index
            # refused, raising out of the assign round
            # (tests/integration/test_claim_snapshot_pg.py); a stray run likewise.
            ~drained(bindparam("net")),
            ~exists().where(
                _ON_NET.net_name == bindparam("net"), _ON_NET.state.in_(ACTIVE_JOB_STATES)
            ),
            ~exists().where(StrayRun.net_name == bindparam("net")),
            *below_cap(Job, func.coalesce(projects.c.held, 0), shares),
        )
        .order_by(*fair_share.order_key(Job, used, bindparam("aged_before")))
    )
    return statement


# A project's cap is re-checked under a lock of its own on PostgreSQL (keyed (this,
# hashtext(project)); another int4 pair than enqueue's rejection lock): two claims running
# at once each read the project below its cap in their own snapshot, and would both take a
# job of it.
_CAP_LOCK = 0x666C6370  # "flcp"


def _cap_holds(session: Session, shares: Shares, job: Job) -> bool:
    """Whether the job's project is still below its cap, read again once no other claim of
    the project is between its read and its commit (PostgreSQL: a transaction-scoped
    advisory lock per project, held to the commit). True at once for a project without a
    cap, and on SQLite, whose write lock from BEGIN serialises claims."""
    cap = shares.cap(job.project_id)
    if cap is None or session.get_bind().dialect.name != "postgresql":
        return True
    session.execute(select(func.pg_advisory_xact_lock(_CAP_LOCK, func.hashtext(job.project_id))))
    holding = session.scalar(
        select(func.count()).where(
            Job.project_id == job.project_id, Job.state.in_(ACTIVE_JOB_STATES)
        )
    )
    return (holding or 0) < cap


def queued_job_fits(session: Session, settings: Settings, net_name: str) -> bool:
    """A QUEUED job that could be claimed onto this net waits (one the claim may take now:
    claimable, its project below its cap; pinned to it or unpinned, and with sites the net
    has where it declares them). None can be onto a drained net, nor onto one holding a
    stray run (the claim passes it by): its server is left to its idle grace, as with no
    job waiting (read in the same statement: no statement more per idle check), so a stray
    its server never lets be stopped keeps no server up for ever. A job of a project at its
    cap keeps no server up either: it could not take it."""
    net = settings.net(net_name)
    fits = exists().where(
        takeable(settings.shares),
        or_(Job.requested_net.is_(None), Job.requested_net == net_name),
        ~drained(literal(net_name)),
        ~exists().where(StrayRun.net_name == net_name),
        *(() if net.sites is None else (site_fit.sites_within(Job.required_sites),)),
    )
    params = {} if net.sites is None else site_fit.net_sites_param(net.sites)
    return bool(session.scalar(select(fits), params))
