"""What one delivery round costs and how it reads: a look without the lease first, the
claim and the due events in one transaction, each accepted event recorded in two
statements (the last one letting the lease go), and one more look once the release is
committed (issue 37). The rules the rounds keep (order, retries, give-up, the lease) are
tests/unit/test_callbacks.py's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, update

from app.adapters.callbacks import Answer, ReceiverUnreachable
from app.usecases import callbacks
from app.usecases.callbacks import due as callback_due
from app.usecases.callbacks import receiver as callback_receiver
from app.usecases.callbacks.due import Look
from models import CallbackCursor, CallbackReceiver, JobEvent, JobState
from tests.unit.conftest import World
from tests.unit.test_callbacks import (
    LIFE,
    Receiver,
    callback_settings,
    complete,
    deliver,
    receiver_row,
)


@pytest.fixture
def cb(tmp_path, job_root, sqlite_factory, clock) -> World:
    return World(callback_settings(tmp_path, job_root), sqlite_factory, clock)


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@dataclass
class Sent:
    """The statements and commits an engine ran (SQLite's BEGIN IMMEDIATE left out)."""

    statements: list[str] = field(default_factory=list)
    commits: int = 0

    def writes(self) -> list[str]:
        return [s for s in self.statements if s.split()[0] in ("INSERT", "UPDATE", "DELETE")]

    def claims(self) -> list[str]:
        """Tries for the lease: conditional on nobody holding it."""
        return [s for s in self.writes() if "callback_receiver.lease_owner IS NULL" in s]


@contextmanager
def counted(world: World) -> Iterator[Sent]:
    sent = Sent()
    engine = world.rt.engine

    def statement(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if not sql.startswith("BEGIN"):
            sent.statements.append(" ".join(sql.split()))

    def commit(*_: Any) -> None:
        sent.commits += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "commit", commit)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "commit", commit)


def reads_of(world: World, events: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """CALLBACK_EVENTS_PER_READ=`events` for the world's deliverer."""
    changed = world.rt.settings.model_copy(update={"callback_events_per_read": events})
    monkeypatch.setattr(world.rt, "settings", changed)


def delivered_once(world: World, receiver: Receiver) -> None:
    """The receiver's row exists and the statement caches are warm, as after any delivery."""
    world.enqueue("warm-up", net="fixed")
    assert deliver(world, receiver).delivered == 1


def test_a_round_with_nothing_due_takes_no_lease_and_writes_nothing(cb, receiver):
    delivered_once(cb, receiver)
    with counted(cb) as sent:
        report = deliver(cb, receiver)
    assert report == callbacks.DeliveryReport()
    assert sent.writes() == [] and sent.commits == 0
    assert len(sent.statements) == 1  # the look


def test_a_round_with_nothing_due_is_not_busy_while_another_holds_the_lease(cb, receiver):
    """Nothing due: the round does not even try for the lease, so it cannot find it held
    (before, every kick and sweep took the lease and let it go)."""
    delivered_once(cb, receiver)
    assert callback_receiver.claim_lease(cb.rt, "another-deliverer")
    report = deliver(cb, receiver)
    assert not report.busy and report.delivered == 0


def test_one_due_event_costs_six_statements_and_two_commits(cb, receiver):
    """A look; the claim with the read of what is due; the record, whose lease update lets
    the lease go too (nothing more was read), with the cursor moved on; the next look. Was
    19 statements and 3 commits."""
    delivered_once(cb, receiver)
    cb.enqueue("j1", net="net-a")
    with counted(cb) as sent:
        assert deliver(cb, receiver).delivered == 1
    assert len(sent.statements) <= 6, sent.statements
    assert sent.commits <= 2
    assert len(sent.claims()) == 1
    assert receiver_row(cb).lease_owner is None


def test_a_full_read_is_followed_by_another_under_the_same_lease(cb, receiver, monkeypatch):
    reads_of(cb, 2, monkeypatch)
    delivered_once(cb, receiver)
    jobs = [cb.enqueue(f"j{i}", net="net-a") for i in range(5)]
    with counted(cb) as sent:
        assert deliver(cb, receiver).delivered == 5
    assert len(sent.claims()) == 1
    assert [p["job_id"] for p, _, _ in receiver.requests[1:]] == [str(j) for j in jobs]


def test_a_read_that_cuts_a_jobs_history_short_keeps_its_order_and_its_hold(
    cb, receiver, monkeypatch
):
    """Each read holds the oldest events of every due job, a few at a time: a job refused
    on one event is held back in the reads after it too, and sends the rest in order once
    its backoff is over; the other jobs go on."""
    reads_of(cb, 2, monkeypatch)
    held = cb.enqueue("held", net="net-a")
    complete(cb, held)
    other = cb.enqueue("other", net="fixed")
    tries = iter(range(1, 100))

    def rule(payload: dict[str, Any]) -> int:
        if payload["job_id"] == str(held) and payload["to_state"] == "ASSIGNED":
            return 503 if next(tries) == 1 else 200
        return 200

    receiver.rule = rule
    deliver(cb, receiver)
    assert receiver.accepted(held) == ["QUEUED"] and receiver.accepted(other) == ["QUEUED"]
    cb.clock.advance(60)
    deliver(cb, receiver)
    assert receiver.accepted(held) == LIFE
    assert [sent for sent, _ in receiver.sent(held)] == sorted(s for s, _ in receiver.sent(held))


def test_a_receiver_put_to_rest_after_the_look_gets_no_try(cb, receiver, monkeypatch):
    """Another deliverer found the receiver silent between this round's look and its claim:
    the claim reads the rest, tries nothing, and schedules the wake-up for its end."""
    delivered_once(cb, receiver)
    cb.enqueue("j1", net="net-a")
    rest_until = cb.clock() + timedelta(seconds=100)
    with cb.rt.sessions.begin() as session:
        session.execute(update(CallbackReceiver).values(failures=3, next_attempt_at=rest_until))
    looks = iter([Look(jobs_due=True, due_at=cb.clock())])  # what the look saw before

    real_look = callback_due.look
    monkeypatch.setattr(callbacks, "look", lambda s, now: next(looks, None) or real_look(s, now))
    report = deliver(cb, receiver)
    assert len(receiver.requests) == 1  # only the warm-up's
    assert report.delivered == 0 and report.retry_in_s == 100


def test_an_accepted_event_after_failures_settles_its_job_and_wakes_the_receiver(cb, receiver):
    """What the two-statement record writes for a 2xx is what judging the answer wrote."""
    job_id = cb.enqueue("j1", net="net-a")
    receiver.rule = lambda p: 503
    deliver(cb, receiver)
    receiver.down = True
    cb.clock.advance(60)
    deliver(cb, receiver)
    with cb.rt.sessions() as session:
        cursor = session.get(CallbackCursor, job_id)
        assert cursor.tries == 2 and cursor.next_attempt_at is not None
    receiver.down = False
    receiver.rule = lambda p: 200
    cb.clock.advance(60)
    assert deliver(cb, receiver).delivered == 1
    with cb.rt.sessions() as session:
        cursor = session.get(CallbackCursor, job_id)
        row = session.get(CallbackReceiver, callback_receiver.RECEIVER_ID)
        assert (cursor.tries, cursor.rejections, cursor.next_attempt_at) == (0, 0, None)
        assert (cursor.delivered, cursor.failed) == (1, 0)
        assert cursor.settled_through == receiver.sent(job_id)[-1][0]
        assert cursor.last_error.endswith("Connection refused")  # kept, as before
        assert cursor.updated_at == cb.clock()
        assert (row.failures, row.next_attempt_at) == (0, None)
        assert row.lease_owner is None and row.lease_until is None


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


def test_a_job_whose_handler_hangs_holds_back_no_other_job_even_with_a_full_read_of_history(cb):
    """tasks/README.md "Status callbacks", its rule for no answer: that job backs off and one other
    due event is tried; answered, the receiver is up and only the first job waits ("a
    handler that hangs on one event holds back no other job"). The hung job here has
    CALLBACK_EVENTS_PER_READ events pending, older than the other job's one: the round's read holds
    only them, so the other event is read again once the hung job's own backoff keeps it
    out."""
    hung = cb.enqueue("hung", net="net-a")
    add_history(cb, hung, cb.rt.settings.callback_events_per_read - 1)
    other = cb.enqueue("other", net="fixed")
    receiver = HangsOn(hung)
    report = deliver(cb, receiver)
    assert receiver.hangs == 1
    assert receiver.accepted(other) == ["QUEUED"]
    assert report.delivered == 1
    assert receiver_row(cb).next_attempt_at is None  # answered: the receiver is up


class HangsOnJobs(Receiver):
    """A receiver up for everything but some jobs, whose handler times out on each."""

    def __init__(self, *job_ids: Any) -> None:
        super().__init__()
        self.hung = {str(job_id) for job_id in job_ids}
        self.hangs = 0

    def post(self, body: bytes, headers) -> Answer:
        if any(f'"job_id":"{job}"' in body.decode() for job in self.hung):
            self.hangs += 1
            raise ReceiverUnreachable("ReadTimeout: timed out")
        return super().post(body, headers)


def test_two_jobs_whose_handler_hangs_hold_back_no_other_job(cb):
    """tasks/README.md "Status callbacks", no answer: the jobs whose head went unanswered are tried
    after every other due job, so two hung handlers (each the other's "one other due
    event") cannot keep the receiver resting while a job it answers waits. Found by the
    sweep's `hang` profile (seed 1: other jobs' events waited 65 s, until the hangs ended)."""
    hung = [cb.enqueue(f"hung-{i}", net="net-a") for i in range(2)]
    receiver = HangsOnJobs(*hung)
    deliver(cb, receiver)  # both heads unanswered: the receiver rests
    assert receiver.hangs == 2
    cb.clock.advance(600)  # every backoff over: the hung heads are due again
    other = cb.enqueue("other", net="fixed")
    report = deliver(cb, receiver)
    assert receiver.accepted(other) == ["QUEUED"]
    assert report.delivered == 1


def test_a_round_stops_when_its_time_budget_on_the_runtimes_monotonic_clock_is_spent(
    cb, receiver, monkeypatch
):
    """A round delivers until ROUND_BUDGET_S of the runtime's monotonic clock are spent (the
    worker's housekeeping waits behind it), then lets go and asks for a wake-up now: the
    rest goes in the next round. The budget reads `rt.monotonic`, which the simulator
    drives (seeds 1339, 4109: it read time.monotonic, and a simulated round ran past it)."""
    delivered_once(cb, receiver)
    jobs = [cb.enqueue(f"j{i}", net="net-a") for i in range(5)]
    elapsed = [0.0]

    def slow_answer() -> None:
        elapsed[0] += callbacks.ROUND_BUDGET_S / 2.5  # the third answer ends past the budget

    receiver.during_post = slow_answer
    monkeypatch.setattr(cb.rt, "monotonic", lambda: elapsed[0])
    report = deliver(cb, receiver)
    assert report.delivered == 3 and report.retry_in_s == 0.0
    assert receiver_row(cb).lease_owner is None
    receiver.during_post = None
    assert deliver(cb, receiver).delivered == 2
    assert [p["job_id"] for p, _, _ in receiver.requests[1:]] == [str(j) for j in jobs]


@pytest.mark.parametrize("answer", [429, 503, 500, 408])
def test_a_receiver_failing_every_event_rests_after_two_as_a_silent_one_does(cb, receiver, answer):
    """tasks/README.md "Status callbacks": a 5xx, 408 or 429 is tried like no answer. One job's
    failure holds back no other (the one other event tried is answered: the rest is
    lifted); two in a row and the receiver rests. Before, each came back at once and only
    that job waited, so a receiver answering 429 to every event was sent every due event
    of every job, round after round, each round its worker's whole budget (seeds 1339 and
    4109 of the sweep's long-queue band: 500 requests in 90 s, housekeeping starved)."""
    jobs = [cb.enqueue(f"j{i}", net="net-a") for i in range(6)]
    receiver.rule = lambda p: answer
    report = deliver(cb, receiver)
    assert len(receiver.requests) == 2 and report.delivered == 0
    assert receiver_row(cb).next_attempt_at == cb.clock() + timedelta(seconds=2)
    assert report.retry_in_s == 2.0  # the first rest: 2 s
    cb.clock.advance(1)
    deliver(cb, receiver)
    assert len(receiver.requests) == 2  # resting: nothing is sent
    receiver.rule = lambda p: 200
    cb.clock.advance(1)
    assert deliver(cb, receiver).delivered == 6
    tried_first = [p["job_id"] for p, _, _ in receiver.requests[:2]]
    accepted = [p["job_id"] for p, _, status in receiver.requests if status == 200]
    assert accepted[4:] == tried_first  # the jobs that failed go after every other
    assert sorted(accepted) == sorted(str(j) for j in jobs)
