"""A job names the prewarm sent for it (`EnqueueJob.prewarm_key`, tasks/README.md "Prewarm"): the
net held for a waiting job that names its hold comes first among the nets as warm as it; a
job that named no hint leaves a held net to its job while another as warm is free (and takes
it rather than start a cold one); jobs keep their order; the hold ends wherever its job goes.
The held net comes first only for a job that may run on it and is the one the net would
take next (no claimable job that may run there ahead of it, by priority, then age, then id).
The key is advisory: unknown, refused or ended, it enqueues all the same and gives no
preference; and it adds no statement to a claim. Through the doors: test_prewarm_doors.py."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from pydantic import ValidationError
from sqlalchemy import event, select

from app.errors import CallerKeyConflict, NetMisconfigured
from app.schemas import EnqueueJob, PrewarmNet
from app.usecases import claims, prewarm, records, views
from models import (
    ACTIVE_JOB_STATES,
    Job,
    JobState,
    Net,
    NetState,
    Prewarm,
    PrewarmOutcome,
)
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


@pytest.fixture
def pk(tmp_path, job_root, sqlite_factory, clock) -> World:
    """Three scale-to-zero nets with sites 1 and 2; net-c has site-3 only."""
    nets = [
        net_decl(tmp_path, f"net-{name}", "ecs", sites=["site-1", "site-2"]) for name in ("a", "b")
    ]
    nets.append(net_decl(tmp_path, "net-c", "ecs", sites=["site-3"], required_sites=[]))
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, PREWARM_MAX_S=900)


def ready(world: World, *names: str) -> None:
    """The nets' servers up and idle (READY), as after a job or a warm-up."""
    with world.rt.sessions.begin() as session:
        for name in names:
            net = session.get(Net, name)
            net.state = NetState.READY
            net.idle_since = world.clock()


def hold(world: World, key: str, net: str, within_s: float = 120) -> None:
    prewarm.request_prewarm(world.rt, PrewarmNet(caller_key=key, net=net, within_s=within_s))


def claim(world: World) -> tuple[uuid.UUID, str] | None:
    with world.rt.sessions.begin() as session:
        got = claims.claim_next_job(session, world.rt.settings, world.clock())
    return None if got is None else (got.job_id, got.net_name)


def job(world: World, key: str, **kw) -> uuid.UUID:
    """A queued job (sites 1 unless said: net-c cannot take it)."""
    return world.enqueue(key, **{"required_sites": ["site-1"]} | kw)  # type: ignore[return-value]


def occupy(world: World, net: str) -> uuid.UUID:
    """A job claimed onto `net` (so it is not free); call before queueing the others."""
    sites = ["site-3"] if net == "net-c" else ["site-1"]
    job_id = job(world, f"occupier-{net}", net=net, required_sites=sites)
    assert claim(world) == (job_id, net)
    return job_id


def prewarm_row(world: World, key: str) -> Prewarm:
    with world.rt.sessions() as session:
        return session.scalars(select(Prewarm).where(Prewarm.caller_key == key)).one()


# --- the payload ---------------------------------------------------------------------------

# sha256 of the canonical JSON the digest was computed from before prewarm_key existed:
# {"caller_key":"flip-model-42","definition":"fedavg-ct","max_attempts":2,
#  "metadata":{"model_id":"m-42"},"net":"net-1","priority":3,"required_sites":["site-1","site-2"]}
OLD_DIGEST = "0bf5586783df2d9ba4cee543d9d6ac95e5adce0af6eb57efcf3912bb14ae8f9f"
OLD_FIELDS = dict(
    caller_key="flip-model-42",
    definition="fedavg-ct",
    net="net-1",
    required_sites=["site-2", "site-1"],
    priority=3,
    max_attempts=2,
    metadata={"model_id": "m-42"},
)


def test_a_payload_without_prewarm_key_keeps_the_digest_jobs_were_stored_with():
    canonical = (
        '{"caller_key":"flip-model-42","definition":"fedavg-ct","max_attempts":2,'
        '"metadata":{"model_id":"m-42"},"net":"net-1","priority":3,'
        '"required_sites":["site-1","site-2"]}'
    )
    assert hashlib.sha256(canonical.encode()).hexdigest() == OLD_DIGEST
    assert EnqueueJob(**OLD_FIELDS).digest() == OLD_DIGEST  # type: ignore[arg-type]
    assert EnqueueJob(**OLD_FIELDS, prewarm_key=None).digest() == OLD_DIGEST  # type: ignore[arg-type]


def test_a_prewarm_key_counts_in_the_digest_when_set():
    with_key = EnqueueJob(**OLD_FIELDS, prewarm_key="pw-1")  # type: ignore[arg-type]
    other = EnqueueJob(**OLD_FIELDS, prewarm_key="pw-2")  # type: ignore[arg-type]
    assert len({with_key.digest(), other.digest(), OLD_DIGEST}) == 3


@pytest.mark.parametrize("bad", ["", "has space", "x" * 201])
def test_a_prewarm_key_is_checked_as_a_caller_key_is(bad):
    with pytest.raises(ValidationError, match="prewarm_key"):
        EnqueueJob(caller_key="k", definition="d", prewarm_key=bad)


def test_an_unknown_refused_or_ended_prewarm_key_enqueues_and_is_kept(pk: World):
    prewarm.refuse_prewarm(pk.rt, "pw-refused", CallerKeyConflict("no"))
    hold(pk, "pw-cancelled", "net-a")
    prewarm.cancel_prewarm(pk.rt, "pw-cancelled")
    for key in ("pw-never-sent", "pw-refused", "pw-cancelled"):
        job_id = job(pk, f"job-{key}", prewarm_key=key)
        assert views.job_view(pk.job(job_id)).prewarm_key == key


def test_a_repeat_with_the_same_prewarm_key_is_the_same_job_another_is_a_conflict(pk: World):
    first = job(pk, "job-1", prewarm_key="pw-1")
    assert job(pk, "job-1", prewarm_key="pw-1") == first
    for other in ("pw-2", None):
        with pytest.raises(CallerKeyConflict, match="differs in: prewarm_key"):
            job(pk, "job-1", prewarm_key=other)
    plain = job(pk, "job-2")
    with pytest.raises(CallerKeyConflict, match="prewarm_key"):
        job(pk, "job-2", prewarm_key="pw-1")
    assert job(pk, "job-2") == plain


# --- the claim -----------------------------------------------------------------------------


def finish(world: World, job_id: uuid.UUID) -> None:
    """The job leaves its net (aborted before it ran: the net is free at once)."""
    with world.rt.sessions.begin() as session:
        records.abort_job(session, job_id, "not needed", world.clock())


@pytest.mark.parametrize("first", ["before-the-hint", "after-the-hint", "more-urgent"])
def test_a_hint_never_puts_its_job_ahead_of_one_waiting(pk: World, first: str):
    """A held net that frees while jobs wait goes to the first of them (priority, then age):
    letting the hinted job go first made the jobs it passed wait a whole run more (the
    simulated month: 380 s)."""
    occupy(pk, "net-a")
    running = occupy(pk, "net-b")
    pk.clock.advance(1)
    if first == "before-the-hint":
        ahead = job(pk, "ahead")
    pk.clock.advance(1)
    hold(pk, "pw-h", "net-b")  # every net busy: the hint holds one still running a job
    if first == "after-the-hint":
        ahead = job(pk, "ahead")
    hinted = job(pk, "hinted", prewarm_key="pw-h")
    if first == "more-urgent":
        ahead = job(pk, "ahead", priority=1)
    finish(pk, running)
    assert claim(pk) == (ahead, "net-b")
    assert pk.job(hinted).state == JobState.QUEUED


def test_a_net_held_for_a_waiting_job_comes_before_an_unheld_one_as_warm(pk: World):
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-h", "net-b")
    hinted = job(pk, "hinted", prewarm_key="pw-h")
    assert claim(pk) == (hinted, "net-b")
    row = prewarm_row(pk, "pw-h")
    assert (row.outcome, row.job_id) == (PrewarmOutcome.USED, hinted)
    assert "net-b" in row.detail


def test_a_job_naming_no_hint_takes_an_unheld_warm_net_before_a_held_one(pk: World):
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-later", "net-a")  # its job is still to come
    plain = job(pk, "plain")
    assert claim(pk) == (plain, "net-b")
    assert prewarm_row(pk, "pw-later").outcome is None  # still held for its own job


def test_a_job_naming_no_hint_takes_a_held_warm_net_rather_than_start_a_cold_one(pk: World):
    """A caller that sends no prewarm_key may be sending the very job the net is held for:
    it meets its warm server, as before jobs named their hints."""
    ready(pk, "net-a")
    hold(pk, "flip-model-42", "net-a")
    unnamed = job(pk, "flip-model-42")
    assert claim(pk) == (unnamed, "net-a")
    assert prewarm_row(pk, "flip-model-42").job_id == unnamed


def test_a_held_net_is_still_taken_when_nothing_else_fits(pk: World):
    occupy(pk, "net-b")
    ready(pk, "net-a")
    hold(pk, "pw-later", "net-a")
    plain = job(pk, "plain")
    assert claim(pk) == (plain, "net-a")  # nothing waits for a hold
    assert prewarm_row(pk, "pw-later").outcome == PrewarmOutcome.USED


def test_a_hinted_job_whose_held_net_is_busy_runs_elsewhere_and_ends_the_hold(pk: World):
    occupy(pk, "net-b")
    hold(pk, "pw-h", "net-b")  # net-b's job is still on it
    pk.clock.advance(1)
    hinted = job(pk, "hinted", prewarm_key="pw-h")
    assert claim(pk) == (hinted, "net-a")
    row = prewarm_row(pk, "pw-h")
    assert (row.outcome, row.job_id, row.ended_at) == (PrewarmOutcome.USED, hinted, pk.clock())
    assert row.detail == f"job {hinted}, sent for it, was claimed onto net net-a"


@pytest.mark.parametrize("ended", ["cancelled", "expired"])
def test_an_ended_hold_is_not_rewritten_by_its_jobs_claim(pk: World, ended: str):
    occupy(pk, "net-b")
    pk.clock.advance(1)  # (a hold made at its claim's very moment counts as used by it)
    hold(pk, "pw-ended", "net-b", within_s=10)
    if ended == "cancelled":
        prewarm.cancel_prewarm(pk.rt, "pw-ended")
    pk.clock.advance(11 if ended == "expired" else 1)  # expired: past it, not settled yet
    late = job(pk, "late", prewarm_key="pw-ended")
    assert claim(pk) == (late, "net-a")
    row = prewarm_row(pk, "pw-ended")
    outcome = PrewarmOutcome.CANCELLED if ended == "cancelled" else None
    assert (row.outcome, row.job_id) == (outcome, None)


@pytest.mark.parametrize("key", ["cancelled", "expired", "refused", "never-sent"])
def test_an_ended_refused_or_unknown_key_gives_no_preference(pk: World, key: str):
    ready(pk, "net-a", "net-b")
    if key in ("cancelled", "expired"):
        hold(pk, f"pw-{key}", "net-a", within_s=10)
    if key == "cancelled":
        prewarm.cancel_prewarm(pk.rt, "pw-cancelled")
    if key == "refused":
        prewarm.refuse_prewarm(pk.rt, "pw-refused", NetMisconfigured("down", net_name="net-a"))
    pk.clock.advance(11)  # the expired one: past its deadline, not settled yet
    hold(pk, "pw-live", "net-a")  # for a job still to come
    named = job(pk, "named", prewarm_key=f"pw-{key}")
    assert claim(pk) == (named, "net-b")  # as for a job naming no hint
    assert prewarm_row(pk, "pw-live").outcome is None


def test_the_hinted_job_must_have_its_sites_on_the_held_net(pk: World):
    """A hint never moves a job where it cannot run: it runs elsewhere, its hold ended."""
    ready(pk, "net-a", "net-b", "net-c")
    hold(pk, "pw-c", "net-c")  # held for a job that needs site-1: a caller's mistake
    needs_site_1 = job(pk, "needs-site-1", prewarm_key="pw-c")
    assert claim(pk) == (needs_site_1, "net-a")
    assert prewarm_row(pk, "pw-c").job_id == needs_site_1


def test_a_hinted_job_pinned_elsewhere_leaves_the_held_net_last(pk: World):
    occupy(pk, "net-c")
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-h", "net-b")
    urgent = job(pk, "urgent", priority=5)
    pinned = job(pk, "pinned", net="net-a", prewarm_key="pw-h")
    assert claim(pk) == (urgent, "net-a")  # net-b is held, and its job cannot run there
    assert claim(pk) is None  # the pinned job waits for its net
    assert pk.job(pinned).state.value == "QUEUED"


def test_a_burst_never_puts_two_jobs_on_one_net(pk: World):
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-1", "net-a")
    hold(pk, "pw-2", "net-b")
    ids = [job(pk, f"job-{i}", prewarm_key=f"pw-{i % 3}", priority=i % 2) for i in range(6)]
    placed = sorted(iter(lambda: claim(pk), None), key=lambda got: got[1])
    # The jobs in their order (priority, then age), each held net first of its warmth.
    assert placed == [(ids[1], "net-a"), (ids[3], "net-b")]
    with pk.rt.sessions() as session:
        active = session.scalars(select(Job.net_name).where(Job.state.in_(ACTIVE_JOB_STATES)))
        assert sorted(active) == ["net-a", "net-b"]


def test_a_job_naming_no_prewarm_costs_its_claim_no_more_statement(pk: World):
    ready(pk, "net-a")
    plain = job(pk, "plain")
    updates: list[str] = []

    def seen(_conn, _cursor, statement, *_args) -> None:
        if statement.startswith("UPDATE prewarms"):
            updates.append(statement)

    event.listen(pk.rt.engine, "before_cursor_execute", seen)
    try:
        assert claim(pk) == (plain, "net-a")
    finally:
        event.remove(pk.rt.engine, "before_cursor_execute", seen)
    # No live hold on the net and none named: nothing to end, so no update at all (issue
    # 37; it was one, the claimed net's holds, for none). A held net's are ended (above).
    assert updates == []


def test_an_older_job_naming_no_hint_leaves_the_held_net_to_its_waiting_job(pk: World):
    """tasks/README.md: "a job that named no hint leaves a held warm server to its job while another
    warm one is free", and jobs keep their order: the older plain job goes first, to the
    unheld warm net, and the hinted job then meets its held server."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-h", "net-a")
    pk.clock.advance(1)
    plain = job(pk, "plain")
    pk.clock.advance(1)
    hinted = job(pk, "hinted", prewarm_key="pw-h")
    assert claim(pk) == (plain, "net-b")
    assert prewarm_row(pk, "pw-h").outcome is None  # still held for its job
    assert claim(pk) == (hinted, "net-a")
    row = prewarm_row(pk, "pw-h")
    assert (row.outcome, row.job_id) == (PrewarmOutcome.USED, hinted)


def test_two_jobs_with_crossed_hints_each_meet_their_own_held_net(pk: World):
    """Each job names the hold on the other's net by name order: the first job in the queue
    must not take the other job's held net and end both holds as its own."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-a", "net-a")
    hold(pk, "pw-b", "net-b")
    pk.clock.advance(1)
    first = job(pk, "first", prewarm_key="pw-b")
    pk.clock.advance(1)
    second = job(pk, "second", prewarm_key="pw-a")
    assert claim(pk) == (first, "net-b")
    assert claim(pk) == (second, "net-a")
    assert prewarm_row(pk, "pw-a").job_id == second
    assert prewarm_row(pk, "pw-b").job_id == first
    assert pk.job(second).state == JobState.ASSIGNED


def test_a_named_hold_at_its_deadlines_instant_gives_no_preference_and_stays_open(
    pk: World,
):
    """A hold is live on [created_at, hold_until): a claim at the deadline's very instant
    finds it expired, so its job gets no preference and does not end it `used` (a read or
    a settling round then finds it expired)."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b", within_s=10)
    named = job(pk, "named", prewarm_key="pw-b")
    pk.clock.now = prewarm_row(pk, "pw-b").hold_until
    assert claim(pk) == (named, "net-a")  # by name, as for a job naming no hint
    row = prewarm_row(pk, "pw-b")
    assert (row.outcome, row.job_id) == (None, None)


def test_hints_and_holds_add_no_statement_to_a_claim_that_places_nothing(pk: World):
    """A hinted job whose held net is busy, every net busy: the claim still returns after
    its one query (tests/unit/test_claim_cost.py, with holds and hints)."""
    for net in ("net-a", "net-b", "net-c"):
        occupy(pk, net)
    hold(pk, "pw-a", "net-a")
    hold(pk, "pw-b", "net-b")
    job(pk, "hinted", prewarm_key="pw-a")
    job(pk, "plain")
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    with pk.rt.sessions.begin() as session:
        session.connection()  # BEGIN before counting
        event.listen(pk.rt.engine, "before_cursor_execute", count)
        try:
            got = claims.claim_next_job(session, pk.rt.settings, pk.clock())
        finally:
            event.remove(pk.rt.engine, "before_cursor_execute", count)
    assert (got, len(statements)) == (None, 1)


def test_a_job_pinned_to_a_busy_net_is_not_ahead_of_a_hinted_job_elsewhere(pk: World):
    """Only a job that may run on the held net comes before its hinted job there: an older
    job pinned to another (busy) net leaves the held net first for its hinted job."""
    occupy(pk, "net-c")
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    pinned = job(pk, "pinned", net="net-c", required_sites=["site-3"], priority=5)
    hinted = job(pk, "hinted", prewarm_key="pw-b")
    assert claim(pk) == (hinted, "net-b")
    assert claim(pk) is None
    assert pk.job(pinned).state == JobState.QUEUED


def test_a_more_urgent_plain_job_takes_the_unheld_net_the_hinted_one_its_own(pk: World):
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-a", "net-a")
    hinted = job(pk, "hinted", prewarm_key="pw-a")
    urgent = job(pk, "urgent", priority=1)
    assert claim(pk) == (urgent, "net-b")
    assert claim(pk) == (hinted, "net-a")
    assert prewarm_row(pk, "pw-a").job_id == hinted


# --- which job a held net is first for ------------------------------------------------------


def test_a_hinted_job_pinned_to_its_held_net_meets_it_before_a_younger_plain_job(pk: World):
    """Pinned to the held net is "may run on it": the held net comes first and takes its
    job; the younger plain job would otherwise have taken the unheld net first."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    hinted = job(pk, "hinted", net="net-b", prewarm_key="pw-b")
    job(pk, "plain")
    assert claim(pk) == (hinted, "net-b")
    assert prewarm_row(pk, "pw-b").job_id == hinted


def test_a_hinted_job_pinned_elsewhere_leaves_the_held_net_to_its_unheld_peer(pk: World):
    """A job pinned to net-a that names net-b's hold does not make net-b first: net-a (no
    hold) comes first and takes the pinned job; the younger plain job is not put on the
    held net ahead of it."""
    occupy(pk, "net-c")
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    pinned = job(pk, "pinned", net="net-a", prewarm_key="pw-b")
    plain = job(pk, "plain")
    assert claim(pk) == (pinned, "net-a")
    row = prewarm_row(pk, "pw-b")
    assert (row.outcome, row.job_id) == (PrewarmOutcome.USED, pinned)
    assert claim(pk) == (plain, "net-b")


def test_an_older_job_pinned_to_the_held_net_is_ahead_of_the_hinted_job_there(pk: World):
    """The held net would take the older job pinned to it, so it is not first for the
    younger hinted job: that one goes to the unheld net (its hold ended there), and the
    pinned job then takes its own net."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    pinned = job(pk, "pinned", net="net-b")
    hinted = job(pk, "hinted", prewarm_key="pw-b")
    assert claim(pk) == (hinted, "net-a")
    assert prewarm_row(pk, "pw-b").job_id == hinted
    assert claim(pk) == (pinned, "net-b")


def test_a_job_no_longer_queued_is_not_ahead_of_the_hinted_job(pk: World):
    """Only a claimable job comes before the hinted one: an older job that already left
    (aborted) leaves the held net first for its hinted job."""
    ready(pk, "net-a", "net-b")
    gone = job(pk, "gone")
    assert claim(pk) == (gone, "net-a")
    finish(pk, gone)
    assert pk.job(gone).state == JobState.ABORTED
    hold(pk, "pw-b", "net-b")
    hinted = job(pk, "hinted", prewarm_key="pw-b")
    assert claim(pk) == (hinted, "net-b")


def test_an_older_job_of_lower_priority_is_not_ahead_of_the_hinted_job(pk: World):
    """Priority first, then age: an older but less urgent job does not keep the held net
    from its more urgent hinted job."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    older = job(pk, "older", priority=0)
    hinted = job(pk, "hinted", prewarm_key="pw-b", priority=1)
    assert claim(pk) == (hinted, "net-b")
    assert claim(pk) == (older, "net-a")


def test_a_job_enqueued_at_the_same_instant_with_a_lower_id_is_ahead_of_the_hinted_job(
    pk: World,
):
    """Same priority, same instant: the claim takes the lower id first, so the held net is
    not first for the other job; the first goes to the unheld net, and the held net stays
    for its hinted job."""
    ready(pk, "net-a", "net-b")
    start = pk.clock()
    one = job(pk, "one", prewarm_key="pw-one")
    pk.clock.now = start  # the next job gets the same created_at
    two = job(pk, "two", prewarm_key="pw-two")
    assert pk.job(one).created_at == pk.job(two).created_at
    first, second = sorted([one, two])
    hold(pk, "pw-one" if second == one else "pw-two", "net-b")  # held for the second
    assert claim(pk) == (first, "net-a")
    assert claim(pk) == (second, "net-b")
    assert prewarm_row(pk, "pw-one" if second == one else "pw-two").job_id == second


@pytest.mark.parametrize("why", ["aborted", "stray-run"])
def test_a_hinted_job_that_cannot_be_claimed_does_not_put_its_held_net_first(pk: World, why: str):
    """The job that names the hold must itself be claimable (QUEUED, no run of it that may
    still be alive): otherwise the net is held for a job still to come, and the plain job
    takes the unheld warm net, leaving the hold open."""
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-b", "net-b")
    hinted = job(pk, "hinted", prewarm_key="pw-b")
    if why == "aborted":
        finish(pk, hinted)
    else:
        pk.add_stray(hinted, "net-c", "run-1")  # its earlier run may still be alive
    plain = job(pk, "plain")
    assert claim(pk) == (plain, "net-a")
    assert prewarm_row(pk, "pw-b").outcome is None
