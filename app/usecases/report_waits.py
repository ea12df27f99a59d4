"""FINISHING jobs whose results report never came: each settled, once its net's report
timeout has passed, as REPORT_TIMEOUT_OUTCOME says, so a lost report from flip-api cannot hold
a server up forever. Run by the monitor's round (`monitor.monitor_running_jobs`), on its read
of every FINISHING job."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from app.db import unit_of_work
from app.runtime import Runtime
from app.usecases import records
from app.usecases.housekeeping import isolated
from app.usecases.scaling import kick
from models import JobState


def expire_report_waits(
    rt: Runtime, finishing: list[tuple[uuid.UUID, datetime, str | None]], now: datetime
) -> dict[str, str]:
    """FINISHING jobs (the round's read of every one) whose results report never came
    within their net's report timeout (`report_timeout_s`, else REPORT_TIMEOUT_S): settled
    per REPORT_TIMEOUT_OUTCOME, so a lost report cannot hold a server up forever."""
    settings = rt.settings
    # Every FINISHING job is read, each then held to its own net's timeout: at most one per
    # net (a FINISHING job holds its net), so no bound in SQL is worth its duplicate.
    overdue = [
        (job_id, since, net_name)
        for job_id, since, net_name in finishing
        if since < now - timedelta(seconds=settings.report_timeout_for(net_name))
    ]
    outcome = (
        JobState.COMPLETED if rt.settings.report_timeout_outcome == "completed" else JobState.FAILED
    )
    results = {}
    for job_id, since, net_name in overdue:
        # Each on its own: one that cannot be settled is recorded on its net and stops
        # neither the others nor the round's watch of every net's runs. A FINISHING job
        # holds its net; a row that names none (a hand edit) is settled all the same, not
        # asserted on outside the isolation, which stopped the round for every net.
        with isolated(rt, "monitor_running_jobs", net_name or "-"):
            with unit_of_work(rt.sessions) as session:
                records.expire_report_wait(
                    session, job_id, outcome, (now - since).total_seconds(), now
                )
            results[str(job_id)] = f"report timeout: {outcome}"
    if results:
        kick(rt)
    return results
