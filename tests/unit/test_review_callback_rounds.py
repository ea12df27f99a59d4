"""Reproductions of broken promises of "Status callbacks" in the delivery rounds that look
before they lease and send up to EVENTS_PER_READ events a read (an independent review).
Each is xfail(strict) until fixed: fixing it makes the test pass and the mark must go."""

from __future__ import annotations

from typing import Any

import pytest

from app.adapters.callbacks import Answer, ReceiverUnreachable
from app.usecases import callback_due, intake
from models import JobEvent, JobState
from tests.unit.conftest import World
from tests.unit.test_callbacks import Receiver, callback_settings, deliver


@pytest.fixture
def cb(tmp_path, job_root, sqlite_factory, clock) -> World:
    return World(callback_settings(tmp_path, job_root), sqlite_factory, clock)


class HangsOn(Receiver):
    """A receiver up for everything but one job, whose handler times out (no answer)."""

    def __init__(self, job_id: Any) -> None:
        super().__init__()
        self.hung = str(job_id)
        self.hangs = 0

    def post(self, body: bytes, headers) -> Answer:
        if f'"job_id":"{self.hung}"' in body.decode():
            self.hangs += 1
            raise ReceiverUnreachable("ReadTimeout: timed out")
        return super().post(body, headers)


def add_history(world: World, job_id: Any, count: int) -> None:
    """`count` more moves in the job's history (as a long-lived job's requeues leave)."""
    with world.rt.sessions.begin() as session:
        for i in range(count):
            back = i % 2 == 0
            session.add(
                JobEvent(
                    job_id=job_id,
                    from_state=JobState.QUEUED if back else JobState.ASSIGNED,
                    to_state=JobState.ASSIGNED if back else JobState.QUEUED,
                    at=world.clock(),
                    reason=f"move {i}",
                )
            )


@pytest.mark.xfail(
    strict=True,
    reason="a read full of one job's events holds nothing else: its silence ends the round "
    "before any other job is tried, and it is the oldest again after every rest",
)
def test_a_job_whose_handler_hangs_holds_back_no_other_job_even_with_a_full_read_of_history(cb):
    """README, "No answer": that job backs off and one other due event is tried; answered,
    the receiver is up and only the first job waits ("a handler that hangs on one event holds
    back no other job"). The hung job here has EVENTS_PER_READ events pending, older than
    the other job's one: the round's read holds only them."""
    hung = cb.enqueue("hung", net="net-a")
    add_history(cb, hung, callback_due.EVENTS_PER_READ - 1)
    other = cb.enqueue("other", net="fixed")
    receiver = HangsOn(hung)
    for _ in range(6):  # each round at its wake-up, past the receiver's rest and the backoffs
        deliver(cb, receiver)
        cb.clock.advance(60)
    assert receiver.hangs >= 1
    assert receiver.accepted(other) == ["QUEUED"]


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
