"""Settling a DISPATCHING attempt whose submit outcome stayed unknown (its worker gone, its
retries spent): the token is settled before the job goes back to the queue, so the attempt's
run, if the submit landed, is adopted, stopped with its server, or kept as a stray run, never
left live beside the job's next attempt."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from app.db import unit_of_work
from app.errors import DispatcherError
from app.runtime import Runtime
from app.usecases import records
from app.usecases.retries import submit_try_s
from app.usecases.scaling import kick, take_down
from models import Job, JobState


def hold_submit(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int, token: str) -> bool:
    """Right before the submit goes out: the job is still this attempt's, DISPATCHING or
    ABORTING with this token (an ABORTING job's run is stopped once it lands), and its lease
    is renewed for the submit itself, so the time spent fetching and copying the bundle is
    never mistaken for a dead worker. Under the row lock `abandon_dispatch` takes: either
    the attempt is abandoned first and nothing is sent, or this holds it and it is not."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        holding = job.state in (JobState.DISPATCHING, JobState.ABORTING)
        if not holding or (job.net_name, job.attempts, job.submit_token) != (
            net_name,
            attempt,
            token,
        ):
            return False
        job.step_due_at = rt.clock() + timedelta(seconds=submit_try_s(rt.settings))
        return True


def abandon_dispatch(rt: Runtime, job_id: uuid.UUID, reason: str) -> bool:
    """Give up a DISPATCHING attempt whose submit outcome stayed unknown. Its token is
    settled first: on a scale-to-zero net the server is taken down (any run dies with it);
    an always-on net's possible run is recorded as a stray run to abort when it answers.
    Returns True once the job is back in the queue (or FAILED past its attempts)."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id)
        if job.state != JobState.DISPATCHING or job.net_name is None:
            return False
        net_name, token = job.net_name, job.submit_token
    if token and rt.settings.has_net(net_name):
        # A server that answers settles the token itself: adopt its run, or know there is none.
        try:
            admin = rt.admin(net_name)
            run_id = admin.find_run(token)
            start_time = admin.server_start_time() if run_id is not None else None
        except DispatcherError:
            pass  # not answering: settled below by taking the server down
        else:
            with unit_of_work(rt.sessions) as session:
                current = records.get_job(session, job_id, lock=True)
                if not _unheld(current, token, rt.clock()):
                    return False
                if run_id is not None:
                    records.mark_dispatched(session, job_id, run_id, start_time, rt.clock())
                else:
                    records.requeue_job(session, job_id, reason, rt.clock())
            kick(rt)
            return run_id is None
    with unit_of_work(rt.sessions) as session:
        if not _unheld(records.get_job(session, job_id, lock=True), token, rt.clock()):
            return False
        records.add_stray_run(
            session,
            net_name=net_name,
            job_id=job_id,
            nvflare_job_id=None,
            submit_token=token,
            reason=reason,
            now=rt.clock(),
        )
        records.requeue_job(session, job_id, reason, rt.clock())
    if rt.settings.has_net(net_name) and rt.settings.net(net_name).scales_to_zero:
        take_down(rt, net_name, f"settling job {job_id}'s unknown submit")
    kick(rt)
    return True


def _unheld(job: Job, token: str | None, now: datetime) -> bool:
    """Still the DISPATCHING attempt of `token`, and no worker holds its submit (its lease,
    renewed right before every submit, has passed)."""
    if job.state != JobState.DISPATCHING or job.submit_token != token:
        return False
    return job.step_due_at is None or now > job.step_due_at
