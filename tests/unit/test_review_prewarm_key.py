"""Adversarial review of `EnqueueJob.prewarm_key` (README "Prewarm"): each test pins a
promise the change could break."""

from __future__ import annotations

from sqlalchemy import event

from app.sim.faults import CLEAN
from app.sim.simulation import Simulation
from app.sim.workload import JobSpec, NetSpec, PrewarmSpec, Workload, WorldSpec
from app.usecases import claims
from models import JobState, PrewarmOutcome
from tests.sim.invariants import Checker
from tests.unit.conftest import World
from tests.unit.test_prewarm_key import claim, hold, job, occupy, pk, prewarm_row, ready

__all__ = ["pk"]  # the fixture, used by name


def test_review_an_older_job_naming_no_hint_leaves_the_held_net_to_its_waiting_job(pk: World):
    """README: "a job that named no hint leaves a held warm server to its job while another
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


def test_review_two_jobs_with_crossed_hints_each_meet_their_own_held_net(pk: World):
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


def test_review_a_named_hold_at_its_deadlines_instant_gives_no_preference_and_stays_open(
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


def test_review_hints_and_holds_add_no_statement_to_a_claim_that_places_nothing(pk: World):
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
            got = claims.assign_next_job(session, pk.rt.settings, pk.clock())
        finally:
            event.remove(pk.rt.engine, "before_cursor_execute", count)
    assert (got, len(statements)) == (None, 1)


def test_review_a_job_pinned_to_a_busy_net_is_not_ahead_of_a_hinted_job_elsewhere(pk: World):
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


def test_review_a_more_urgent_plain_job_takes_the_unheld_net_the_hinted_one_its_own(pk: World):
    ready(pk, "net-a", "net-b")
    hold(pk, "pw-a", "net-a")
    hinted = job(pk, "hinted", prewarm_key="pw-a")
    urgent = job(pk, "urgent", priority=1)
    assert claim(pk) == (urgent, "net-b")
    assert claim(pk) == (hinted, "net-a")
    assert prewarm_row(pk, "pw-a").job_id == hinted


def test_review_the_sweep_accepts_a_hold_its_job_ended_from_another_net():
    """README: a hold ends `used` "when the job that names it (`prewarm_key`) is claimed onto
    another net". The sweep's `prewarm-used-by-later-claim` must accept that use: here the
    held net is busy when the hinted job comes, so it runs on the other net."""
    world = WorldSpec(nets=(NetSpec("net-a"), NetSpec("net-b")))
    jobs = (
        JobSpec("long", 1.0, duration_s=120.0, net="net-a"),
        JobSpec("hinted", 40.0, duration_s=20.0, prewarm_key="pw-h"),
    )
    hint = PrewarmSpec(20.0, "pw-h", 300.0, net="net-a")  # net-a runs "long" meanwhile
    sim = Simulation(world, Workload(jobs=jobs, prewarms=(hint,)), CLEAN, 0, checker=Checker())
    result, used = sim.run_then(
        lambda s: s.conn.execute(
            "SELECT p.outcome, j.net_name FROM prewarms p JOIN jobs j ON j.id = p.job_id"
        ).fetchall()
    )
    assert used == [("used", "net-b")]
    assert result.violations == []
