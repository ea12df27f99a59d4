"""Read model of the nets page (GET /nets): each net's last day from its history, and the
recent jobs with theirs.

Reads only. The history is read for the page only: a page shows PAGE_NETS nets, whose
moves in the window are found by net_events' (net_name, at) index and job_events' `at`
index (migration 0008), and the recent jobs by jobs' `state_changed_at` index and their
moves by `job_id`. The fleet costs one read of its current rows (nets' state and idle time,
stray runs, queued jobs by net), to order the nets and count them. So a year of history
costs what a day does.
"""

from __future__ import annotations

import statistics
import uuid
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from app.metrics.figures import cold_starts
from app.read_models import DrainView
from app.settings import Settings
from app.usecases.drains import drain_state
from app.usecases.prewarm import holds as prewarm_holds
from models import ACTIVE_JOB_STATES, Job, JobEvent, JobState, Net, NetEvent, NetState, StrayRun

WINDOW = timedelta(hours=24)
RECENT_JOBS = 30  # jobs shown with their history, most recently changed first
PAGE_NETS = 50  # nets a page: a page's cost follows it, not the fleet
ATTENTION_SHOWN = 100  # nets listed as needing attention (the count covers them all)
COLD_STARTS_SHOWN = 5

# What a timeline segment shows: the net's state, except that a BUSY net whose job is
# FINISHING (its run is over, its results are being uploaded) is told apart.
KIND_OF_STATE: dict[NetState, str] = {
    NetState.STOPPED: "down",
    NetState.STARTING: "starting",
    NetState.READY: "up",
    NetState.BUSY: "busy",
    NetState.STOPPING: "stopping",
    NetState.UNHEALTHY: "unhealthy",
    NetState.OUTAGE: "outage",
    NetState.MISCONFIGURED: "misconfigured",
}
FINISHING = "finishing"
UNKNOWN = "unknown"  # before the net's first recorded move
KINDS: tuple[str, ...] = ("up", "starting", "busy", FINISHING, "stopping", "down")
KINDS += ("unhealthy", "outage", "misconfigured", UNKNOWN)


@dataclass(frozen=True)
class Segment:
    kind: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class ActiveJob:
    id: uuid.UUID
    caller_key: str
    state: JobState
    since: datetime
    attempts: int
    max_attempts: int


@dataclass(frozen=True)
class DeclaredNet:
    """What the page needs of a net's settings, read once per process: pydantic's private
    attributes (`always_on`) cost microseconds a read, which a thousand nets a request add
    up."""

    name: str
    always_on: bool
    idle_timeout_s: float


def nets_as_declared(settings: Settings) -> list[DeclaredNet]:
    """Each declared net as the nets page shows it: its name, whether always-on, its grace."""
    return [DeclaredNet(n.name, n.always_on, n.idle_timeout_s) for n in settings.nets]


@dataclass(frozen=True)
class NetNow:
    """What every net shows on every page, from current rows only: its row, grace and strays
    (enough to order the nets and list those that need a human)."""

    name: str
    state: NetState | None  # None: no row yet (the worker creates it at start)
    since: datetime | None
    always_on: bool
    idle_timeout_s: float
    idle_left_s: float | None  # READY scale-to-zero net: grace left (negative: overdue)
    strays: int
    last_error: str | None
    hold: prewarm_holds.Hold | None = None  # the live prewarm hold on it, if any

    @property
    def needs_attention(self) -> bool:
        bad_state = self.state in (NetState.MISCONFIGURED, NetState.OUTAGE, NetState.UNHEALTHY)
        overdue = self.idle_left_s is not None and self.idle_left_s < 0
        return bad_state or self.strays > 0 or overdue


@dataclass(frozen=True)
class NetPanel:
    """One net of the page: its state now and its last day."""

    now: NetNow
    segments: list[Segment]
    active_job: ActiveJob | None
    queued_here: int  # QUEUED jobs pinned to this net
    cold_starts_s: list[float]  # completed in the window, oldest first

    @property
    def median_cold_start_s(self) -> float | None:
        return statistics.median(self.cold_starts_s) if self.cold_starts_s else None


@dataclass(frozen=True)
class Move:
    state: JobState
    at: datetime
    reason: str


@dataclass(frozen=True)
class JobHistory:
    id: uuid.UUID
    caller_key: str
    net: str | None
    state: JobState
    attempts: int
    max_attempts: int
    last_error: str | None
    moves: list[Move]


@dataclass(frozen=True)
class Overview:
    now: datetime
    since: datetime
    net_filter: str | None
    page: int
    pages: int
    offset: int  # of this page's first net among all
    total_nets: int
    nets: list[NetPanel]  # this page's
    attention: list[NetNow]  # nets that need a human, whatever the page (ATTENTION_SHOWN)
    attention_total: int
    nets_by_state: dict[str, int]
    queued: int
    queued_anywhere: int  # QUEUED jobs that take any net
    oldest_queued_at: datetime | None
    jobs: list[JobHistory]
    drain: DrainView | None = None  # what is drained (the page's banner)


def nets_overview(
    session: Session,
    declared: list[DeclaredNet],
    now: datetime,
    *,
    net: str | None = None,
    page: int = 1,
    page_size: int = PAGE_NETS,
    jobs_limit: int = RECENT_JOBS,
) -> Overview:
    """The declared nets, those that need a human first, `page_size` of them a page (or
    only `net`), each with its last day; and the recent jobs (of `net`)."""
    since = now - WINDOW
    everyone = _nets_now(session, declared, now)
    ordered = sorted(everyone, key=lambda n: (not n.needs_attention, n.name))
    pages = max(1, -(-len(ordered) // page_size))
    page = min(max(page, 1), pages)
    shown = (
        [n for n in ordered if n.name == net]
        if net is not None
        else ordered[(page - 1) * page_size : page * page_size]
    )
    attention = [n for n in ordered if n.needs_attention]
    detailed = _with_details(session, [*shown, *attention[:ATTENTION_SHOWN]])
    shown = [detailed[n.name] for n in shown]
    names = [n.name for n in shown]
    moves = _net_moves(session, since, names)
    finishing = _finishing_spans(session, since, now, names)
    # Active jobs are few (one a net at most): read them all by state and keep the page's,
    # rather than let the planner walk the page's nets' whole job history by net name.
    active = {
        j.net_name: ActiveJob(
            j.id, j.caller_key, j.state, j.state_changed_at, j.attempts, j.max_attempts
        )
        for j in session.execute(
            select(Job.net_name, Job.id, Job.caller_key, Job.state, Job.state_changed_at)
            .add_columns(Job.attempts, Job.max_attempts)
            .where(Job.state.in_(ACTIVE_JOB_STATES))
        )
        if j.net_name in names
    }
    queued_by_net: dict[str | None, int] = {
        requested: int(count)
        for requested, count in session.execute(
            select(Job.requested_net, func.count())
            .where(Job.state == JobState.QUEUED)
            .group_by(Job.requested_net)
        )
    }
    oldest = session.scalar(select(func.min(Job.created_at)).where(Job.state == JobState.QUEUED))
    panels = [
        NetPanel(
            now=one,
            segments=timeline(
                one.state,
                moves.get(one.name, []),
                finishing.get(one.name, []),
                since=since,
                now=now,
            ),
            active_job=active.get(one.name),
            queued_here=queued_by_net.get(one.name, 0),
            cold_starts_s=cold_starts(
                _Moved(one.name, f, t, at) for f, t, at in moves.get(one.name, [])
            ),
        )
        for one in shown
    ]
    by_state: dict[str, int] = defaultdict(int)
    for one in everyone:
        by_state[one.state.value if one.state else "NO ROW"] += 1
    return Overview(
        now=now,
        since=since,
        net_filter=net,
        page=page,
        pages=1 if net is not None else pages,
        offset=0 if net is not None else (page - 1) * page_size,
        total_nets=len(everyone),
        nets=panels,
        attention=[detailed[n.name] for n in attention[:ATTENTION_SHOWN]],
        attention_total=len(attention),
        nets_by_state=dict(by_state),
        queued=sum(queued_by_net.values()),
        queued_anywhere=queued_by_net.get(None, 0),
        oldest_queued_at=oldest,
        jobs=recent_jobs(session, jobs_limit, net),
        drain=drain_state(session, [d.name for d in declared], queued=sum(queued_by_net.values())),
    )


def _nets_now(session: Session, declared: list[DeclaredNet], now: datetime) -> list[NetNow]:
    """Every declared net from its row: state and idle time only, the least a thousand
    nets cost to order and sort out (`_with_details` adds the rest for those shown)."""
    rows: dict[str, tuple[NetState, datetime | None]] = {
        name: (state, idle_since)
        for name, state, idle_since in session.execute(select(Net.name, Net.state, Net.idle_since))
    }
    strays = dict(
        session.execute(select(StrayRun.net_name, func.count()).group_by(StrayRun.net_name)).all()
    )
    # A prewarm's hold defers the idle grace (app.usecases.prewarm.holds.idle_start).
    deferred = prewarm_holds.idle_starts(session)
    holds = prewarm_holds.live_holds(session, now)
    out = []
    for config in declared:
        state, idle_since = rows.get(config.name, (None, None))
        idle_left = None
        if state == NetState.READY and idle_since is not None and not config.always_on:
            idle_since = max(idle_since, deferred.get(config.name, idle_since))
            idle_left = config.idle_timeout_s - max(0.0, (now - idle_since).total_seconds())
        out.append(
            NetNow(
                name=config.name,
                state=state,
                since=None,
                always_on=config.always_on,
                idle_timeout_s=config.idle_timeout_s,
                idle_left_s=idle_left,
                strays=int(strays.get(config.name, 0)),
                last_error=None,
                hold=holds.get(config.name),
            )
        )
    return out


def _with_details(session: Session, nets: list[NetNow]) -> dict[str, NetNow]:
    """These nets with their row's `state_changed_at` and `last_error`, by name."""
    details = {
        name: (changed, error)
        for name, changed, error in session.execute(
            select(Net.name, Net.state_changed_at, Net.last_error).where(
                Net.name.in_([n.name for n in nets])
            )
        )
    }
    return {
        n.name: replace(n, since=details[n.name][0], last_error=details[n.name][1])
        if n.name in details
        else n
        for n in nets
    }


@dataclass
class _Moved:
    net_name: str
    from_state: NetState | None
    to_state: NetState
    at: datetime


def _net_moves(
    session: Session, since: datetime, names: list[str]
) -> dict[str, list[tuple[NetState | None, NetState, datetime]]]:
    """These nets' moves inside the window, oldest first (ix_net_events_net_name_at)."""
    moves: dict[str, list[tuple[NetState | None, NetState, datetime]]] = defaultdict(list)
    for name, from_state, to_state, at in session.execute(
        select(NetEvent.net_name, NetEvent.from_state, NetEvent.to_state, NetEvent.at)
        .where(NetEvent.net_name.in_(names), NetEvent.at >= since)
        .order_by(NetEvent.at, NetEvent.id)
    ):
        moves[name].append((from_state, to_state, at))
    return moves


def _finishing_spans(
    session: Session, since: datetime, now: datetime, names: list[str]
) -> dict[str, list[tuple[datetime, datetime]]]:
    """When each of these nets' job was FINISHING inside the window: from the window's moves
    into and out of FINISHING (few, found by ix_job_events_at), plus the jobs FINISHING now
    (one a net at most). Their nets are looked up by job id afterwards, so the planner is
    never tempted to start from the nets' whole job history."""
    into_or_out = or_(
        JobEvent.to_state == JobState.FINISHING, JobEvent.from_state == JobState.FINISHING
    )
    events = session.execute(
        select(JobEvent.job_id, JobEvent.to_state, JobEvent.at)
        .where(JobEvent.at >= since, into_or_out)
        .order_by(JobEvent.at, JobEvent.id)
    ).all()
    finishing_now = session.execute(
        select(Job.id, Job.net_name, Job.state_changed_at).where(Job.state == JobState.FINISHING)
    ).all()
    net_of: dict[uuid.UUID, str | None] = {job_id: net for job_id, net, _ in finishing_now}
    unknown = {job_id for job_id, _, _ in events} - net_of.keys()
    if unknown:
        for job_id, net in session.execute(
            select(Job.id, Job.net_name).where(Job.id.in_(sorted(unknown)))
        ):
            net_of[job_id] = net
    wanted = set(names)
    started: dict[uuid.UUID, datetime] = {}
    spans: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for job_id, to_state, at in events:
        name = net_of.get(job_id)
        if name not in wanted:
            continue
        if to_state == JobState.FINISHING:
            started[job_id] = at
        else:  # left FINISHING: since its entry, or since before the window
            spans[name].append((started.pop(job_id, since), at))
    for job_id, name, changed in finishing_now:
        if name in wanted:
            spans[name].append((started.pop(job_id, max(changed, since)), now))
    return spans


def timeline(
    state: NetState | None,
    moves: list[tuple[NetState | None, NetState, datetime]],
    finishing: list[tuple[datetime, datetime]],
    *,
    since: datetime,
    now: datetime,
) -> list[Segment]:
    """The window as segments of one kind each, from the net's moves inside it (oldest
    first) and its current state. Before the first move the net was in that move's
    `from_state` (unknown for a net's first recorded move); with no move, in `state`."""
    first = moves[0][0] if moves else state
    points: list[tuple[datetime, NetState | None]] = [(since, first)]
    points += [(at, to_state) for _from, to_state, at in moves]
    base: list[Segment] = []
    for (start, current), (end, _next) in zip(points, [*points[1:], (now, None)], strict=True):
        if end > start:
            kind = KIND_OF_STATE[current] if current is not None else UNKNOWN
            base.append(Segment(kind, start, end))
    return _merge(_overlay_finishing(base, finishing))


def _overlay_finishing(
    base: list[Segment], finishing: list[tuple[datetime, datetime]]
) -> list[Segment]:
    """Busy segments split where the net's job was FINISHING."""
    out: list[Segment] = []
    for seg in base:
        if seg.kind != "busy":
            out.append(seg)
            continue
        cursor = seg.start
        for start, end in sorted(finishing):
            lo, hi = max(start, seg.start), min(end, seg.end)
            if hi <= lo or hi <= cursor:
                continue
            lo = max(lo, cursor)
            if lo > cursor:
                out.append(Segment("busy", cursor, lo))
            out.append(Segment(FINISHING, lo, hi))
            cursor = hi
        if cursor < seg.end:
            out.append(Segment("busy", cursor, seg.end))
    return out


def _merge(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for seg in segments:
        if merged and merged[-1].kind == seg.kind and merged[-1].end == seg.start:
            merged[-1] = Segment(seg.kind, merged[-1].start, seg.end)
        else:
            merged.append(seg)
    return merged


def recent_jobs(session: Session, limit: int, net: str | None = None) -> list[JobHistory]:
    """The `limit` most recently changed jobs, each with its whole history, oldest move
    first. Of one net: the jobs it ran (ix_jobs_net_name_state_changed_at) and those queued
    for it (ix_jobs_queued_requested_net), each found by its own index rather than by
    walking every net's jobs."""
    columns = (
        Job.id,
        Job.caller_key,
        func.coalesce(Job.net_name, Job.requested_net),
        Job.state,
        Job.attempts,
        Job.max_attempts,
        Job.last_error,
        Job.state_changed_at,
    )
    newest = (Job.state_changed_at.desc(), Job.id)
    if net is None:
        jobs = session.execute(select(*columns).order_by(*newest).limit(limit)).all()
    else:
        ran = select(*columns).where(Job.net_name == net).order_by(*newest).limit(limit)
        waiting = select(*columns).where(Job.state == JobState.QUEUED, Job.requested_net == net)
        found = {row[0]: row for stmt in (ran, waiting) for row in session.execute(stmt)}
        jobs = sorted(found.values(), key=lambda r: (-r[-1].timestamp(), r[0]))[:limit]
    moves: dict[uuid.UUID, list[Move]] = defaultdict(list)
    if jobs:
        for job_id, to_state, at, reason in session.execute(
            select(JobEvent.job_id, JobEvent.to_state, JobEvent.at, JobEvent.reason)
            .where(JobEvent.job_id.in_([j[0] for j in jobs]))
            .order_by(JobEvent.at, JobEvent.id)
        ):
            moves[job_id].append(Move(to_state, at, reason))
    return [JobHistory(*job[:-1], moves=moves[job[0]]) for job in jobs]
