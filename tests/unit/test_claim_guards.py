"""Which nets a QUEUED job wants: only claimable jobs pin a net; an idle net is kept only
for a queued job it could take (pinned to it or unpinned, with sites it has where it declares
them); a claim looks through a net's next SITES_SCAN queued jobs for one that fits; and a
QUEUED job says why it waits (its net out of service, an earlier run of it not settled)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.usecases import claims, dispatch, records
from models import JobState, Net, NetState


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


def test_a_claim_looks_through_a_nets_next_sites_scan_queued_jobs_only(sited):
    """app/entrypoints/README.md: "a claim looks through the net's next 50 QUEUED jobs for
    one that fits". A job net-a could run behind SITES_SCAN it cannot waits, until the queue
    ahead of it shrinks."""
    with sited.rt.sessions.begin() as session:  # only net-a can claim
        records.get_net(session, "net-b").state = NetState.MISCONFIGURED
    ahead = [
        sited.enqueue(f"lacking-{i}", required_sites=["site-9"]) for i in range(claims.SITES_SCAN)
    ]
    behind = sited.enqueue("fits", required_sites=["site-1"])
    assert dispatch.claim_and_start(sited.rt) == []
    sited.abort(ahead[0])
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
