"""Promises of tasks/README.md "Status callbacks" about tries that are not delivered (no
answer, or a 5xx, 408 or 429), broken by a first version of "not now is tried like no answer"
(a fresh reviewer's reproductions, each failing on that code): one failure alone rested the
receiver, a rest counted two failures, and the tries' order let two events that fail for
ever take both tries of every rest."""

from __future__ import annotations

from itertools import pairwise

from app.usecases import callbacks, intake
from tests.unit.callback_world import (
    Receiver,
    callback_settings,
    cb,
    deliver,
    receiver,
    receiver_row,
)
from tests.unit.conftest import World

__all__ = ["cb", "receiver"]  # the fixtures, used by name


def _rest_s(world: World) -> float:
    """How long the receiver rests from now (0: awake)."""
    until = receiver_row(world).next_attempt_at
    return 0.0 if until is None else max(0.0, (until - world.clock()).total_seconds())


def test_a_job_whose_handler_fails_alone_holds_back_no_new_job(
    tmp_path, job_root, sqlite_factory, clock
):
    """Promise: a 5xx "backs off that job, and one other due event is tried ... a handler
    that hangs or fails on one event holds back no other job". Was broken: when the failing
    job's event is the only one due, there is no other event to try, yet the 5xx rested the
    whole receiver; round after round its failures add up, so the rest reaches
    CALLBACK_MAX_BACKOFF_S (300 s by default), and a job enqueued meanwhile, whose events
    the receiver would answer at once, is sent nothing for that long. Before the change a
    5xx held back only its own job."""
    world = World(
        callback_settings(tmp_path, job_root, CALLBACK_MAX_BACKOFF_S=300), sqlite_factory, clock
    )
    failing = world.enqueue("failing", net="net-a")
    rcv = Receiver()
    rcv.rule = lambda p: 500 if p["job_id"] == str(failing) else 200
    for _ in range(9):  # the job's handler fails for a quarter of an hour, alone
        report = deliver(world, rcv)
        assert report.retry_in_s is not None
        world.clock.advance(report.retry_in_s)
    deliver(world, rcv)
    fine = world.enqueue("fine", net="fixed")  # its kick's round, at once
    deliver(world, rcv)
    assert rcv.accepted(fine) == ["QUEUED"], (
        f"a job the receiver answers waits {_rest_s(world):.0f} s for the rest one other "
        "job's 500s put the receiver in"
    )


def test_two_failing_jobs_do_not_starve_a_job_whose_one_try_was_not_delivered(cb, receiver):
    """Promise: after a rest "the due events are tried again, the jobs whose last try was not
    delivered after every other (so handlers that hang or fail on several jobs hold back no
    job they answer either)". Was broken: a job whose head was tried once while the receiver was
    down (or once answered 503 or 429) is sorted among the failing jobs by event id; two
    older jobs whose handler answers 500 for ever are tried first in every round, each
    round's two "not now"s rest the receiver again, and the answered job's event is never
    sent, at the natural wake-ups and with every backoff over alike."""
    bad = [cb.enqueue(f"bad-{i}", net="net-a") for i in range(2)]
    good = cb.enqueue("good", net="fixed")
    receiver.down = True  # a moment of connection refused
    deliver(cb, receiver)  # bad-0, bad-1: the receiver rests
    cb.clock.advance(_rest_s(cb))
    deliver(cb, receiver)  # good (never tried: first), bad-0: rests again
    receiver.down = False
    receiver.rule = lambda p: 500 if p["job_id"] in {str(b) for b in bad} else 200
    for _ in range(10):
        report = deliver(cb, receiver)
        cb.clock.advance(report.retry_in_s if report.retry_in_s else 11)
    for _ in range(5):
        cb.clock.advance(600)  # every backoff over
        deliver(cb, receiver)
    tried = [p["job_id"] for p, _, _ in receiver.requests]
    assert receiver.accepted(good) == ["QUEUED"], (
        f"good never tried again in {len(tried)} requests; all went to the two failing jobs: "
        f"{set(tried) <= {str(b) for b in bad}}"
    )


def test_two_rejected_events_answered_429_do_not_starve_a_later_one(cb, receiver):
    """Promise: refused enqueues' events "follow the same retry and give-up rules, and hold
    back only themselves", and after a rest the events whose last try was not delivered go
    after every other. Was broken: rejected events are read oldest first whatever their tries;
    two older ones the receiver answers 429 (or 503) for ever are the two tries of every
    rest, and a later rejected event, never tried, answered 200 the moment it is sent, is
    never sent."""
    intake.record_refusal(cb.rt, "stuck-1", "unknown net 'x'")
    intake.record_refusal(cb.rt, "stuck-2", "unknown net 'x'")
    intake.record_refusal(cb.rt, "later", "unknown net 'y'")
    stuck = {"stuck-1", "stuck-2"}
    receiver.rule = lambda p: 429 if p.get("caller_key") in stuck else 200
    for _ in range(10):
        report = deliver(cb, receiver)
        cb.clock.advance(report.retry_in_s if report.retry_in_s else 11)
    keys = [p.get("caller_key") for p, _, _ in receiver.requests]
    assert "later" in keys, f"the later rejected event was never sent; all tries went to {keys}"


def test_a_round_out_of_time_right_after_a_503_leaves_the_receiver_awake(cb, receiver, monkeypatch):
    """Promises: a round hands its worker back after ROUND_BUDGET_S and is sent again; a 5xx
    backs off its job and one other due event is tried (answered, the receiver is up); after
    a failure the one retry is scheduled for when the next event is due. Was broken: when the
    budget runs out on the try that got the 503, the round ends before the other event is
    tried, so the one failure leaves the receiver resting; the round asks to be sent again
    at once (retry_in_s 0), and that round sends nothing: the job after it, which the
    receiver answers, waits out the rest (2 s here, up to CALLBACK_MAX_BACKOFF_S when the
    failures before it were not answered)."""
    early = [cb.enqueue(f"early-{i}", net="fixed") for i in range(2)]
    failing = cb.enqueue("failing", net="net-a")
    after = cb.enqueue("after", net="fixed")
    receiver.rule = lambda p: 503 if p["job_id"] == str(failing) else 200
    elapsed = [0.0]

    def slow_answer() -> None:
        elapsed[0] += callbacks.ROUND_BUDGET_S / 2.4  # the third answer ends past the budget

    receiver.during_post = slow_answer
    monkeypatch.setattr(cb.rt, "monotonic", lambda: elapsed[0])
    first = deliver(cb, receiver)
    assert [p["job_id"] for p, _, _ in receiver.requests] == [*map(str, early), str(failing)]
    assert first.retry_in_s == 0.0  # sent again at once, for the one other event
    second = deliver(cb, receiver)
    assert receiver.accepted(after) == ["QUEUED"], (
        f"the round sent again at once tried nothing: the receiver rests {_rest_s(cb):.0f} s "
        f"on one 503 (second round's retry_in_s={second.retry_in_s})"
    )


def test_successive_rests_of_a_receiver_answering_503_double(
    tmp_path, job_root, sqlite_factory, clock
):
    """Promise: failing too, "the receiver is resting: nothing is sent for 2, 4, 8 ... s
    capped by CALLBACK_MAX_BACKOFF_S". Was broken: each rest follows two failures, each of
    which doubles the receiver's backoff, so successive rests grow fourfold: 4, 16, 64,
    256 s. A receiver that answered 503 for two minutes is sent its next request four
    minutes later, not at most about twice its outage."""
    world = World(
        callback_settings(tmp_path, job_root, CALLBACK_MAX_BACKOFF_S=3600), sqlite_factory, clock
    )
    for i in range(4):
        world.enqueue(f"j{i}", net="net-a")
    rcv = Receiver()
    rcv.rule = lambda p: 503
    rests = []
    for _ in range(4):
        report = deliver(world, rcv)
        assert report.retry_in_s is not None
        rests.append(report.retry_in_s)
        world.clock.advance(report.retry_in_s)
    assert all(b <= 2 * a for a, b in pairwise(rests)), f"rests of {rests} s"
