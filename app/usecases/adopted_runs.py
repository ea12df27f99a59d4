"""A submit whose outcome it never learnt, while another submit of the same attempt had the
job adopt the token's run (a step re-driven beside itself, as the step leases allow): on a
net whose server keeps no submit token of its own (Flower: `NetConfig.tokens_by_lookup`)
this submit's start-run may have started a later run of the token, and only a lookup of the
token stops it before it starts (`FlowerControlClient.find_run`). NVFLARE resolves the
token itself: nothing to look up there.

The submit looks once as it fails (its last try has no retry after it), and its retry looks
again on finding the job moved on (the SuperLink may not have answered the first look)."""

from __future__ import annotations

import logging
import uuid

from app.errors import MisconfigurationError
from app.runtime import Runtime
from app.usecases import records
from models import Job

log = logging.getLogger(__name__)


def adopted_token(job: Job, net_name: str, attempt: int) -> str | None:
    """This attempt's token if the job, past its submit, holds a run of it (adopted from
    another submit of the attempt), on a net whose server needs a lookup; else None."""
    if (job.net_name, job.attempts) != (net_name, attempt) or job.nvflare_job_id is None:
        return None
    return job.submit_token


def look_up(rt: Runtime, net_name: str, token: str) -> None:
    """Look the token up on a net whose server keeps no token (a later run of it stopped
    there); TransientError when it cannot be done, a misconfigured net left to its checks."""
    if not rt.settings.net(net_name).tokens_by_lookup:
        return
    try:
        rt.admin(net_name).find_run(token)
    except MisconfigurationError as exc:
        log.warning("adopted token not looked up", extra={"net": net_name, "reason": str(exc)})


def after_unknown_submit(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int) -> None:
    """A submit that raised (its outcome unknown): if the job adopted a run of its token
    meanwhile, look the token up now. Best effort, the submit's own error is what the task
    sees: a lookup that fails is the retry's to do again."""
    if not rt.settings.net(net_name).tokens_by_lookup:
        return  # no read either: NVFLARE nets' submits cost what they did
    try:
        with rt.sessions() as session:
            token = adopted_token(records.get_job(session, job_id), net_name, attempt)
        if token is not None:
            look_up(rt, net_name, token)
    except Exception as exc:  # noqa: BLE001 - the submit's own error is raised after this
        log.warning("adopted token not looked up yet", extra={"net": net_name, "reason": str(exc)})
