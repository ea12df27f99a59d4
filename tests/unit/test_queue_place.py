"""A QUEUED job's place in line and waiting reason (issue 40, app/usecases/queue_place.py), as
`GET /jobs/{id}` and `job --json` show them: the claim's own order (fair share), counting only
the jobs a claim may take that may run on one of its nets; the first reason that holds. Read
in two statements."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from app.schemas import PrewarmNet, job_id_for
from app.usecases import drains, prewarm, queue_place
from app.usecases.views import job_detail
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of
from tests.unit.test_fair_share import claim, end, enqueue, fair_world


@pytest.fixture
def two_nets_world(tmp_path, job_root, sqlite_factory, clock) -> World:
    return fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1", "net-2"])


def shown(world: World, key: str) -> tuple[int | None, str | None]:
    """(place_in_line, waiting_reason) of the job, as GET /jobs/{id} shows them."""
    with world.rt.sessions() as session:
        view = job_detail(session, job_id_for(key), settings=world.rt.settings, now=world.clock())
    return view.place_in_line, view.waiting_reason


def test_the_line_is_the_claims_fair_share_order(tmp_path, job_root, sqlite_factory, clock):
    world = fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1", "net-2"])
    for key in ("a0", "a1", "a2", "a3"):
        enqueue(world, key, "a")
    assert [claim(world), claim(world)] == [("a0", "net-1"), ("a1", "net-2")]
    enqueue(world, "b0", "b")
    enqueue(world, "b1", "b", priority=5)
    # a holds two nets, b none: b's jobs first (b1 by priority), then a's by age.
    lines = {key: shown(world, key) for key in ("a2", "a3", "b0", "b1")}
    assert lines == {
        "b1": (1, "no free net"),
        "b0": (2, "no free net"),
        "a2": (3, "no free net"),
        "a3": (4, "no free net"),
    }
    end(world, "a0")
    assert shown(world, "b1") == (1, "claim pending")
    assert shown(world, "a3") == (4, "claim pending")
    assert claim(world) == ("b1", "net-1")
    assert shown(world, "b1") == (None, None)  # ASSIGNED: no longer in line
    # one net each now: a2 is older than b0, a3 too
    assert [shown(world, k)[0] for k in ("a2", "a3", "b0")] == [1, 2, 3]


def test_a_pinned_job_counts_only_the_jobs_that_may_take_its_net(two_nets_world):
    world = two_nets_world
    enqueue(world, "busy-1", net="net-1")
    enqueue(world, "busy-2", net="net-2")
    assert {claim(world), claim(world)} == {("busy-1", "net-1"), ("busy-2", "net-2")}
    enqueue(world, "for-2", net="net-2")
    enqueue(world, "anywhere")
    enqueue(world, "for-1", net="net-1")
    assert shown(world, "for-1") == (2, "no free net")  # "anywhere" may take net-1 too
    assert shown(world, "for-2") == (1, "no free net")
    assert shown(world, "anywhere") == (2, "no free net")


def capped_world(tmp_path, job_root, sqlite_factory, clock) -> World:
    """Two nets; project a may hold one of them (max_nets 1)."""
    return fair_world(
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        ["net-1", "net-2"],
        PROJECT_SHARES='{"a": {"max_nets": 1}}',
    )


def test_a_capped_projects_jobs_say_so_and_are_counted_ahead_of_no_one(
    tmp_path, job_root, sqlite_factory, clock
):
    world = capped_world(tmp_path, job_root, sqlite_factory, clock)
    enqueue(world, "a0", "a")
    enqueue(world, "a1", "a")
    enqueue(world, "b0", "b")
    assert claim(world) == ("a0", "net-1")
    # a1 is older than b0 and a holds one net (b none): b0 first anyway; a1 waits its cap.
    assert shown(world, "a1") == (2, "project at its cap")
    assert shown(world, "b0") == (1, "claim pending")
    assert claim(world) == ("b0", "net-2")
    end(world, "b0")
    assert shown(world, "a1") == (1, "project at its cap")  # net-2 free, a holds its one


def test_a_capped_projects_own_older_jobs_stay_ahead_of_it(
    tmp_path, job_root, sqlite_factory, clock
):
    """The place of a job whose project is at its cap is the one it would have once the cap
    frees: its project's older jobs are still ahead of it (counted ahead of no one else, they
    are ahead of their own project's younger jobs); both showed 1 before, and the claim, once
    the cap freed, took a1 and left a2 second."""
    world = capped_world(tmp_path, job_root, sqlite_factory, clock)
    for key in ("a0", "a1", "a2"):
        enqueue(world, key, "a")
    assert claim(world) == ("a0", "net-1")
    assert [shown(world, k) for k in ("a1", "a2")] == [
        (1, "project at its cap"),
        (2, "project at its cap"),
    ]
    end(world, "a0")
    assert [shown(world, k) for k in ("a1", "a2")] == [(1, "claim pending"), (2, "claim pending")]
    assert claim(world) == ("a1", "net-1")


def test_a_job_whose_earlier_run_is_settling_says_so(two_nets_world):
    world = two_nets_world
    job = enqueue(world, "settling")
    world.add_stray(job, "net-1", "run-1")
    assert shown(world, "settling") == (1, "earlier run settling")


def test_a_job_every_net_of_which_is_drained_says_net_drained(two_nets_world):
    world = two_nets_world
    enqueue(world, "waits", net="net-2")
    drains.drain(world.rt, ["net-2"])
    assert shown(world, "waits") == (1, "net drained")
    enqueue(world, "anywhere")
    # net-1 is free; "waits", older, may take only net-2, drained: not ahead of it.
    assert shown(world, "anywhere") == (1, "claim pending")


def test_an_aged_job_is_first_in_line(tmp_path, job_root, sqlite_factory, clock):
    world = fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1"], AGING_S=600)
    enqueue(world, "a-busy", "a")
    assert claim(world) == ("a-busy", "net-1")
    enqueue(world, "a-old", "a")
    enqueue(world, "b-new", "b", priority=9)
    assert shown(world, "a-old") == (2, "no free net")
    clock.advance(600)
    assert shown(world, "a-old") == (1, "no free net")


def test_the_place_and_reason_are_two_statements_where_nets_declare_sites_too(
    tmp_path, job_root, sqlite_factory, clock
):
    nets = [
        net_decl(tmp_path, "plain", "ecs"),
        net_decl(tmp_path, "sited", "ecs", sites=["site-1", "site-2", "site-3"]),
    ]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    enqueue(world, "first", net="plain")
    enqueue(world, "second", net="plain")
    enqueue(world, "third", net="sited")

    def statements(key: str) -> tuple[queue_place.QueuePlace, int]:
        seen: list[str] = []

        def count(_conn, _cursor, statement, *_args) -> None:
            seen.append(statement)

        engine = world.rt.engine
        with world.rt.sessions() as session:
            job = session.get(queue_place.Job, job_id_for(key))
            assert job is not None and job.state == JobState.QUEUED
            event.listen(engine, "before_cursor_execute", count)
            try:
                found = queue_place.queue_place(session, job, world.rt.settings, world.clock())
            finally:
                event.remove(engine, "before_cursor_execute", count)
        return found, len(seen)

    assert statements("second") == (queue_place.QueuePlace(2, "claim pending"), 2)
    assert statements("third") == (queue_place.QueuePlace(1, "claim pending"), 2)


def test_jobs_of_one_shape_ahead_on_a_sited_net_are_each_counted(
    tmp_path, job_root, sqlite_factory, clock
):
    """Where a net declares its sites the jobs ahead are counted by their pin and sites (a
    row per shape, not per job): three of one shape and one of another, all fitting, are
    four ahead; a shape that fits none of the job's nets counts none."""
    nets = [
        net_decl(tmp_path, "sited", "ecs", sites=["site-1", "site-2", "site-3"]),
        net_decl(tmp_path, "other", "ecs", sites=["site-1", "site-2", "site-9"]),
    ]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    for n in range(3):
        enqueue(world, f"same-{n}", net=None, required_sites=["site-3"])
    enqueue(world, "pinned", net="sited")
    enqueue(world, "elsewhere", net=None, required_sites=["site-9"])  # fits only "other"
    enqueue(world, "mine", net=None, required_sites=["site-3"])
    assert shown(world, "mine") == (5, "claim pending")


@pytest.mark.parametrize("hinted", ["none yet", "behind", "ahead"])
def test_a_net_held_by_a_prewarm_is_no_reason_to_wait(two_nets_world, hinted):
    """A job whose one free net is held by a live prewarm, for a job still to come or for
    another waiting job that names it, is not kept from it: the next claim gives the held net
    to it or to the job ahead of it, so its reason is `claim pending`, not a hold (the module
    says why none is shown). A reason "held by a prewarm" here would tell flip-api the job
    waits for the hold's deadline while it is claimed at once."""
    world = two_nets_world
    enqueue(world, "busy", net="net-1")
    assert claim(world) == ("busy", "net-1")
    prewarm.request_prewarm(world.rt, PrewarmNet(caller_key="pw-h", net="net-2", within_s=600))
    if hinted == "ahead":
        enqueue(world, "hinted", prewarm_key="pw-h")
    enqueue(world, "plain")
    if hinted == "behind":
        enqueue(world, "hinted", prewarm_key="pw-h")
    first = "hinted" if hinted == "ahead" else "plain"
    assert shown(world, "plain") == (2 if hinted == "ahead" else 1, "claim pending")
    assert claim(world) == (first, "net-2")  # the held net, to the first in line
    if hinted != "none yet":
        other = "plain" if first == "hinted" else "hinted"
        assert shown(world, other) == (1, "no free net")


def test_a_job_no_declared_net_fits_says_so(tmp_path, job_root, sqlite_factory, clock):
    """A redeploy edited the only net with the job's sites (no net removed): no declared net
    may run it, and it read "no free net", as if a net would free. It says so."""
    before = [net_decl(tmp_path, "net-1", sites=["site-1", "site-2", "site-9"])]
    world = world_of(before, tmp_path, job_root, sqlite_factory, clock)
    world.enqueue("needs-9", net=None, required_sites=["site-9"])
    after = [net_decl(tmp_path, "net-1", sites=["site-1", "site-2"])]
    edited = world_of(after, tmp_path, job_root, sqlite_factory, clock)
    assert shown(edited, "needs-9") == (1, "no declared net fits it")
