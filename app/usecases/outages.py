"""An always-on net's start that never comes up: an OUTAGE past the readiness deadline.

reconcile's always-on watch (`net_repairs.watch_always_on`) moves a net whose server stops
answering to OUTAGE; a job-less STARTING net was left out of it, so a server that never came
up stayed STARTING for ever and never paged. Here it is an OUTAGE once its start is older
than the net's ready_timeout_s, the deadline a job's own wait_ready keeps, counted from the
first ask for its replica (a start left at zero replicas, no replica asked for while no
round ran, is no OUTAGE the moment its replica is asked for; a platform that refuses every
ask does not put the page off)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.adapters.backend import ServerState
from app.db import unit_of_work
from app.runtime import Runtime
from app.usecases import records
from app.usecases.scaling import scale_net
from models import NetState, ScaleEvent

log = logging.getLogger(__name__)


def overdue_start(rt: Runtime, name: str, server: ServerState) -> str:
    """A job-less STARTING always-on net whose server is still not STARTED past the net's
    ready_timeout_s is an OUTAGE, logged at error as the other one: a server that never
    comes up pages as one that went down. Before the deadline it is booting. The deadline
    counts from the first ask for this start's replica (`_asked_at`), else from its
    STARTING (the replica was desired already). Decided under the row lock on the row
    as it is then: a job claimed onto the net meanwhile owns the start, and a net started
    again since has a fresh deadline.

    The caller leaves a net holding a job to the job's chain: wait_ready gives the job up at
    the same deadline counted from its claim, requeues it and marks the net OUTAGE itself
    (`dispatch._give_up_readiness`); if the chain is lost, reconcile requeues the ASSIGNED
    job past that deadline + STUCK_AFTER_S, and the net, job-less and past its deadline, is
    an OUTAGE here on the next round."""
    timeout_s = rt.settings.net(name).ready_timeout_s
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        since, what = net.state_changed_at, "STARTING"
        # The ask is read only once the start itself is past the deadline (a round of a
        # booting net pays no statement for it); an ask is never before its start.
        if net.state == NetState.STARTING and (now - since).total_seconds() > timeout_s:
            asked = _asked_at(session, name, since)
            if asked is not None:
                since, what = asked, "its replica was asked for"
        age_s = (now - since).total_seconds()
        if (
            net.state != NetState.STARTING
            or age_s <= timeout_s
            or records.active_job(session, name) is not None
        ):
            return ""
        reason = (
            f"always-on server {server}: not started {age_s:.0f}s after {what} "
            f"(ready_timeout_s {timeout_s:.0f}s)"
        )
        net.transition(NetState.OUTAGE, now, reason)
        net.last_error = reason
    log.error(
        "OUTAGE: always-on server never came up",
        extra={"net": name, "server": server, "reason": reason},
    )
    return "STARTING -> OUTAGE (server not up past its readiness deadline)"


def start_age_s(
    rt: Runtime,
    name: str,
    started: datetime,
    now: datetime | None = None,
    *,
    taken: bool = False,
) -> float:
    """Seconds a job-less start has had to come up, as `overdue_start` counts them: from the
    first ask for its replica once its STARTING is past ready_timeout_s (a start left at
    zero until its replica was asked for late waits for its sites from that ask, not READY
    at once), else from its STARTING (a job's chain: `started` its claim). Only a start
    past that deadline pays the read. `now`: the caller's reading of the clock. `taken`:
    only asks the driver took count (a job's chain: its scale_up retries a refused ask, and
    a retry held past the deadline by a broker outage is the ask its server boots from)."""
    return start_clock(rt, name, started, now, taken=taken).age_s


@dataclass(frozen=True)
class StartClock:
    """How long a start has had to come up (`start_age_s`), and whether that counts from
    its STARTING past the deadline for want of a recorded ask (`unasked`)."""

    age_s: float
    unasked: bool = False


def start_clock(
    rt: Runtime,
    name: str,
    started: datetime,
    now: datetime | None = None,
    *,
    taken: bool = False,
) -> StartClock:
    """`start_age_s`, and whether no ask is recorded since `started`. A caller about to give a
    start up whose driver desires the replica while no ask is recorded asks again instead
    (`ask_unrecorded`): another worker's ask may be between its driver call and the scale
    event it writes after the call (chaos seed 5435: a warm-up gave up the boot another
    warm-up had just asked for, 0 s into it)."""
    now = now or rt.clock()
    age_s = (now - started).total_seconds()
    if age_s <= rt.settings.net(name).ready_timeout_s:
        return StartClock(age_s)
    with rt.sessions() as session:
        asked = _asked_at(session, name, started, taken=taken)
    if asked is None:
        return StartClock(age_s, unasked=True)
    return StartClock((now - asked).total_seconds())


def ask_unrecorded(rt: Runtime, name: str, by: str) -> None:
    """Ask the driver again for a replica it desires with no ask recorded since the start
    (idempotent): the start's deadline counts from this ask. Either an ask is in flight in
    another worker, or the replica was desired before the start (a replica scaled up by
    hand): the two cannot be told apart, so either has ready_timeout_s more from here and
    no more (the next round reads this ask): such a start is given up ready_timeout_s after
    the first look past its deadline (2 x ready_timeout_s after its STARTING when the looks
    come on time). Callers ask only while a live hold wants it."""
    reason = f"{by}: the driver desires a replica no ask since STARTING is recorded for"
    scale_net(rt, name, 1, reason)


def _asked_at(
    session: Session, name: str, since: datetime, *, taken: bool = False
) -> datetime | None:
    """When the net's replica was first asked for at or after `since` (its STARTING): the
    first scale-up call for it, whatever its outcome. Not the last: a replica the platform
    keeps losing (a container that exits at start reads as desired 0) is asked for every
    round, and a platform that refuses every call (throttled, its API down) is asked every
    round too; neither may put the page off. A call whose reply was lost may have applied.
    `taken`: only calls the driver took (a job's chain, whose scale_up is DONE only then)."""
    return session.scalar(
        select(func.min(ScaleEvent.at)).where(
            ScaleEvent.net_name == name,
            ScaleEvent.action == "scale_up",
            ScaleEvent.at >= since,
            *([ScaleEvent.outcome == "ok"] if taken else []),
        )
    )
