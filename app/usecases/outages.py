"""An always-on net's start that never comes up: an OUTAGE past the readiness deadline.

reconcile's always-on watch (`net_repairs.watch_always_on`) moves a net whose server stops
answering to OUTAGE; a job-less STARTING net was left out of it, so a server that never came
up stayed STARTING for ever and never paged. Here it is an OUTAGE once its start is older
than the net's ready_timeout_s, the deadline a job's own wait_ready keeps."""

from __future__ import annotations

import logging

from app.adapters.backend import ServerState
from app.db import unit_of_work
from app.runtime import Runtime
from app.usecases import records
from models import NetState

log = logging.getLogger(__name__)


def overdue_start(rt: Runtime, name: str, server: ServerState) -> str:
    """A job-less STARTING always-on net whose server is still not STARTED past the net's
    ready_timeout_s, counted from its STARTING, is an OUTAGE, logged at error as the other
    one: a server that never comes up pages as one that went down. Before the deadline it is
    booting. Decided under the row lock on the row as it is then: a job claimed onto the net
    meanwhile owns the start, and a net started again since has a fresh deadline.

    The caller leaves a net holding a job to the job's chain: wait_ready gives the job up at
    the same deadline counted from its claim, requeues it and marks the net OUTAGE itself
    (`dispatch._give_up_readiness`); if the chain is lost, reconcile requeues the ASSIGNED
    job past that deadline + STUCK_AFTER_S, and the net, job-less and past its deadline, is
    an OUTAGE here on the next round."""
    timeout_s = rt.settings.net(name).ready_timeout_s
    now = rt.clock()
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        age_s = (now - net.state_changed_at).total_seconds()
        if (
            net.state != NetState.STARTING
            or age_s <= timeout_s
            or records.active_job(session, name) is not None
        ):
            return ""
        reason = (
            f"always-on server {server}: not started {age_s:.0f}s after STARTING "
            f"(ready_timeout_s {timeout_s:.0f}s)"
        )
        net.transition(NetState.OUTAGE, now, reason)
        net.last_error = reason
    log.error(
        "OUTAGE: always-on server never came up",
        extra={"net": name, "server": server, "reason": reason},
    )
    return "STARTING -> OUTAGE (server not up past its readiness deadline)"
