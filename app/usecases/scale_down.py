"""The two beat loops that look only at nets, never at runs: READY nets idle past their grace
are scaled to zero, and BUSY nets' admin sessions are kept alive (a stopped or idle server
is never contacted)."""

from __future__ import annotations

import logging
from datetime import datetime
from functools import partial

from sqlalchemy import exists, select

from app.db import unit_of_work
from app.errors import DispatcherError
from app.runtime import Runtime
from app.usecases import claims
from app.usecases.housekeeping import isolated, round_deadline_s
from app.usecases.prewarm import holds as prewarm_holds
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.scaling import kick, stop_net
from models import ACTIVE_JOB_STATES, Job, Net, NetState

log = logging.getLogger(__name__)


# Every round's read, built once at import (issue 37).
_READY = select(Net.name, Net.idle_since, Net.state_changed_at).where(Net.state == NetState.READY)


def scale_down_idle_nets(rt: Runtime) -> list[str]:
    """READY nets with no active job and no QUEUED job that could run there, idle past their
    grace, go STOPPING -> driver 0 -> STOPPED. The net row is locked like claims.claim_next_job
    locks it, so a job claimed at the same moment is never stranded on a vanishing server."""
    stopped = []
    prewarm_warm_up.settle_prewarms(rt)  # prewarm hook: how holds ended; nets a live hold wants up
    now = rt.clock()
    # One read finds the candidates (READY nets idle past their grace): the cost follows the
    # nets that are up, not the declared fleet; each candidate is then re-checked under its
    # row lock, which recomputes the idle time from the row.
    with rt.sessions() as session:
        ready = session.execute(_READY).all()
    candidates = [
        name
        for name, idle_since, changed_at in ready
        if rt.settings.has_net(name)
        and rt.settings.net(name).scales_to_zero
        and (now - (idle_since or changed_at)).total_seconds()
        >= rt.settings.net(name).idle_timeout_s
    ]
    for name in candidates:
        with isolated(rt, "scale_down_idle_nets", name):
            if _scale_down_if_idle(rt, name, now):
                stopped.append(name)
    if stopped:
        kick(rt)  # a job that arrived while the net was stopping gets a fresh scale-up
    return stopped


def _scale_down_if_idle(rt: Runtime, name: str, now: datetime) -> bool:
    idle_timeout_s = rt.settings.net(name).idle_timeout_s
    with unit_of_work(rt.sessions) as session:
        # Re-checked under the lock: another worker may have used the net since the
        # candidate read (tests/unit/test_idle_scale_down.py stages that).
        net = session.scalar(
            select(Net)
            .where(Net.name == name, Net.state == NetState.READY)
            .with_for_update(skip_locked=True)
        )
        if net is None:
            return False
        idle_since = net.idle_since or net.state_changed_at
        # prewarm hook: a live hold defers the grace; an ended one starts it at its end
        idle_since = prewarm_holds.idle_start(session, name, idle_since)
        idle_s = (now - idle_since).total_seconds()
        if idle_s < idle_timeout_s:
            return False
        # Only a job that could be claimed keeps the server: one waiting for its stray run
        # to be settled (on another net, maybe one an operator must see to) cannot run here,
        # nor any while the net holds a stray (`queued_job_fits`).
        active = exists().where(Job.net_name == name, Job.state.in_(ACTIVE_JOB_STATES))
        if session.scalar(select(active)) or claims.queued_job_fits(session, rt.settings, name):
            return False
        net.transition(NetState.STOPPING, now, f"idle for {idle_s:.0f}s")
    stop_net(rt, name, "idle grace passed")
    return True


def keep_alive_busy_nets(rt: Runtime) -> list[str]:
    """Ping only BUSY nets (refreshes the admin session); stopped and idle nets are left
    alone, so a scaled-to-zero server is never contacted."""
    with rt.sessions() as session:
        busy = list(session.scalars(select(Net.name).where(Net.state == NetState.BUSY)))

    def ping(name: str) -> bool:
        with isolated(rt, "keep_alive_busy_nets", name):
            try:
                rt.admin(name).ping()
                return True
            except DispatcherError as exc:
                # Monitor decides what an unreachable or misconfigured BUSY net means.
                log.warning("keep-alive failed", extra={"net": name, "reason": str(exc)})
        return False

    calls = {name: partial(ping, name) for name in busy if rt.settings.has_net(name)}
    # The round's deadline only shows with a server that hangs (test_parallel_housekeeping);
    # a deadline dropped or None is a type error.
    results = rt.fan_out.run(calls, round_deadline_s(rt))
    return sorted(name for name, result in results.items() if result.value is True)
