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
This package's front asks, cancels and reads prewarms; the holds (`idle_start`, `live_holds`,
settling a row) are in `prewarm.holds`, `warm_up` and `settle_prewarms` in `prewarm.warm_up`.

- The hold is honoured in one place, the idle scale-down (`idle_start`): a net's idle grace
  starts when it went idle or when its last hold ended, whichever is later; a live hold
  ends in the future, so its net is not idle at all. The deadline is a column, never a
  timer: nothing keeps a server up past min(T, PREWARM_MAX_S) + the net's idle grace (and
  one scale-down round), whatever message is lost or worker dies.
- `settle_prewarms` (every scale-down round) writes down how holds ended: `used` (a job was
  claimed onto the net while it held: the hold ends at that claim), `expired`, `failed`
  (its net went MISCONFIGURED); it starts again a net a live hold wants up that went down
  meanwhile, and re-sends a `warm_up` that was lost before it asked the driver.
- `cancel_prewarm` ends a hold now; the net's idle grace starts then. The task's cancel for
  a key no prewarm has yet is kept, and the prewarm that comes under it is ended at once,
  starting nothing (`prewarm.early_cancels`).

A refused prewarm (bad input, another payload under the same key, a MISCONFIGURED net, a
drained one: `holds.drained_error` says why a drained net's hint is refused, not held) starts
nothing and takes no key; it is recorded (`prewarm.refusals`), so a caller of the task can
look it up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import names
from app.db import unit_of_work
from app.errors import (
    CallerKeyConflict,
    InvalidRequest,
    NetMisconfigured,
    NotFound,
    RequestRejected,
    quoted,
    quoted_all,
)
from app.net_config import NetConfig
from app.read_models import Prewarmed, PrewarmView, iso
from app.runtime import Runtime
from app.schemas import PrewarmNet, recorded_caller_key, require_storable
from app.settings import Settings
from app.usecases import declared_nets, rows
from app.usecases.claims import drained
from app.usecases.prewarm import early_cancels
from app.usecases.prewarm.holds import (
    HELD,
    UP,
    WARMING,
    drained_error,
    end_hold,
    live_holds,
    misconfigured_error,
    settle_row,
    startable,
)
from app.usecases.prewarm.refusals import refusal_code as refusal_code  # re-exported
from app.usecases.prewarm.refusals import refuse_prewarm as refuse_prewarm  # re-exported
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

REFUSED = "refused"
STATUSES = (WARMING, HELD, "used", "expired", "cancelled", "failed", REFUSED)


@dataclass(frozen=True)
class Requested:
    """A prewarm request's answer: the prewarm, whether this call created it, and whether
    the warm-up was sent (None: nothing to send, the server was up or coming up)."""

    prewarm: PrewarmView
    created: bool
    notified: bool | None

    def answer(self) -> Prewarmed:
        """As POST /prewarms and the CLI's `prewarm --json` answer it."""
        return Prewarmed(**self.prewarm.model_dump(), created=self.created, notified=self.notified)


# --- asking ------------------------------------------------------------------------------


def request_prewarm(rt: Runtime, request: PrewarmNet) -> Requested:
    """Hold the net a job for `request` would run on ready until min(within_s,
    PREWARM_MAX_S) from now, starting its server if it is down; idempotent on caller_key.
    A refusal (InvalidRequest, CallerKeyConflict, NetMisconfigured) is recorded and raised."""
    now = rt.clock()
    try:
        with unit_of_work(rt.sessions) as session:
            declared_nets.ensure_net_rows(session, rt.settings, now)
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
                "hold_until": view.hold_until,
                "starting": start,
            },
        )
    notified = rt.outbox.send(names.WARM_UP, net_name=row.net_name) if start else None
    return Requested(view, created, notified)


def _accept(
    session: Session, settings: Settings, request: PrewarmNet, now: datetime
) -> tuple[Prewarm, bool, bool]:
    """The prewarm the key names (a repeat), or a new one; and whether to start its net. A
    new one a cancel came before (`early_cancels`) is ended at once and starts nothing."""
    existing = _accepted(session, request.caller_key)
    if existing is not None:
        row = _repeat(existing, request, settings)
        return row, False, _still_warming(session, row, now)
    early_cancels.lock(session, request.caller_key)  # before `take`: a cancel in flight
    net_name, sites = _resolve(session, settings, request, now)
    net, shut = _lock_net(session, net_name)
    if net.state == NetState.MISCONFIGURED:
        raise misconfigured_error(net)
    if shut:
        raise drained_error(net_name)
    granted_s = min(request.within_s, settings.prewarm_max_s)
    row = Prewarm(
        caller_key=request.caller_key,
        request_digest=_as_stored(request, settings).digest(),
        sent_digest=request.sent_digest(),
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
        return _repeat(winner, request, settings), False, False  # the winner sends it
    asked = early_cancels.take(session, request.caller_key, now)
    if asked is not None:
        note = f"cancelled before it came: a cancel for its key was handled at {iso(asked)}"
        end_hold(row, PrewarmOutcome.CANCELLED, now, note + "; its net was not started")
        return row, True, False
    start, note = _start_or_hold(session, settings.net(net_name), net, row, now)
    if granted_s < request.within_s:
        note += f"; held {granted_s:.0f}s (PREWARM_MAX_S), not the {request.within_s:.0f}s asked"
    row.detail = note
    return row, True, start


# The net locked as a claim locks it, and whether it is drained, in one statement (no
# statement more per prewarm). A drain that commits while this waits for the lock is not
# seen here: the hold it lets through is ended by the next scale-down round
# (prewarm_warm_up.settle_prewarms), before its net is started again for it.
_NET_LOCKED = (
    select(Net, drained(Net.name)).where(Net.name == bindparam("key")).with_for_update(of=Net)
)


def _lock_net(session: Session, net_name: str) -> tuple[Net, bool]:
    found = session.execute(_NET_LOCKED, {"key": net_name}).first()
    if found is None:
        raise NotFound(f"net {net_name} not found")  # (a declared net has its row: ensured)
    net, shut = found
    rows.note_locked(session, net, net_name)
    return net, bool(shut)


def _still_warming(session: Session, row: Prewarm, now: datetime) -> bool:
    """Whether a repeat sends the warm-up again: its hold is live and not ready yet on a
    STARTING net. The first request's send may never have gone out (a commit applied whose
    reply was lost: the task is retried); warm_up is idempotent, so a second one while the
    first polls only polls twice for a while."""
    if row.outcome is not None or row.ready_at is not None or row.hold_until <= now:
        return False
    return _net_state(session, row.net_name) == NetState.STARTING


def _start_or_hold(
    session: Session, config: NetConfig, net: Net, row: Prewarm, now: datetime
) -> tuple[bool, str]:
    """Start a STOPPED net (under its row lock) or only hold it; the history's words."""
    if net.state in UP:
        row.ready_at = now
    if config.always_on:
        return False, "always-on net: its server is never scaled"
    if net.state in UP:
        return False, "server up: held"
    if net.state == NetState.STARTING:
        return False, "server already starting"
    if net.state == NetState.STOPPED:
        if not startable(session, net.name):
            return False, "net holds a run to settle first: started once it is free"
        net.transition(
            NetState.STARTING,
            now,
            f"prewarm {row.caller_key}: a job is likely within {row.within_s:.0f}s",
        )
        return True, "server starting"
    return False, f"net is {net.state}: started again once it is down"


def _resolve(
    session: Session, settings: Settings, request: PrewarmNet, now: datetime
) -> tuple[str, list[str]]:
    """The net to hold and the sites the job needs, checked as an enqueue checks them."""
    sites = list(request.required_sites)
    if request.net is not None:
        if not settings.has_net(request.net):
            known = ", ".join(n.name for n in settings.nets) or "none"
            raise InvalidRequest(f"unknown net {quoted(request.net)} (known: {known})")
        config = settings.net(request.net)
        sites = sites or list(config.required_sites)
        lacking = config.lacks(sites)
        if lacking:
            assert config.sites is not None  # lacks() finds nothing otherwise
            raise InvalidRequest(
                f"required sites {quoted_all(lacking)} are not on net {config.name}: "
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
            f"no net has every site in {quoted_all(sites)}; "
            + "; ".join(f"{n.name} has {', '.join(n.sites or ())}" for n in settings.nets)
        )
    return _likely_net(session, [n.name for n in fitting], sites, now), sites


def _likely_net(session: Session, fitting: list[str], sites: list[str], now: datetime) -> str:
    """The net a job needing `sites` would be claimed on, as the assigner prefers them: a
    free READY net, then a STARTING one, then a STOPPED one (a net another live hold already
    keeps comes after those, as that hold's job will take it), then one whose job is still
    on it; never a MISCONFIGURED one. Ties by name."""
    states: dict[str, NetState] = {}
    shut: set[str] = set()
    for name, state, is_drained in session.execute(
        select(Net.name, Net.state, drained(Net.name)).where(Net.name.in_(fitting))
    ):
        states[name] = NetState(state)
        if is_drained:
            shut.add(name)
    usable = [n for n in fitting if states.get(n) not in (None, NetState.MISCONFIGURED)]
    if usable:
        shut &= set(usable)
        if len(shut) == len(usable):
            raise drained_error(usable[0], usable)
        usable = [n for n in usable if n not in shut]
    if not usable:
        raise NetMisconfigured(
            f"every net with the sites {quoted_all(sites)} is MISCONFIGURED "
            f"({', '.join(fitting)}); nothing "
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
    ended: it is not restarted); another payload under its key is refused. The same request
    as for an enqueue (`enqueue._repeat`): sent again as it was, or with a default spelled
    out or left out as today's settings fill it in."""
    as_sent = existing.sent_digest is not None and existing.sent_digest == request.sent_digest()
    if not as_sent and existing.request_digest != _as_stored(request, settings).digest():
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
            f"caller_key {quoted(request.caller_key)} already names a prewarm of net "
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


def _known(outcome: str | None) -> bool:
    return outcome in PrewarmOutcome._value2member_map_


def status_of(row: Prewarm, net_state: NetState | None, now: datetime) -> str:
    """warming / held while the hold is live; else how it ended (an unsettled row past its
    deadline has expired), or refused."""
    if row.refused:
        return REFUSED
    if row.outcome is not None:
        # An outcome of a newer release (written before a rollback; outcomes are added,
        # never renamed) reads as expired: the hold is over, and `detail` keeps its words.
        # As its own value it failed the view: a 500, and the caller's repeat failed too.
        return str(row.outcome) if _known(row.outcome) else PrewarmOutcome.EXPIRED.value
    if row.hold_until <= now:
        return PrewarmOutcome.EXPIRED.value
    return HELD if net_state in UP else WARMING


def prewarm_view(row: Prewarm, net_state: NetState | None, now: datetime) -> PrewarmView:
    """A prewarm as the task, the API and the CLI answer it."""
    status = status_of(row, net_state, now)
    ended = row.ended_at
    if ended is None and status == PrewarmOutcome.EXPIRED:
        ended = row.hold_until
    return PrewarmView(
        caller_key=row.caller_key,
        net=row.net_name,
        required_sites=list(row.required_sites),
        within_s=row.within_s,
        status=status,
        reason_code=row.outcome if row.refused and _known(row.outcome) else None,
        created_at=row.created_at.isoformat(),
        hold_until=row.hold_until.isoformat(),
        ready_at=iso(row.ready_at),
        ended_at=iso(ended),
        job_id=row.job_id,
        detail=row.detail,
    )


def get_prewarm(session: Session, caller_key: str, now: datetime) -> PrewarmView:
    """The prewarm a caller_key names; RequestRejected when only a refusal of it is kept,
    NotFound when there is neither."""
    require_storable(caller_key, "caller_key")
    row = _accepted(session, caller_key)
    if row is None:
        refused = session.scalar(
            select(Prewarm)
            .where(Prewarm.caller_key == recorded_caller_key(caller_key), Prewarm.refused)
            .order_by(Prewarm.id.desc())
            .limit(1)
        )
        if refused is not None:
            raise RequestRejected(
                f"prewarm {quoted(caller_key)}: refused at {iso(refused.created_at)}: "
                f"{refused.detail}",
                reason_code=str(refused.outcome),
            )
        raise NotFound(f"no prewarm with caller_key {quoted(caller_key)}")
    return prewarm_view(row, _net_state(session, row.net_name), now)


# --- cancelling -----------------------------------------------------------------------------


def cancel_prewarm(rt: Runtime, caller_key: str, *, keep: bool = False) -> PrewarmView:
    """End a live hold now (the net's idle grace starts now); a prewarm that has ended
    keeps its outcome. NotFound for an unknown key (with `keep`, the task's door: CancelKept,
    the cancel kept for a prewarm still to come, `early_cancels`), RequestRejected for a
    refused one."""
    require_storable(caller_key, "caller_key")
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        early_cancels.lock(session, caller_key)  # before the look: a prewarm in flight
        row = _accepted(session, caller_key, lock=True)
        if row is not None:
            if row.outcome is None:
                # Settled first: a hold a job has used, or one past its deadline, says so.
                settle_row(session, row, now)
            if row.outcome is None:
                end_hold(row, PrewarmOutcome.CANCELLED, now, "cancelled")
                log.info("prewarm cancelled", extra={"caller_key": caller_key, "net": row.net_name})
            return prewarm_view(row, _net_state(session, row.net_name), now)
        try:
            return get_prewarm(session, caller_key, now)  # raises: refused, or unknown
        except RequestRejected:
            raise
        except NotFound as exc:
            if not keep:
                raise
            missing = exc
            retention_s = rt.settings.rejected_retention_s
            until = early_cancels.keep(session, caller_key, now=now, retention_s=retention_s)
    raise early_cancels.CancelKept(missing, until)  # once committed
