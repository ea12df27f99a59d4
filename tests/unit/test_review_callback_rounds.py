"""Reproductions of broken promises of "Status callbacks" in the delivery rounds that look
before they lease and send up to EVENTS_PER_READ events a read (an independent review).
Each is xfail(strict) until fixed: fixing it makes the test pass and the mark must go."""

from __future__ import annotations

import pytest

from app.adapters.callbacks import Answer, ReceiverUnreachable
from app.usecases import intake
from tests.unit.conftest import World
from tests.unit.test_callbacks import Receiver, callback_settings, deliver


@pytest.fixture
def cb(tmp_path, job_root, sqlite_factory, clock) -> World:
    return World(callback_settings(tmp_path, job_root), sqlite_factory, clock)


class HangsOnRejections(Receiver):
    """A receiver up for state changes whose handler of `rejected` events times out."""

    def post(self, body: bytes, headers) -> Answer:
        if b'"kind":"rejected"' in body:
            raise ReceiverUnreachable("ReadTimeout: timed out")
        return super().post(body, headers)


@pytest.mark.xfail(
    strict=True,
    reason="rejected events go first and two silent ones in a row rest the receiver, so "
    "the jobs' events are never tried while rejections keep hanging (before 979444f too)",
)
def test_rejected_events_whose_handler_hangs_never_hold_back_a_jobs_events(cb):
    """README, "Rejected events": each one is held back only by its own answers, never holds
    back a job's events."""
    job = cb.enqueue("accepted", net="fixed")
    for key in ("refused-1", "refused-2"):
        intake.reject_enqueue(cb.rt, key, "unknown net 'net-9' (known: net-a, fixed)")
    receiver = HangsOnRejections()
    for _ in range(6):  # each round at its wake-up, past the receiver's rest and the backoffs
        deliver(cb, receiver)
        cb.clock.advance(60)
    assert receiver.accepted(job) == ["QUEUED"]
