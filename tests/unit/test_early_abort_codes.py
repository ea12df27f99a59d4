"""A kept early abort's reason code (found by round 16's break-it): a code this release
cannot end an ABORTED job with still aborts the job, never loses the enqueue."""

from __future__ import annotations

from datetime import timedelta

from app.schemas import job_id_for
from app.usecases import requests
from models import EarlyAbort, ReasonCode


def _enqueue(world, key: str) -> dict[str, object]:
    world.clock.advance(1)
    return requests.enqueue_job(
        world.rt, {"caller_key": key, "definition": "tiny-job", "net": "net-a"}
    )


def test_a_kept_code_this_release_knows_but_not_for_aborted_still_aborts_the_job(world):
    """A newer release that also keeps an early `error` report (say) is rolled back: its
    row's code is one this release knows, but for FAILED only. The enqueue must not fail on
    it (its request would be acknowledged away and the job lost): the guard against a
    newer release's row (3d9c97a) asks whether the code is known, not whether it may end
    an ABORTED job."""
    with world.rt.sessions.begin() as session:
        session.add(
            EarlyAbort(
                job_id=job_id_for("k"),
                reason="from a newer release",
                reason_code=str(ReasonCode.REPORTED_ERROR),
                asked_at=world.clock(),
                kept_until=world.clock() + timedelta(days=1),
            )
        )
    assert _enqueue(world, "k")["state"] == "ABORTED"
    assert world.job(job_id_for("k")).reason_code == ReasonCode.ABORTED
