"""Break-it review of round 16 (reviewer a): promises of the job pipeline that did not hold
on the code they were written against, each a strict xfail until its fix."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from app import names
from app.handlers import HANDLERS, Verdict, on_error
from app.schemas import job_id_for
from app.usecases import dispatch, requests
from models import JobState


def _enqueue_payload(key: str) -> dict[str, object]:
    return {"caller_key": key, "definition": "tiny-job", "net": "net-a"}


@pytest.mark.xfail(
    strict=True,
    reason="review r16: an abort handled while its enqueue waits a database retry is lost",
)
def test_an_abort_sent_after_an_enqueue_the_database_delayed_is_not_lost(world):
    """flip-api sends enqueue_job, then (the user changed their mind) abort_job for the job
    id it already knows (uuid5 of its caller_key). The enqueue meets the database down
    (a restart): its message is kept and tried again after a backoff (tasks/README.md,
    "What flip-api may rely on once send_task returned": carried out "exactly as if it had
    been handled at once, whatever the dispatcher's database does meanwhile"). The database
    comes back, the abort is handled first, finds no job and is acknowledged away as
    "rejected: not found"; then the enqueue's retry stores the job QUEUED, and it runs."""
    key = "flip-model-7"
    job_id = job_id_for(key)
    down = OperationalError("INSERT INTO jobs", {}, Exception("connection refused"))
    verdict = on_error(HANDLERS[names.ENQUEUE_JOB], down, 0, world.rt.settings)
    assert verdict is Verdict.RETRY  # the enqueue's message waits its countdown
    # Meanwhile the database is back and the abort, sent after the enqueue, runs first.
    answer = requests.abort_job(world.rt, {"job_id": str(job_id), "reason": "user cancelled"})
    # Then the enqueue's retry.
    requests.enqueue_job(world.rt, _enqueue_payload(key))
    started = [a.job_id for a in dispatch.claim_and_start(world.rt)]
    assert world.job(job_id).state == JobState.ABORTED, (answer, started)
