"""Prewarm: flip-api's hint that a job for a net (or for some sites) is likely within T
seconds, so that the job meets a warm server instead of a cold start.

- `request_prewarm` (the Celery task, the HTTP route and the CLI alike) stores a hold on one
  net: a `prewarms` row whose `hold_until` is now + min(T, PREWARM_MAX_S). A net that is
  STOPPED is moved to STARTING under the row lock a job's claim takes, so a claim and a
  prewarm never both start it; `warm_up` is sent after the commit. It asks the driver for
  one replica through `scaling.scale_net`, the call a job's scale-up makes (drivers set a
  desired count: never a second replica), and marks the net READY once its server answers
  and the sites are connected, as a job's readiness check does. A net already up, or coming
  up, is only held.
- The hold is honoured in one place, the idle scale-down (`idle_start`): a net's idle grace
  starts when it went idle or when its last hold ended, whichever is later; a live hold
  ends in the future, so its net is not idle at all. The deadline is a column, never a
  timer: nothing keeps a server up past min(T, PREWARM_MAX_S) + the net's idle grace (and
  one scale-down round), whatever message is lost or worker dies.
- `settle_prewarms` (every scale-down round) writes down how holds ended: `used` (a job was
  claimed onto the net while it held: the hold ends at that claim), `expired`, `failed`
  (its net went MISCONFIGURED); it starts again a net a live hold wants up that went down
  meanwhile, and re-sends a `warm_up` that was lost before it asked the driver.
- `cancel_prewarm` ends a hold now; the net's idle grace starts then.

A refused prewarm (bad input, another payload under the same key, a MISCONFIGURED net)
starts nothing and takes no key; it is recorded, so a caller of the task can look it up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Select, and_, delete, exists, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import names
from app.adapters.nvflare.base import Readiness, ServerState
from app.db import unit_of_work
from app.errors import (
    CallerKeyConflict,
    DispatcherError,
    InvalidRequest,
    MisconfigurationError,
    NetMisconfigured,
    NotFound,
    RequestRejected,
    TransientError,
)
from app.net_config import NetConfig
from app.runtime import Runtime
from app.schemas import PrewarmNet, storable
from app.settings import Settings
from app.usecases import services
from app.usecases.scaling import kick, scale_net, stop_net
from models import (
    ACTIVE_JOB_STATES,
    Job,
    Net,
    NetState,
    Prewarm,
    PrewarmOutcome,
    StrayRun,
)

log = logging.getLogger(__name__)

# What a live prewarm's `status` says of its server: coming up, or up and held.
WARMING = "warming"
HELD = "held"
REFUSED = "refused"
STATUSES = (WARMING, HELD, "used", "expired", "cancelled", "failed", REFUSED)

_UP = (NetState.READY, NetState.BUSY)


class Warm(StrEnum):
    """What one `warm_up` round did."""

    READY = "ready"  # the net is READY now (or was made so by this round)
    NOT_READY = "not_ready"  # poll again
    SKIPPED = "skipped"  # nothing to warm: a job took the net, or it is not STARTING
    GAVE_UP = "gave_up"  # past the readiness deadline, or misconfigured: the holds failed


@dataclass(frozen=True)
class WarmResult:
    """A warm-up round's outcome, with why."""

    step: Warm
    detail: str = ""


@dataclass(frozen=True)
class Requested:
    """A prewarm request's answer: the prewarm, whether this call created it, and whether
    the warm-up was sent (None: nothing to send, the server was up or coming up)."""

    prewarm: dict[str, Any]
    created: bool
    notified: bool | None


# --- asking ------------------------------------------------------------------------------


def request_prewarm(rt: Runtime, request: PrewarmNet) -> Requested:
    """Hold the net a job for `request` would run on ready until min(within_s,
    PREWARM_MAX_S) from now, starting its server if it is down; idempotent on caller_key.
    A refusal (InvalidRequest, CallerKeyConflict, NetMisconfigured) is recorded and raised."""
    now = rt.clock()
    try:
        with unit_of_work(rt.sessions) as session:
            services.ensure_net_rows(session, rt.settings, now)
            row, created, start = _accept(session, rt.settings, request, now)
            view = prewarm_view(row, _net_state(session, row.net_name), now)
    except InvalidRequest as exc:
        refuse_prewarm(rt, request.caller_key, exc)
        raise
    if created:
        log.info(
            "prewarm accepted",
            extra={
                "caller_key": request.caller_key,
                "net": row.net_name,
                "hold_until": view["hold_until"],
                "starting": start,
            },
        )
    notified = rt.outbox.send(names.WARM_UP, net_name=row.net_name) if start else None
    return Requested(view, created, notified)


def refusal_code(exc: InvalidRequest) -> PrewarmOutcome:
    """The reason code of a refused prewarm."""
    if isinstance(exc, CallerKeyConflict):
        return PrewarmOutcome.CALLER_KEY_CONFLICT
    if isinstance(exc, NetMisconfigured):
        return PrewarmOutcome.NET_MISCONFIGURED
    return PrewarmOutcome.REJECTED


def refuse_prewarm(rt: Runtime, caller_key: str | None, exc: InvalidRequest) -> PrewarmOutcome:
    """Record a refused prewarm (one log line, and a row a lookup of its key finds for
    REJECTED_RETENTION_S); it starts nothing and takes no key. Returns its reason code."""
    code = refusal_code(exc)
    key = storable(caller_key)[:200] if caller_key is not None else ""
    reason = storable(str(exc))[:4000]
    log.warning("prewarm refused", extra={"caller_key": key, "reason": reason, "code": str(code)})
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        # Refusals are kept for REJECTED_RETENTION_S (once counted), as refused enqueues are.
        session.execute(
            delete(Prewarm).where(
                Prewarm.refused,
                Prewarm.counted,
                Prewarm.created_at < now - timedelta(seconds=rt.settings.rejected_retention_s),
            )
        )
        net = getattr(exc, "net_name", None)
        session.add(
            Prewarm(
                caller_key=key,
                net_name=net if rt.settings.has_net(net) else None,
                required_sites=[],
                created_at=now,
                hold_until=now,
                ended_at=now,
                outcome=code,
                refused=True,
                detail=reason,
            )
        )
    return code


def _accept(
    session: Session, settings: Settings, request: PrewarmNet, now: datetime
) -> tuple[Prewarm, bool, bool]:
    """The prewarm the key names (a repeat), or a new one; and whether to start its net."""
    existing = _accepted(session, request.caller_key)
    if existing is not None:
        return _repeat(existing, request, settings), False, False
    net_name, sites = _resolve(session, settings, request, now)
    net = services.get_net(session, net_name, lock=True)
    if net.state == NetState.MISCONFIGURED:
        raise _misconfigured(net)
    granted_s = min(request.within_s, settings.prewarm_max_s)
    row = Prewarm(
        caller_key=request.caller_key,
        request_digest=_as_stored(request, settings).digest(),
        net_name=net_name,
        required_sites=sites,
        within_s=request.within_s,
        created_at=now,
        hold_until=now + timedelta(seconds=granted_s),
        detail="",
    )
    try:
        # A savepoint, so losing a race on the key leaves the outer transaction usable.
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        winner = _accepted(session, request.caller_key)
        if winner is None:
            raise
        return _repeat(winner, request, settings), False, False
    start, note = _start_or_hold(session, settings.net(net_name), net, row, now)
    if granted_s < request.within_s:
        note += f"; held {granted_s:.0f}s (PREWARM_MAX_S), not the {request.within_s:.0f}s asked"
    row.detail = note
    return row, True, start


def _start_or_hold(
    session: Session, config: NetConfig, net: Net, row: Prewarm, now: datetime
) -> tuple[bool, str]:
    """Start a STOPPED net (under its row lock) or only hold it; the history's words."""
    if net.state in _UP:
        row.ready_at = now
    if config.always_on:
        return False, "always-on net: its server is never scaled"
    if net.state in _UP:
        return False, "server up: held"
    if net.state == NetState.STARTING:
        return False, "server already starting"
    if net.state == NetState.STOPPED:
        if not _startable(session, net.name):
            return False, "net holds a run to settle first: started once it is free"
        net.transition(
            NetState.STARTING,
            now,
            f"prewarm {row.caller_key}: a job is likely within {row.within_s:.0f}s",
        )
        return True, "server starting"
    return False, f"net is {net.state}: started again once it is down"


def _startable(session: Session, net_name: str) -> bool:
    """No job holds the net and no run is left on its server (what a claim asks too)."""
    busy = exists().where(Job.net_name == net_name, Job.state.in_(ACTIVE_JOB_STATES))
    stray = exists().where(StrayRun.net_name == net_name)
    return not session.scalar(select(busy | stray))


def _misconfigured(net: Net) -> NetMisconfigured:
    why = f": {net.last_error}" if net.last_error else ""
    return NetMisconfigured(
        f"net {net.name} is MISCONFIGURED{why}; nothing was started (an operator must fix "
        "its settings and restart the dispatcher first)",
        net_name=net.name,
    )


def _resolve(
    session: Session, settings: Settings, request: PrewarmNet, now: datetime
) -> tuple[str, list[str]]:
    """The net to hold and the sites the job needs, checked as an enqueue checks them."""
    sites = list(request.required_sites)
    if request.net is not None:
        if not settings.has_net(request.net):
            known = ", ".join(n.name for n in settings.nets) or "none"
            raise InvalidRequest(f"unknown net {request.net!r} (known: {known})")
        config = settings.net(request.net)
        sites = sites or list(config.required_sites)
        lacking = config.lacks(sites)
        if lacking:
            assert config.sites is not None  # lacks() finds nothing otherwise
            raise InvalidRequest(
                f"required sites {lacking} are not on net {config.name}: "
                f"{config.name} has {', '.join(config.sites)}"
            )
        return request.net, sites
    if not settings.nets:
        raise InvalidRequest("no nets are configured, so no job can run")
    if not sites:
        raise InvalidRequest("required_sites is empty and no net is given: name one of them")
    fitting = [n for n in settings.nets if not n.lacks(sites)]
    if not fitting:
        raise InvalidRequest(
            f"no net has every site in {sites}; "
            + "; ".join(f"{n.name} has {', '.join(n.sites or ())}" for n in settings.nets)
        )
    return _likely_net(session, [n.name for n in fitting], sites, now), sites


def _likely_net(session: Session, fitting: list[str], sites: list[str], now: datetime) -> str:
    """The net a job needing `sites` would be claimed on, as the assigner prefers them: a
    free READY net, then a STARTING one, then a STOPPED one (a net another live hold already
    keeps comes after those, as that hold's job will take it), then one whose job is still
    on it; never a MISCONFIGURED one. Ties by name."""
    states: dict[str, NetState] = {
        name: NetState(state)
        for name, state in session.execute(select(Net.name, Net.state).where(Net.name.in_(fitting)))
    }
    usable = [n for n in fitting if states.get(n) not in (None, NetState.MISCONFIGURED)]
    if not usable:
        raise NetMisconfigured(
            f"every net with the sites {sites} is MISCONFIGURED ({', '.join(fitting)}); nothing "
            "was started (an operator must fix their settings first)",
            net_name=fitting[0],
        )
    taken = set(
        session.scalars(
            select(Job.net_name).where(Job.net_name.in_(usable), Job.state.in_(ACTIVE_JOB_STATES))
        )
    ) | set(session.scalars(select(StrayRun.net_name).where(StrayRun.net_name.in_(usable))))
    held = set(live_holds(session, now))
    preference = {NetState.READY: 0, NetState.STARTING: 1, NetState.STOPPED: 2}

    def rank(name: str) -> tuple[bool, int, str]:
        order = 3 if name in taken else preference.get(states[name], 4)
        return name in held, order, name

    return min(usable, key=rank)


def _as_stored(request: PrewarmNet, settings: Settings) -> PrewarmNet:
    """The request with the net's default sites filled in, so spelling a default out is the
    same request as omitting it."""
    if request.required_sites or request.net is None or not settings.has_net(request.net):
        return request
    sites = list(settings.net(request.net).required_sites)
    return request.model_copy(update={"required_sites": sites})


def _repeat(existing: Prewarm, request: PrewarmNet, settings: Settings) -> Prewarm:
    """A repeat of a prewarm: the same request names the same prewarm (even one that has
    ended: it is not restarted); another payload under its key is refused."""
    if existing.request_digest != _as_stored(request, settings).digest():
        differ = [
            name
            for name, differs in (
                ("net", request.net is not None and request.net != existing.net_name),
                (
                    "required_sites",
                    bool(request.required_sites)
                    and sorted(request.required_sites) != sorted(existing.required_sites),
                ),
                ("within_s", request.within_s != existing.within_s),
            )
            if differs
        ]
        shown = f" (differs in: {', '.join(differ)})" if differ else ""
        raise CallerKeyConflict(
            f"caller_key {request.caller_key!r} already names a prewarm of net "
            f"{existing.net_name}, asked with a different payload{shown}; a new prewarm "
            "needs a new caller_key"
        )
    return existing


def _accepted(session: Session, caller_key: str, *, lock: bool = False) -> Prewarm | None:
    stmt = select(Prewarm).where(Prewarm.caller_key == caller_key, ~Prewarm.refused)
    if lock:
        stmt = stmt.with_for_update()
    return session.scalar(stmt)


def _net_state(session: Session, net_name: str | None) -> NetState | None:
    if net_name is None:
        return None
    state = session.scalar(select(Net.state).where(Net.name == net_name))
    return NetState(state) if state is not None else None


# --- reading ------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def status_of(row: Prewarm, net_state: NetState | None, now: datetime) -> str:
    """warming / held while the hold is live; else how it ended (an unsettled row past its
    deadline has expired), or refused."""
    if row.refused:
        return REFUSED
    if row.outcome is not None:
        return str(row.outcome)
    if row.hold_until <= now:
        return PrewarmOutcome.EXPIRED.value
    return HELD if net_state in _UP else WARMING


def prewarm_view(row: Prewarm, net_state: NetState | None, now: datetime) -> dict[str, Any]:
    """A prewarm as the task, the API and the CLI answer it."""
    status = status_of(row, net_state, now)
    ended = row.ended_at
    if ended is None and status == PrewarmOutcome.EXPIRED:
        ended = row.hold_until
    return {
        "caller_key": row.caller_key,
        "net": row.net_name,
        "required_sites": list(row.required_sites),
        "within_s": row.within_s,
        "status": status,
        "reason_code": row.outcome if row.refused else None,
        "created_at": _iso(row.created_at),
        "hold_until": _iso(row.hold_until),
        "ready_at": _iso(row.ready_at),
        "ended_at": _iso(ended),
        "job_id": str(row.job_id) if row.job_id is not None else None,
        "detail": row.detail,
    }


def get_prewarm(session: Session, caller_key: str, now: datetime) -> dict[str, Any]:
    """The prewarm a caller_key names; RequestRejected when only a refusal of it is kept,
    NotFound when there is neither."""
    row = _accepted(session, caller_key)
    if row is None:
        refused = session.scalar(
            select(Prewarm)
            .where(Prewarm.caller_key == caller_key, Prewarm.refused)
            .order_by(Prewarm.id.desc())
            .limit(1)
        )
        if refused is not None:
            raise RequestRejected(
                f"prewarm {caller_key!r}: refused at {_iso(refused.created_at)}: {refused.detail}",
                reason_code=str(refused.outcome),
            )
        raise NotFound(f"no prewarm with caller_key {caller_key!r}")
    return prewarm_view(row, _net_state(session, row.net_name), now)


@dataclass(frozen=True)
class Hold:
    """A live hold on a net: the one that ends last."""

    caller_key: str
    hold_until: datetime
    ready: bool

    def view(self) -> dict[str, Any]:
        """As /fl/status shows it."""
        return {
            "caller_key": self.caller_key,
            "hold_until": self.hold_until.isoformat(),
            "status": HELD if self.ready else WARMING,
        }


def live_holds(session: Session, now: datetime) -> dict[str, Hold]:
    """Each held net's live hold that ends last (open, before its deadline)."""
    holds: dict[str, Hold] = {}
    for net_name, key, until, ready_at, state in session.execute(
        select(
            Prewarm.net_name, Prewarm.caller_key, Prewarm.hold_until, Prewarm.ready_at, Net.state
        )
        .join(Net, Net.name == Prewarm.net_name)
        .where(Prewarm.outcome.is_(None), ~Prewarm.refused, Prewarm.hold_until > now)
    ):
        if net_name is None or (net_name in holds and holds[net_name].hold_until >= until):
            continue
        holds[net_name] = Hold(key, until, ready_at is not None or state in _UP)
    return holds


def _hold_end(hold_until: datetime, ended_at: datetime | None) -> datetime:
    return min(hold_until, ended_at) if ended_at is not None else hold_until


def idle_start(session: Session, net_name: str, idle_since: datetime) -> datetime:
    """When the net's idle grace starts: when it went idle, or when the last hold on it
    ended, whichever is later. A live hold ends in the future: the net is not idle yet.
    (This is where every hold is honoured: the idle scale-down asks it under the net's
    row lock.)"""
    ends = [
        _hold_end(until, ended)
        for until, ended in session.execute(
            select(Prewarm.hold_until, Prewarm.ended_at).where(
                Prewarm.net_name == net_name, Prewarm.hold_until > idle_since, ~Prewarm.refused
            )
        )
    ]
    return max([idle_since, *ends])


def idle_starts(session: Session) -> dict[str, datetime]:
    """`idle_start` of every READY net a hold defers (the others: their idle_since), in
    one read, for the metrics and the pages."""
    starts: dict[str, datetime] = {}
    for name, since, until, ended in session.execute(
        select(Net.name, Net.idle_since, Prewarm.hold_until, Prewarm.ended_at)
        .join(
            Prewarm,
            and_(
                Prewarm.net_name == Net.name,
                Prewarm.hold_until > Net.idle_since,
                ~Prewarm.refused,
            ),
        )
        .where(Net.state == NetState.READY)
    ):
        earlier = starts.get(name) or since or until
        starts[name] = max(earlier, _hold_end(until, ended))
    return starts


# --- cancelling -----------------------------------------------------------------------------


def cancel_prewarm(rt: Runtime, caller_key: str) -> dict[str, Any]:
    """End a live hold now (the net's idle grace starts now); a prewarm that has ended
    keeps its outcome. NotFound for an unknown key, RequestRejected for a refused one."""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        row = _accepted(session, caller_key, lock=True)
        if row is None:
            return get_prewarm(session, caller_key, now)  # raises: refused, or unknown
        if row.outcome is None:
            # Settled first: a hold a job has used, or one past its deadline, says so.
            _settle_row(session, row, now)
        if row.outcome is None:
            _end(row, PrewarmOutcome.CANCELLED, now, "cancelled")
            log.info("prewarm cancelled", extra={"caller_key": caller_key, "net": row.net_name})
        return prewarm_view(row, _net_state(session, row.net_name), now)


# --- warming up -----------------------------------------------------------------------------


def warm_up(rt: Runtime, net_name: str) -> WarmResult:
    """Bring a prewarmed net's server up: one replica asked of the driver (only while it
    desires none), then READY once the server answers and the holds' sites are connected.
    A net a job has been claimed onto is left to that job's chain. Past the net's
    ready_timeout_s a server that answers is READY all the same (a site may come later);
    one that does not is UNHEALTHY and scaled down, and its holds fail."""
    if not rt.settings.has_net(net_name):
        return WarmResult(Warm.SKIPPED, f"net {net_name} is no longer declared (NETS)")
    config = rt.settings.net(net_name)
    now = rt.clock()
    with rt.sessions() as session:
        net = services.get_net(session, net_name)
        state, since = net.state, net.state_changed_at
        job = services.active_job(session, net_name)
        live = _wanted_hold(session, net_name, now) is not None
        sites = _wanted_sites(session, net_name, now) or list(config.required_sites)
    if config.always_on or state != NetState.STARTING:
        return WarmResult(Warm.SKIPPED, f"net is {state}: nothing to warm up")
    if job is not None:
        return WarmResult(Warm.SKIPPED, f"job {job.id} took the net: its chain brings it up")
    polled = _poll(rt, net_name, sites, live)
    if isinstance(polled, WarmResult):
        return polled
    readiness, detail = polled
    if readiness is not None and readiness.ready:
        _mark_ready(rt, net_name, readiness, "ready for its prewarm")
        return WarmResult(Warm.READY, "ready")
    if (now - since).total_seconds() > config.ready_timeout_s:
        if readiness is not None and readiness.server_state == ServerState.STARTED:
            # The server answers; only sites are missing: up all the same, as a job's
            # missing sites leave its net READY.
            reason = f"up; sites {list(readiness.missing_sites)} not connected yet"
            _mark_ready(rt, net_name, readiness, reason)
            return WarmResult(Warm.READY, reason)
        return _give_up(rt, net_name, f"not ready after {config.ready_timeout_s:.0f}s: {detail}")
    return WarmResult(Warm.NOT_READY, detail)


def _poll(
    rt: Runtime, net_name: str, sites: list[str], live: bool
) -> WarmResult | tuple[Readiness | None, str]:
    """One look at a STARTING net: a replica asked of the driver while a hold is live and it
    desires none (a warm-up whose holds all ended stops pushing: the net is released), else
    the server's readiness; a round's outcome, or the readiness and why it is not ready."""
    readiness: Readiness | None = None
    try:
        observation = rt.driver(net_name).observe()
        if observation.failure:
            return _give_up(rt, net_name, f"driver: {observation.failure}")
        if observation.desired < 1:
            if not live:
                return _release(rt, net_name, "prewarm: its holds ended before a replica was asked")
            scale_net(rt, net_name, 1, "prewarm: a job is likely soon")
            detail = "driver asked for 1 replica"
        elif not observation.is_up:
            detail = f"driver: desired={observation.desired} running={observation.running}"
        else:
            readiness = rt.admin(net_name).is_ready(sites)
            detail = readiness.detail or f"missing sites {list(readiness.missing_sites)}"
    except MisconfigurationError as exc:
        return _misconfigured_while_warming(rt, net_name, str(exc))
    except TransientError as exc:
        detail = f"transient: {exc}"
    return readiness, detail


def _wanted_sites(session: Session, net_name: str, now: datetime) -> list[str]:
    """Every site the net's live holds wait for."""
    wanted: set[str] = set()
    for sites in session.scalars(
        select(Prewarm.required_sites).where(
            Prewarm.net_name == net_name,
            Prewarm.outcome.is_(None),
            ~Prewarm.refused,
            Prewarm.hold_until > now,
        )
    ):
        wanted.update(sites)
    return sorted(wanted)


def _mark_ready(rt: Runtime, net_name: str, readiness: Readiness, reason: str) -> bool:
    """STARTING -> READY (idle from now) unless a job took the net meanwhile."""
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        if net.state != NetState.STARTING or services.active_job(session, net_name) is not None:
            return False
        now = rt.clock()
        idle_since = _idle_from(session, net_name, net.state_changed_at, now)
        net.transition(NetState.READY, now, reason)
        # Idle from now while a hold is live; from the last hold's end once they all ended
        # (expired, cancelled): a late boot never buys a fresh grace past hold end + grace.
        net.idle_since = idle_since
        if readiness.server_start_time is not None:
            net.server_start_time = readiness.server_start_time
        net.unreachable_since = None
        for row in _live_rows(session, net_name, now):
            if row.ready_at is None:
                row.ready_at = now
    log.info("prewarmed net ready", extra={"net": net_name, "reason": reason})
    return True


def _give_up(rt: Runtime, net_name: str, reason: str) -> WarmResult:
    """The server never came: UNHEALTHY and scaled down (as after a job's readiness
    deadline), its holds failed."""
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        if net.state != NetState.STARTING or services.active_job(session, net_name) is not None:
            return WarmResult(Warm.SKIPPED, "a job took the net meanwhile")
        now = rt.clock()
        net.transition(NetState.UNHEALTHY, now, reason)
        net.last_error = reason
        for row in _live_rows(session, net_name, now):
            _end(row, PrewarmOutcome.FAILED, now, reason)
    log.error("prewarmed net not ready", extra={"net": net_name, "reason": reason})
    try:
        scale_net(rt, net_name, 0, "prewarm: readiness deadline passed")
    except DispatcherError as exc:
        log.error(
            "scale-down after a failed prewarm failed; reconcile retries",
            extra={"net": net_name, "reason": str(exc)},
        )
    return WarmResult(Warm.GAVE_UP, reason)


def _live_rows(session: Session, net_name: str, now: datetime) -> list[Prewarm]:
    """The net's open holds, locked, each settled first: one a job used or one past its
    deadline keeps that outcome (a late give-up never rewrites it); the live ones are left."""
    rows = session.scalars(
        select(Prewarm)
        .where(Prewarm.net_name == net_name, Prewarm.outcome.is_(None), ~Prewarm.refused)
        .order_by(Prewarm.id)
        .with_for_update()
    )
    live = []
    for row in rows:
        _settle_row(session, row, now)
        if row.outcome is None and row.hold_until > now:
            live.append(row)
    return live


def _idle_from(session: Session, net_name: str, started: datetime, now: datetime) -> datetime:
    """Where a prewarmed net's idle clock starts once it is up: now while a hold on it is
    live, else the end of the last hold that wanted this start (hold end + grace bounds the
    server); now if no hold did."""
    ends = [
        _hold_end(until, ended)
        for until, ended in session.execute(
            select(Prewarm.hold_until, Prewarm.ended_at).where(
                Prewarm.net_name == net_name, Prewarm.hold_until > started, ~Prewarm.refused
            )
        )
    ]
    return min(now, max(ends)) if ends else now


def _release(rt: Runtime, net_name: str, reason: str) -> WarmResult:
    """Its holds ended: the STARTING net goes down (STOPPING -> driver 0 -> STOPPED, as an
    idle net does) unless a job took it meanwhile."""
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        if net.state != NetState.STARTING or services.active_job(session, net_name) is not None:
            return WarmResult(Warm.SKIPPED, "a job took the net meanwhile")
        net.transition(NetState.STOPPING, rt.clock(), reason)
    log.info("prewarmed net released", extra={"net": net_name, "reason": reason})
    stop_net(rt, net_name, reason)
    return WarmResult(Warm.SKIPPED, reason)


def _misconfigured_while_warming(rt: Runtime, net_name: str, reason: str) -> WarmResult:
    """MISCONFIGURED and scaled down, its live holds failed; re-checked under the row lock a
    claim takes, so a job claimed meanwhile is left to its own chain (which requeues it)."""
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        if net.state != NetState.STARTING or services.active_job(session, net_name) is not None:
            return WarmResult(Warm.SKIPPED, "a job took the net meanwhile: its chain sees to it")
        now = rt.clock()
        for row in _live_rows(session, net_name, now):
            _end(row, PrewarmOutcome.FAILED, now, f"net {net_name} misconfigured: {reason}")
        net.transition(NetState.MISCONFIGURED, now, reason)
        net.last_error = reason
    log.error("net misconfigured", extra={"net": net_name, "job": "None", "reason": reason})
    if rt.settings.net(net_name).scales_to_zero:
        try:
            scale_net(rt, net_name, 0, "net misconfigured")
        except DispatcherError as exc:
            # Reconcile retries the scale-down of a MISCONFIGURED net that still runs.
            log.error(
                "scale-down of a misconfigured net failed",
                extra={"net": net_name, "reason": str(exc)},
            )
    kick(rt)
    return WarmResult(Warm.GAVE_UP, reason)


def _end(row: Prewarm, outcome: PrewarmOutcome, at: datetime, detail: str) -> None:
    row.outcome = outcome
    row.ended_at = min(at, row.hold_until)
    row.detail = detail[:2000]


# --- housekeeping -------------------------------------------------------------------------


def settle_prewarms(rt: Runtime) -> list[str]:
    """Write down how open holds ended (used, expired, failed), start again a net a live
    hold wants up that went down, and re-send a warm-up lost before it asked the driver.
    Never raises: a failure is logged and the idle scale-down that calls it goes on (it
    reads the deadlines itself)."""
    notes: list[str] = []
    try:
        now = rt.clock()
        with rt.sessions() as session:
            # The common case, no open hold at all, costs this one read.
            if session.scalar(select(_open_hold().exists())) is not True:
                return notes
        with unit_of_work(rt.sessions) as session:
            rows = list(
                session.scalars(
                    select(Prewarm)
                    .where(Prewarm.outcome.is_(None), ~Prewarm.refused)
                    .order_by(Prewarm.id)
                    .with_for_update()
                )
            )
            for row in rows:
                note = _settle_row(session, row, now)
                if note:
                    notes.append(f"prewarm {row.caller_key}: {note}")
            wanted = sorted({r.net_name for r in rows if r.outcome is None and r.net_name})
    except Exception:
        log.exception("settling prewarms failed")
        return notes
    for net_name in wanted:
        try:
            note = _keep_warming(rt, net_name)
        except Exception:
            log.exception("keeping a prewarmed net up failed", extra={"net": net_name})
            continue
        if note:
            notes.append(f"net {net_name}: {note}")
    return notes


def _open_hold() -> Select[Any]:
    return select(Prewarm.id).where(Prewarm.outcome.is_(None), ~Prewarm.refused)


def _settle_row(session: Session, row: Prewarm, now: datetime) -> str:
    """Settle one open hold if it has ended: a job claimed onto its net while it held (used,
    ending at that claim), its deadline past (expired), its net MISCONFIGURED (failed)."""
    if row.net_name is None:
        return ""  # (an accepted prewarm always names its net)
    used = session.execute(
        select(Job.id, Job.assigned_at)
        .where(
            Job.net_name == row.net_name,
            Job.assigned_at >= row.created_at,
            Job.assigned_at <= min(now, row.hold_until),
        )
        .order_by(Job.assigned_at)
        .limit(1)
    ).first()
    if used is not None:
        job_id, assigned_at = used
        assert assigned_at is not None  # the query asked for a time
        _end(row, PrewarmOutcome.USED, assigned_at, f"job {job_id} was claimed onto the net")
        row.job_id = job_id
        return "used"
    if row.hold_until <= now:
        _end(row, PrewarmOutcome.EXPIRED, row.hold_until, "no job came within its time")
        return "expired"
    net = session.get(Net, row.net_name)
    if net is not None and net.state == NetState.MISCONFIGURED:
        _end(row, PrewarmOutcome.FAILED, now, str(_misconfigured(net)))
        return "failed: net misconfigured"
    return ""


def _keep_warming(rt: Runtime, net_name: str) -> str:
    """A live hold wants its net's server up: a STOPPED net is started again (its server
    went away meanwhile: stopped before the hold came, found gone, taken down); a STARTING
    net whose driver was never asked for a replica (the warm-up's message was lost) gets its
    warm-up again."""
    if not rt.settings.has_net(net_name) or rt.settings.net(net_name).always_on:
        return ""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        net = services.get_net(session, net_name, lock=True)
        live = bool(_wanted_hold(session, net_name, now))
        if not live:
            return ""
        if net.state == NetState.STOPPED:
            if not _startable(session, net_name):
                return ""
            net.transition(NetState.STARTING, now, "prewarm: its hold wants the server up")
            start = True
        elif net.state == NetState.STARTING and services.active_job(session, net_name) is None:
            age_s = (now - net.state_changed_at).total_seconds()
            start = False
            if age_s <= rt.settings.stuck_after_s:
                return ""
        else:
            return ""
    if not start and rt.driver(net_name).observe().desired > 0:
        return ""  # its warm-up asked the driver: reconcile and the warm-up see it through
    rt.outbox.send(names.WARM_UP, net_name=net_name)
    return "started again for its hold" if start else "warm-up re-sent"


def _wanted_hold(session: Session, net_name: str, now: datetime) -> str | None:
    return session.scalar(
        select(Prewarm.caller_key)
        .where(
            Prewarm.net_name == net_name,
            Prewarm.outcome.is_(None),
            ~Prewarm.refused,
            Prewarm.hold_until > now,
        )
        .limit(1)
    )
