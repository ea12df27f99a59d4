"""Prewarm warm-up and settling (tasks/README.md "Prewarm"): `warm_up` brings a prewarmed net's
server up and marks it READY (idle from the last hold's end once every hold ended, so a
late boot never outlives hold end + grace); `settle_prewarms` (every scale-down round)
writes down how holds ended and starts again a net a live hold wants up."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from app import names
from app.adapters.backend import Readiness, ServerState
from app.db import unit_of_work
from app.errors import MisconfigurationError, TransientError
from app.runtime import Runtime
from app.usecases import records
from app.usecases.claims import drained
from app.usecases.outages import ask_unrecorded, start_clock
from app.usecases.prewarm.holds import (
    end_hold,
    idle_from_holds,
    settle_row,
    startable,
    wanted_hold,
    wanted_sites,
)
from app.usecases.scaling import kick, scale_down_or_log, scale_net, stop_net
from models import NetState, Prewarm, PrewarmOutcome, ScaleEvent

log = logging.getLogger(__name__)


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


# --- warming up -----------------------------------------------------------------------------


def warm_up(rt: Runtime, net_name: str) -> WarmResult:
    """Bring a prewarmed net's server up: one replica asked of the driver (only while it
    desires none), then READY once the server answers and the holds' sites are connected.
    A net a job has been claimed onto is left to that job's chain. Past the net's
    ready_timeout_s (from the first ask for the replica, `outages.start_age_s`) a server
    that answers is READY all the same (a site may come later); one that does not is
    UNHEALTHY and scaled down, and its holds fail. A net found READY
    already (another readiness check, whose sites may differ, moved it first) is polled on
    until its holds' sites are connected, so `ready_at` says when they were."""
    if not rt.settings.has_net(net_name):
        return WarmResult(Warm.SKIPPED, f"net {net_name} is no longer declared (NETS)")
    config = rt.settings.net(net_name)
    now = rt.clock()
    with rt.sessions() as session:
        net = records.get_net(session, net_name)
        state, since = net.state, net.state_changed_at
        job = records.active_job(session, net_name)
        live = wanted_hold(session, net_name, now) is not None
        sites = wanted_sites(session, net_name, now) or list(config.required_sites)
        awaited = _awaited_since(session, net_name, now)
    if job is not None:
        return WarmResult(Warm.SKIPPED, f"job {job.id} took the net: its chain brings it up")
    if state == NetState.READY and awaited is not None:
        return _await_sites(rt, net_name, sites, awaited, since)
    if config.always_on or state != NetState.STARTING:
        return WarmResult(Warm.SKIPPED, f"net is {state}: nothing to warm up")
    polled = _poll(rt, net_name, sites, live, since)
    if isinstance(polled, WarmResult):
        return polled
    readiness, detail, desired = polled
    if readiness is not None and readiness.ready:
        if mark_ready(rt, net_name, readiness, "ready for its prewarm", since) is None:
            return STARTED_AGAIN
        return WarmResult(Warm.READY, "ready")
    # From the first ask for the replica (this call's, if it ran late), not from STARTING: a
    # warm-up whose message waited past the deadline does not give up the boot it just asked.
    clock = start_clock(rt, net_name, since)
    if clock.age_s > config.ready_timeout_s:
        if readiness is not None and readiness.server_state == ServerState.STARTED:
            # The server answers; only sites are missing: up all the same, as a job's
            # missing sites leave its net READY.
            reason = f"up; sites {list(readiness.missing_sites)} not connected yet"
            if mark_ready(rt, net_name, readiness, reason, since) is None:
                return STARTED_AGAIN
            return WarmResult(Warm.READY, reason)
        if clock.unasked and desired and live:
            return _ask_unrecorded(rt, net_name)
        # Named for the prewarm: the net's history tells it from a job's chain giving up.
        reason = f"prewarm: not ready after {config.ready_timeout_s:.0f}s: {detail}"
        return _give_up(rt, net_name, reason, since)
    return WarmResult(Warm.NOT_READY, detail)


# A check that stalled across a stop and a new start of its net leaves that start alone.
STARTED_AGAIN = WarmResult(Warm.SKIPPED, "the net was started again since it was read")


def _poll(
    rt: Runtime, net_name: str, sites: list[str], live: bool, starting_since: datetime
) -> WarmResult | tuple[Readiness | None, str, bool]:
    """One look at a STARTING net: a replica asked of the driver while a hold is live and it
    desires none (a warm-up whose holds all ended stops pushing: the net is released), else
    the server's readiness; a round's outcome, or the readiness, why it is not ready and
    whether the driver desired the replica before this call (another ask's). A failure the
    driver reports fails this start only once the driver took a start for it: before that
    it is how an earlier server ended (a container that crashed long ago)."""
    readiness: Readiness | None = None
    desired = False
    try:
        observation = rt.driver(net_name).observe()
        if observation.failure and _start_asked(rt, net_name, starting_since):
            return _give_up(rt, net_name, f"driver: {observation.failure}", starting_since)
        if observation.desired < 1:
            # `live` as read before the driver call, which may have stalled across the end
            # of the holds and of this start: no replica asked for a start nothing wants.
            if not live or not _still_wanted(rt, net_name, starting_since):
                reason = "prewarm: its holds ended before a replica was asked"
                return _release(rt, net_name, reason, starting_since)
            scale_net(rt, net_name, 1, "prewarm: a job is likely soon")
            detail = "driver asked for 1 replica"
        elif not observation.is_up:
            desired = True
            detail = f"driver: desired={observation.desired} running={observation.running}"
        else:
            desired = True
            readiness = rt.admin(net_name).is_ready(sites)
            detail = readiness.detail or f"missing sites {list(readiness.missing_sites)}"
    except MisconfigurationError as exc:
        return _misconfigured_while_warming(rt, net_name, str(exc))
    except TransientError as exc:
        detail = f"transient: {exc}"
    return readiness, detail, desired


def _still_wanted(rt: Runtime, net_name: str, since: datetime) -> bool:
    """The net is still in the start read (STARTING from `since`) and a live hold wants it."""
    with rt.sessions() as session:
        net = records.get_net(session, net_name)
        return (
            net.state == NetState.STARTING
            and net.state_changed_at == since
            and wanted_hold(session, net_name, rt.clock()) is not None
        )


def _ask_unrecorded(rt: Runtime, net_name: str) -> WarmResult:
    """Past the deadline counted from STARTING, the driver desires the replica and no ask is
    recorded (`outages.ask_unrecorded`): asked again, polled on from that ask."""
    try:
        ask_unrecorded(rt, net_name, "prewarm")
    except MisconfigurationError as exc:
        return _misconfigured_while_warming(rt, net_name, str(exc))
    except TransientError as exc:
        # Recorded all the same (scale_net): the next round counts from this try.
        return WarmResult(Warm.NOT_READY, f"transient: {exc}")
    return WarmResult(Warm.NOT_READY, "driver asked again for 1 replica (no ask was recorded)")


def _start_asked(rt: Runtime, net_name: str, since: datetime) -> bool:
    """The driver took a request for a replica of the net at or after `since`."""
    with rt.sessions() as session:
        return (
            session.scalar(
                select(ScaleEvent.id)
                .where(
                    ScaleEvent.net_name == net_name,
                    ScaleEvent.replicas == 1,
                    ScaleEvent.outcome == "ok",
                    ScaleEvent.at >= since,
                )
                .limit(1)
            )
            is not None
        )


def _await_sites(
    rt: Runtime, net_name: str, sites: list[str], since: datetime, ready_since: datetime
) -> WarmResult:
    """A READY net (READY from `ready_since`) whose live holds wait for their sites: note when
    they are connected (past the net's ready_timeout_s from the first such hold, `since`,
    stop asking: the net is up)."""
    try:
        readiness = rt.admin(net_name).is_ready(sites)
    except MisconfigurationError as exc:
        return _misconfigured_while_warming(rt, net_name, str(exc), NetState.READY)
    except TransientError as exc:
        readiness = Readiness(False, ServerState.UNREACHABLE, detail=f"transient: {exc}")
    if readiness.ready:
        if mark_ready(rt, net_name, readiness, "ready for its prewarm", ready_since) is None:
            return STARTED_AGAIN
        return WarmResult(Warm.READY, "ready")
    detail = readiness.detail or f"missing sites {list(readiness.missing_sites)}"
    if (rt.clock() - since).total_seconds() > rt.settings.net(net_name).ready_timeout_s:
        return WarmResult(Warm.SKIPPED, f"up, not every site connected: {detail}")
    return WarmResult(Warm.NOT_READY, detail)


def _awaited_since(session: Session, net_name: str, now: datetime) -> datetime | None:
    """When the first live hold on the net not yet seen ready was made (None: none)."""
    return session.scalar(
        select(func.min(Prewarm.created_at)).where(
            Prewarm.net_name == net_name,
            Prewarm.outcome.is_(None),
            ~Prewarm.refused,
            Prewarm.hold_until > now,
            Prewarm.ready_at.is_(None),
        )
    )


def mark_ready(
    rt: Runtime, net_name: str, readiness: Readiness, reason: str, since: datetime
) -> bool | None:
    """The holds' server is ready: noted on them (also when another check moved the net
    READY first), and the net STARTING -> READY unless a job took it meanwhile (True:
    moved). `since`: the net's state change the readiness was read under; a net STARTING
    from another (the check stalled across a stop and a new start) is not this server's:
    left to its own start, nothing noted (None)."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        now = rt.clock()
        if net.state == NetState.STARTING and net.state_changed_at != since:
            return None
        if net.state != NetState.STARTING or records.active_job(session, net_name) is not None:
            _note_ready(session, net_name, now)
            return False
        idle_since = idle_from_holds(session, net_name, net.state_changed_at, now)
        net.transition(NetState.READY, now, reason)
        # Idle from now while a hold is live; from the last hold's end once they all ended
        # (expired, cancelled): a late boot never buys a fresh grace past hold end + grace.
        net.idle_since = idle_since
        if readiness.server_start_time is not None:
            net.server_start_time = readiness.server_start_time
        net.answered()
        _note_ready(session, net_name, now)
    log.info("prewarmed net ready", extra={"net": net_name, "reason": reason})
    return True


def _note_ready(session: Session, net_name: str, now: datetime) -> None:
    for row in _live_rows(session, net_name, now):
        if row.ready_at is None:
            row.ready_at = now


def _give_up(rt: Runtime, net_name: str, reason: str, since: datetime) -> WarmResult:
    """The server of the start from `since` never came: UNHEALTHY and scaled down (as after
    a job's readiness deadline), its holds failed."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        if net.state != NetState.STARTING or records.active_job(session, net_name) is not None:
            return WarmResult(Warm.SKIPPED, "a job took the net meanwhile")
        if net.state_changed_at != since:
            # The net was started again since this round read it (it stalled, seed 5853):
            # the deadline it counted is the old start's, not this one's.
            return STARTED_AGAIN
        now = rt.clock()
        net.transition(NetState.UNHEALTHY, now, reason)
        net.last_error = reason
        for row in _live_rows(session, net_name, now):
            end_hold(row, PrewarmOutcome.FAILED, now, reason)
    log.error("prewarmed net not ready", extra={"net": net_name, "reason": reason})
    scale_down_or_log(rt, net_name, "prewarm: readiness deadline passed")
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
        settle_row(session, row, now)
        if row.outcome is None and row.hold_until > now:
            live.append(row)
    return live


def _release(rt: Runtime, net_name: str, reason: str, since: datetime) -> WarmResult:
    """Its holds ended: the STARTING net (STARTING from `since`) goes down (STOPPING ->
    driver 0 -> STOPPED, as an idle net does) unless a job took it meanwhile, it was started
    again since, or a hold granted since wants it: re-read under the row lock."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        if net.state != NetState.STARTING or records.active_job(session, net_name) is not None:
            return WarmResult(Warm.SKIPPED, "a job took the net meanwhile")
        if net.state_changed_at != since:
            return WarmResult(Warm.SKIPPED, "started again since: kept for its own warm-up")
        if wanted_hold(session, net_name, rt.clock()):
            # A hold granted since on this very start (its grant sent no warm-up of its own:
            # this one was under way): warmed on, never left STARTING with no ask.
            return WarmResult(Warm.NOT_READY, "a hold granted since wants the start: warming on")
        net.transition(NetState.STOPPING, rt.clock(), reason)
    log.info("prewarmed net released", extra={"net": net_name, "reason": reason})
    stop_net(rt, net_name, reason)
    return WarmResult(Warm.SKIPPED, reason)


def _misconfigured_while_warming(
    rt: Runtime, net_name: str, reason: str, seen: NetState = NetState.STARTING
) -> WarmResult:
    """MISCONFIGURED and scaled down, its live holds failed; re-checked under the row lock a
    claim takes (still in the state `seen`), so a job claimed meanwhile is left to its own
    chain (which requeues it)."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        if net.state != seen or records.active_job(session, net_name) is not None:
            return WarmResult(Warm.SKIPPED, "a job took the net meanwhile: its chain sees to it")
        now = rt.clock()
        for row in _live_rows(session, net_name, now):
            end_hold(row, PrewarmOutcome.FAILED, now, f"net {net_name} misconfigured: {reason}")
        net.transition(NetState.MISCONFIGURED, now, reason)
        net.last_error = reason
    log.error("net misconfigured", extra={"net": net_name, "job": "None", "reason": reason})
    if rt.settings.net(net_name).scales_to_zero:
        scale_down_or_log(rt, net_name, "net misconfigured")
    kick(rt)
    return WarmResult(Warm.GAVE_UP, reason)


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
            if session.scalar(_ANY_OPEN_HOLD) is not True:
                return notes
        with unit_of_work(rt.sessions) as session:
            found = session.execute(_OPEN_ROWS).all()
            rows = [row for row, _ in found]
            cap = timedelta(seconds=rt.settings.prewarm_max_s)
            for row, shut in found:
                if row.hold_until > row.created_at + cap:
                    # PREWARM_MAX_S was lowered since it was granted: the bound holds for
                    # the holds already granted too, not only for new ones.
                    row.hold_until = row.created_at + cap
                    notes.append(f"prewarm {row.caller_key}: shortened to PREWARM_MAX_S")
                note = settle_row(session, row, now)
                if not note and shut:
                    # Accepted while a drain of its net committed (prewarm._lock_net): the
                    # drain ends it here, before the net is started again for it.
                    end_hold(row, PrewarmOutcome.CANCELLED, now, f"net {row.net_name} drained")
                    note = "cancelled: net drained"
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


# Asked every idle scale-down round: built once at import (issue 37).
_ANY_OPEN_HOLD = select(_open_hold().exists())
# The open holds, locked, and whether each one's net is drained (app.usecases.drains).
_OPEN_ROWS = (
    select(Prewarm, drained(Prewarm.net_name))
    .where(Prewarm.outcome.is_(None), ~Prewarm.refused)
    .order_by(Prewarm.id)
    .with_for_update(of=Prewarm)
)


def _keep_warming(rt: Runtime, net_name: str) -> str:
    """A live hold wants its net's server up: a STOPPED net is started again (its server
    went away meanwhile: stopped before the hold came, found gone, taken down); a STARTING
    net whose driver was never asked for a replica (the warm-up's message was lost) gets its
    warm-up again."""
    if not rt.settings.has_net(net_name) or rt.settings.net(net_name).always_on:
        return ""
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, net_name, lock=True)
        live = bool(wanted_hold(session, net_name, now))
        if not live:
            return ""
        if net.state == NetState.STOPPED:
            if not startable(session, net_name):
                return ""
            net.transition(NetState.STARTING, now, "prewarm: its hold wants the server up")
            start = True
        elif net.state == NetState.STARTING and records.active_job(session, net_name) is None:
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
