"""Which nets a QUEUED job wants: only claimable jobs pin a net; an idle net is kept only
for a queued job it could take (pinned to it or unpinned, with sites it has where it declares
them); a claim finds the first queued job that fits a net however many wait before it; and a
QUEUED job says why it waits (its net out of service, an earlier run of it not settled)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, select

from app.usecases import claims, dispatch, records
from models import JobState, Net, NetState
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of


def _wanted(world) -> set[str]:
    with world.rt.sessions() as session:
        return set(session.scalars(select(Net.name).where(claims.wanted_by_queued_job(Net.name))))


def test_a_net_pinned_only_by_finished_jobs_is_not_wanted(world):
    """A job that ran on net-a and ended leaves net-a wanted by nobody."""
    job_id = world.enqueue("done", net="net-a")
    world.run_pipeline(job_id)
    world.abort(job_id)
    assert _wanted(world) == set()


def test_a_queued_pinned_job_wants_its_net_only(world):
    """A QUEUED job pinned to net-a wants net-a and not the other net."""
    world.enqueue("pinned", net="net-a")
    assert _wanted(world) == {"net-a"}


@pytest.mark.parametrize(
    ("job", "net", "fits"),
    [
        ({"required_sites": ["site-1"]}, "net-a", True),
        ({"required_sites": ["site-9"]}, "net-a", False),
        ({"required_sites": ["site-9"]}, "net-b", True),
        ({"net": "net-a", "required_sites": ["site-1"]}, "net-a", True),
        ({"net": "net-b", "required_sites": ["site-1"]}, "net-a", False),
    ],
    ids=[
        "unpinned, sites it has",
        "unpinned, a site it declares it lacks",
        "unpinned, on a net that declares no sites",
        "pinned to it",
        "pinned to the other net",
    ],
)
def test_an_idle_net_is_kept_only_for_a_queued_job_it_could_take(sited, job, net, fits):
    """net-a declares site-1..3, net-b declares none (queued_job_fits, the idle check's
    question before it stops a net)."""
    sited.enqueue("waiting", **job)
    with sited.rt.sessions() as session:
        assert claims.queued_job_fits(session, sited.rt.settings, net) is fits


# More jobs before the one that fits than the claim once looked through (50).
AHEAD = 60


def test_a_claim_gives_a_net_the_first_job_that_fits_it_however_many_wait_before_it(sited):
    """app/usecases/README.md: a claim gives a free net "the first job of this order among the
    QUEUED jobs that may run on it". A job net-a can run behind AHEAD it cannot (they need a
    site it lacks) is claimed at once (a claim once looked through 50 only: it waited until
    the queue ahead shrank, while the idle check kept net-a's server up for it)."""
    with sited.rt.sessions.begin() as session:  # only net-a can claim
        records.get_net(session, "net-b").state = NetState.MISCONFIGURED
    for i in range(AHEAD):
        sited.enqueue(f"lacking-{i}", required_sites=["site-9"])
    behind = sited.enqueue("fits", required_sites=["site-1"])
    assert [a.job_id for a in dispatch.claim_and_start(sited.rt)] == [behind]
    assert sited.job(behind).state == JobState.ASSIGNED


def test_a_queued_job_says_why_it_waits(world):
    from app.usecases.scaling import net_misconfigured
    from app.usecases.views import job_detail

    pinned = world.enqueue("pinned", net="net-a")
    net_misconfigured(world.rt, "net-a", None, "admin kit signed by another CA")
    strayed = world.enqueue("strayed", net="fixed")
    world.add_stray(strayed, "fixed", "nv-9")
    free = world.enqueue("free", net="fixed")
    with world.rt.sessions() as session:
        assert job_detail(session, pinned).waiting_for == (
            "net net-a is MISCONFIGURED: admin kit signed by another CA"
        )
        assert job_detail(session, strayed).waiting_for.startswith(
            "an earlier run of it on net fixed is not settled yet"
        )
        assert job_detail(session, free).waiting_for is None


def test_a_net_no_queued_job_fits_passes_the_claim_to_the_next_net(sited):
    """net-a (site-1..3) is wanted by no job it can run (they all need site-9): the claim
    goes on to net-b, which declares no sites and takes the first of them."""
    ahead = [sited.enqueue(f"lacking-{i}", required_sites=["site-9"]) for i in range(AHEAD)]
    with sited.rt.sessions.begin() as session:
        claimed = claims.claim_next_job(session, sited.rt.settings, sited.clock())
    assert claimed is not None
    assert (claimed.net_name, str(claimed.job_id)) == ("net-b", str(ahead[0]))


def test_a_net_takes_the_job_that_fits_it_behind_jobs_the_next_net_takes(sited):
    """net-a first: it takes the first job that fits it (behind AHEAD it cannot run), and
    the next claim gives net-b the first of the queue."""
    ahead = [sited.enqueue(f"lacking-{i}", required_sites=["site-9"]) for i in range(AHEAD)]
    fits = sited.enqueue("fits", required_sites=["site-1"])
    claimed = []
    for _ in range(2):
        with sited.rt.sessions.begin() as session:
            one = claims.claim_next_job(session, sited.rt.settings, sited.clock())
            assert one is not None
            claimed.append((one.net_name, str(one.job_id)))
    assert sorted(claimed) == [("net-a", str(fits)), ("net-b", str(ahead[0]))]


def test_a_net_taken_by_a_concurrent_claim_before_its_lock_passes_the_claim_to_the_next(sited):
    """Between the claim's read of the free nets and its lock of the first (net-a), a
    concurrent claim takes net-a (on PostgreSQL its lock makes SKIP LOCKED pass the row;
    staged here by that claim's move, written at that moment): the job goes to net-b."""
    job_id = sited.enqueue("j", required_sites=["site-1"])
    engine = sited.rt.sessions.kw["bind"]
    taken: list[str] = []

    def take_net_a(_conn: Any, cursor: Any, sql: str, params: Any, *_: Any) -> None:
        if not taken and sql.startswith("SELECT nets.") and "net-a" in tuple(params):
            cursor.connection.execute("UPDATE nets SET state = 'BUSY' WHERE name = 'net-a'")
            taken.append(sql)

    event.listen(engine, "before_cursor_execute", take_net_a)
    try:
        with sited.rt.sessions.begin() as session:
            claimed = claims.claim_next_job(session, sited.rt.settings, sited.clock())
    finally:
        event.remove(engine, "before_cursor_execute", take_net_a)
    assert taken
    assert claimed is not None
    assert (claimed.net_name, str(claimed.job_id)) == ("net-b", str(job_id))


def test_of_nets_as_warm_as_each_other_the_claim_takes_the_first_by_name(
    tmp_path, job_root, sqlite_factory, clock
):
    """The free nets' order ends with the name: which of two cold nets a job goes to does not
    depend on the order the rows were written in (net-z's first here)."""
    nets = [net_decl(tmp_path, name, "ecs") for name in ("net-z", "net-y", "net-a", "net-m")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    job_id = world.enqueue("j", required_sites=["site-1"])
    with world.rt.sessions.begin() as session:
        claimed = claims.claim_next_job(session, world.rt.settings, world.clock())
    assert claimed is not None
    assert (claimed.net_name, str(claimed.job_id)) == ("net-a", str(job_id))


def test_a_claim_round_takes_at_most_50_jobs_and_the_next_round_the_rest(
    tmp_path, job_root, sqlite_factory, clock
):
    """One claim_and_start is bounded (a transaction per claim): of 51 jobs that 51 free nets
    could take, it claims 50; the next round claims the 51st."""
    nets = [net_decl(tmp_path, f"net-{i:02}", "ecs") for i in range(51)]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    for i in range(51):
        world.enqueue(f"j-{i}", required_sites=["site-1"])
    assert len(dispatch.claim_and_start(world.rt)) == 50
    assert len(dispatch.claim_and_start(world.rt)) == 1
