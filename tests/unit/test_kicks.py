"""Coalesced kicks (app.usecases.kicks): a burst of enqueues sends one assign kick while it
is pending, and no job is ever left QUEUED without a kick that will see it, whatever the
order in which an enqueue and an assign round interleave."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, select

from app import names
from app.runtime import RecordingOutbox
from app.schemas import EnqueueJob
from app.usecases import intake, kicks
from models import JobState, PendingKick
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of

KICK = (names.ASSIGN_NEXT_JOB, {})


@pytest.fixture
def two_free_nets(tmp_path, job_root, sqlite_factory, clock) -> World:
    """Two always-on nets (static: up at once), so a claim never waits for a scale-up, and
    kicks coalesced as in a worker (`celery_runtime`), in front of the recording outbox."""
    nets = [net_decl(tmp_path, "net-a"), net_decl(tmp_path, "net-b")]
    world = world_of(
        nets,
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        PER_JOB_FL_SERVER="false",
        HOUSEKEEPING_INTERVAL_S=15,
    )
    kicks.coalesce_kicks(world.rt)
    return world


def submit(world: World, key: str) -> uuid.UUID:
    """flip-api's enqueue through the real door: store the job, then kick."""
    world.clock.advance(0.01)
    request = EnqueueJob(caller_key=key, definition="tiny-job", required_sites=["site-1"])
    return intake.submit_job(world.rt, request).enqueued.job_id


def kicks_sent(world: World) -> int:
    return sum(1 for sent in world.outbox.sent if sent == KICK)


def run_every_kick(world: World, start: int = 0) -> int:
    """What the workers do with the kicks on the broker from `start` on: one assign round
    each, including the kicks those rounds cause. Returns how many ran."""
    ran = 0
    index = start
    while index < len(world.outbox.sent):
        if world.outbox.sent[index] == KICK:
            kicks.assign_round(world.rt)
            ran += 1
        index += 1
    return ran


def state(world: World, job_id: uuid.UUID) -> JobState:
    return world.job(job_id).state


def test_a_burst_sends_one_kick_and_its_round_sees_every_job(two_free_nets):
    world = two_free_nets
    jobs = [submit(world, f"burst-{i}") for i in range(30)]
    assert kicks_sent(world) == 1  # was 30: one per enqueue
    assert run_every_kick(world) == 1
    claimed = [j for j in jobs if state(world, j) == JobState.ASSIGNED]
    assert claimed == jobs[:2]  # both free nets, oldest first
    # The round took the kick: the next enqueue sends its own.
    submit(world, "after")
    assert kicks_sent(world) == 2


# The assign round's commits: it takes the marker; claims `first`; reads and finds no job.
ROUND_COMMITS = 3


def test_an_assign_round_commits_three_times(two_free_nets):
    world = two_free_nets
    submit(world, "first")
    assert count_commits(world, lambda: kicks.assign_round(world.rt)) == ROUND_COMMITS


@pytest.mark.parametrize("point", range(ROUND_COMMITS + 1))
def test_every_enqueue_that_an_assign_round_could_miss_sends_a_kick(two_free_nets, point):
    """Job `late` is enqueued (committed, then its kick decided) at one point of the round
    in turn: before it, after it took the marker, after its claim, after its last (empty)
    read. Wherever it lands, the round claims it or a kick is sent that does. A round that
    took the marker after its read instead loses `late` when it lands between the two: its
    enqueue finds the marker of the kick being run and sends nothing."""
    world = two_free_nets
    first = submit(world, "first")
    sent_before = len(world.outbox.sent)
    late: list[uuid.UUID] = []
    with enqueue_after_commit(world, point, lambda: late.append(submit(world, "late"))):
        kicks.assign_round(world.rt)  # the worker runs `first`'s kick
    assert late, f"point {point}: the enqueue was never injected"
    run_every_kick(world, start=sent_before)
    assert state(world, first) == JobState.ASSIGNED
    assert state(world, late[0]) == JobState.ASSIGNED, f"kick lost at point {point}"


def test_an_enqueue_and_its_kick_s_marker_are_one_commit(two_free_nets):
    """The job and the marker of the kick sent for it are committed together (issue 37's
    intake: the marker had a transaction, a pool checkout and a pre-ping of its own); the
    kick goes out after that commit, and the next enqueue finds its marker."""
    world = two_free_nets
    assert count_transactions(world, lambda: submit(world, "first")) == 1
    assert kicks_sent(world) == 1 and not no_marker(world)
    assert count_transactions(world, lambda: submit(world, "second")) == 1
    assert kicks_sent(world) == 1


def test_a_lost_kick_holds_later_kicks_back_for_one_interval_at_most(two_free_nets):
    world = two_free_nets
    lost = submit(world, "lost")  # its kick is sent and never delivered (a broker restart)
    world.clock.advance(14)
    coalesced = submit(world, "coalesced")
    assert kicks_sent(world) == 1  # the marker still counts as pending
    world.clock.advance(1.5)  # past HOUSEKEEPING_INTERVAL_S since the lost one was sent
    submit(world, "stale")
    assert kicks_sent(world) == 2
    run_every_kick(world, start=len(world.outbox.sent) - 1)
    # The new kick's round places what the lost one was for (two nets: the two oldest).
    assert [state(world, job) for job in (lost, coalesced)] == [JobState.ASSIGNED] * 2


def test_beat_s_round_takes_the_marker_of_a_lost_kick(two_free_nets):
    world = two_free_nets
    job = submit(world, "lost")
    kicks.assign_round(world.rt)  # beat's assign round: same task, same order
    assert state(world, job) == JobState.ASSIGNED
    submit(world, "next")
    assert kicks_sent(world) == 2


def test_a_kick_the_broker_refused_is_not_pending(two_free_nets):
    world = two_free_nets
    refusing = RefusingOutbox()
    world.rt.outbox = kicks.CoalescingOutbox(
        refusing, world.rt.sessions, world.clock, timedelta(seconds=15)
    )
    request = EnqueueJob(caller_key="refused", definition="tiny-job", required_sites=["site-1"])
    assert intake.submit_job(world.rt, request).notified is False
    assert no_marker(world)
    refusing.refuse = False
    submit(world, "next")  # at once, not after the marker would have gone stale
    assert refusing.sent == [KICK]


def test_other_sends_are_not_coalesced(two_free_nets):
    world = two_free_nets
    for _ in range(2):
        world.rt.outbox.send(names.SETTLE_STRAY_RUNS, net_name="net-a")
        world.rt.outbox.start_pipeline("j", "net-a", 0)
    assert (
        world.outbox.sent
        == [
            (names.SETTLE_STRAY_RUNS, {"net_name": "net-a"}),
            ("pipeline", {"job_id": "j", "net_name": "net-a", "attempt": 0}),
        ]
        * 2
    )


def test_a_freed_net_sends_no_kick_when_no_job_waits(two_free_nets):
    """A kick with nothing to claim is one read: no marker written, no empty round (issue
    37). A job enqueued after it sends its own kick, and is claimed."""
    world = two_free_nets
    sent: list[str] = []
    engine = world.rt.sessions.kw["bind"]
    note = lambda _c, _cur, sql, *_: sent.append(sql)  # noqa: E731
    event.listen(engine, "before_cursor_execute", note)
    try:
        assert world.rt.outbox.send(names.ASSIGN_NEXT_JOB) is True  # nothing is owed
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert kicks_sent(world) == 0
    assert [sql for sql in sent if not sql.startswith("BEGIN")][1:] == []  # one read
    assert no_marker(world)
    job = submit(world, "later")
    assert run_every_kick(world) == 1
    assert state(world, job) == JobState.ASSIGNED


def test_a_round_with_no_kick_and_no_job_waiting_is_one_read(two_free_nets):
    """Beat's round when nothing waits: one read, no write, no claim (issue 37: it deleted a
    marker that was not there, then ran the claim's read in a transaction of its own). A job
    enqueued right after it finds no marker, sends its own kick, and is claimed."""
    world = two_free_nets
    sent = statements_of(world, lambda: kicks.assign_round(world.rt))
    assert len(sent) == 1 and sent[0].startswith("SELECT")
    job = submit(world, "after")
    assert kicks_sent(world) == 1
    assert run_every_kick(world) == 1
    assert state(world, job) == JobState.ASSIGNED


def test_a_round_with_no_kick_still_claims_a_waiting_job(two_free_nets):
    """A job waits with no kick pending (the round that took its marker died before its
    claim): beat's round claims it."""
    world = two_free_nets
    job = submit(world, "orphaned")
    with world.rt.sessions.begin() as session:
        kicks.take(session, names.ASSIGN_NEXT_JOB)
    kicks.assign_round(world.rt)
    assert state(world, job) == JobState.ASSIGNED


# --- helpers ------------------------------------------------------------------------------


class RefusingOutbox(RecordingOutbox):
    """A broker that refuses sends until told otherwise."""

    refuse = True

    def send(self, task: str, **kwargs: Any) -> bool:
        if self.refuse:
            return False
        return super().send(task, **kwargs)


def no_marker(world: World) -> bool:
    with world.rt.sessions() as session:
        return session.scalar(select(PendingKick)) is None


def count_commits(world: World, action: Callable[[], object]) -> int:
    commits = []
    listener = lambda _session: commits.append(1)  # noqa: E731
    event.listen(world.rt.sessions, "after_commit", listener)
    try:
        action()
    finally:
        event.remove(world.rt.sessions, "after_commit", listener)
    return len(commits)


def count_transactions(world: World, action: Callable[[], object]) -> int:
    """The database transactions `action` commits (a savepoint's release is none)."""
    commits = []
    engine = world.rt.sessions.kw["bind"]
    listener = lambda _connection: commits.append(1)  # noqa: E731
    event.listen(engine, "commit", listener)
    try:
        action()
    finally:
        event.remove(engine, "commit", listener)
    return len(commits)


class enqueue_after_commit:  # noqa: N801 - used as a context manager, like a function
    """Runs `inject` once, right after the round's commit number `point` (0: before the
    round starts), on a session of its own, as another worker would."""

    def __init__(self, world: World, point: int, inject: Callable[[], None]) -> None:
        self.world, self.point, self.inject = world, point, inject
        self.commits = 0
        self.injecting = False

    def __enter__(self) -> None:
        if self.point == 0:
            self.inject()
        event.listen(self.world.rt.sessions, "after_commit", self._after_commit)

    def __exit__(self, *exc: object) -> None:
        event.remove(self.world.rt.sessions, "after_commit", self._after_commit)

    def _after_commit(self, _session: Any) -> None:
        if self.injecting:
            return  # the injected enqueue's own commits
        self.commits += 1
        if self.commits == self.point:
            self.injecting = True
            try:
                self.inject()
            finally:
                self.injecting = False


def statements_of(world: World, action: Callable[[], object]) -> list[str]:
    """The statements `action` sent, BEGIN aside."""
    sent: list[str] = []
    engine = world.rt.sessions.kw["bind"]
    note = lambda _c, _cur, sql, *_: sent.append(sql)  # noqa: E731
    event.listen(engine, "before_cursor_execute", note)
    try:
        action()
    finally:
        event.remove(engine, "before_cursor_execute", note)
    return [sql for sql in sent if not sql.startswith("BEGIN")]
