"""A settling start whose replica fails to start: given up at once, not waited out.

A STOPPED scale-to-zero net whose strays its server's database keeps is started job-less to
settle them (`net_repairs._start_to_settle`), or a replica an operator scaled up by hand is
adopted as such a start. Nothing polls such a start but reconcile, which waited for its
server up to ready_timeout_s whatever the driver said; a job's start (`dispatch._check_ready`)
and a prewarm's (`warm_up._poll`) are given up as soon as the driver reports a failure."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.adapters.drivers import Observation
from app.db import unit_of_work
from app.runtime import Runtime
from app.usecases import records
from app.usecases.scaling import stop_net
from models import NetEvent, NetState, ScaleEvent

log = logging.getLogger(__name__)

SETTLE_START = "start to settle stray runs"  # the net event that marks a settling start
# A server an operator started by hand on a net whose strays wait in its state database,
# adopted as a settling start (`net_repairs.repair_scaling_net`): its own reason, since no
# ask of the dispatcher's precedes it (a failure after it is this start's, asked or not).
ADOPTED_START = "server started by hand: adopted to settle stray runs"
SETTLING_STARTS = (SETTLE_START, ADOPTED_START)  # both count as tried (the settle rest)


def give_up_failed_start(rt: Runtime, name: str, observation: Observation) -> str:
    """A job-less settling start whose driver reports a failure while no replica of it runs
    (the round's `observation` of a STARTING net) is UNHEALTHY at once, the failure its
    error, logged at error as a job's failed start is, and its replica taken back; its
    strays wait for the next settling start (at rest once overdue: this one counts as
    tried). Decided under the row lock: a job claimed onto the net meanwhile owns the start.
    A start of another kind (a prewarm's: its warm_up gives it up) is left as it is, and so
    is one with a replica running (the server decides). A failure with no replica desired
    fails the start only once the driver took its ask (as `warm_up._poll` rules): before
    that it is how an earlier server ended (a container that crashed long ago, which the
    engine reports until it is started again), and the ask may be on the wire or refused.
    "" when nothing was done."""
    if not observation.failure or observation.is_up:
        return ""  # (the usual round: nothing read)
    reason = f"driver: {observation.failure}"
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        if net.state != NetState.STARTING or records.active_job(session, name) is not None:
            return ""
        began = session.scalar(
            select(NetEvent.reason)
            .where(NetEvent.net_name == name)
            .order_by(NetEvent.id.desc())
            .limit(1)
        )
        if began not in SETTLING_STARTS:
            return ""
        if (
            began == SETTLE_START
            and observation.desired < 1
            and not _asked_since(session, name, net.state_changed_at)
        ):
            return ""  # a failure from before this start's ask: history, not this start's
        net.transition(NetState.UNHEALTHY, rt.clock(), reason)
        net.last_error = reason
    log.error("settling start failed", extra={"net": name, "reason": reason})
    stop_net(rt, name, "settling start failed")
    return f"settling start failed ({reason}): UNHEALTHY, scaled to 0"


def _asked_since(session: Session, name: str, since: datetime) -> bool:
    """The driver took a request for a replica of the net at or after `since`."""
    taken = select(ScaleEvent.id).where(
        ScaleEvent.net_name == name,
        ScaleEvent.replicas == 1,
        ScaleEvent.outcome == "ok",
        ScaleEvent.at >= since,
    )
    return session.scalar(taken.limit(1)) is not None
