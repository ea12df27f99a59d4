"""A net may declare its sites (app/entrypoints/README.md "Failures and recovery", "A site a
net does not have"): a job needing one its net lacks is refused at enqueue, an unpinned job
only when no net may have its sites, and a net's default sites must be among its own; a
claim never puts a job on a net that declares it lacks one of its sites; and a site that
never connects is the job's problem, not the net's."""

from __future__ import annotations

import json

import pytest

from app.errors import InvalidRequest
from app.settings import Settings
from app.usecases import dispatch
from models import JobState, NetState
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of


def test_a_site_the_net_does_not_have_is_refused_at_enqueue(sited):
    with pytest.raises(InvalidRequest, match=r"site-99.*net-a has site-1, site-2, site-3"):
        sited.enqueue("typo", net="net-a", required_sites=["site-1", "site-99"])
    sited.enqueue("fine", net="net-a", required_sites=["site-3"])


def test_an_unpinned_job_is_refused_only_when_no_net_can_have_its_sites(tmp_path, sited):
    sited.enqueue("maybe-net-b", required_sites=["site-99"])  # net-b declares no sites
    only_declared = world_of(
        [net_decl(tmp_path, "net-a", "ecs", sites=["site-1", "site-2"])],
        tmp_path,
        sited.rt.settings.job_root,
        _fresh_factory(tmp_path),
        sited.clock,
    )
    with pytest.raises(InvalidRequest, match="no net has every site in \\['site-99'\\]"):
        only_declared.enqueue("typo", required_sites=["site-99"])


def _fresh_factory(tmp_path):
    from app.db import make_engine, session_factory
    from app.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(url)
    return session_factory(make_engine(url))


def test_declared_default_sites_must_be_among_the_nets_sites(tmp_path, job_root):
    nets = [net_decl(tmp_path, "net-a", "ecs", sites=["site-1"])]  # defaults: site-1, site-2
    with pytest.raises(Exception, match=r"required_sites.*site-2.*not among its sites"):
        Settings(JOB_ROOT=job_root, NETS=json.dumps(nets))


def test_a_site_that_never_connects_is_the_jobs_problem_not_the_nets(sited):
    world = sited
    job_id = world.enqueue("j", net="net-b", required_sites=["site-1", "site-7"])
    net, attempt = next((a.net_name, a.attempt) for a in dispatch.claim_and_start(world.rt))
    dispatch.scale_up(world.rt, job_id, net, attempt)
    world.clock.advance(121)
    result = dispatch.check_ready(world.rt, job_id, net, attempt)
    assert result.step == dispatch.Step.GAVE_UP
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 1)
    assert "site-7" in (job.last_error or "")
    assert result.detail == job.last_error  # the step says why, as the job does
    net_row = world.net("net-b")
    assert net_row.state == NetState.READY  # healthy: left to its idle grace,
    assert net_row.idle_since == world.clock()  # which starts now
    assert world.driver("net-b").replicas == 1


def test_an_unpinned_job_is_never_claimed_by_a_net_that_declares_it_lacks_its_sites(sited):
    """net-a declares its sites (site-1..3); net-b declares none. An unpinned job needing
    site-99 is accepted at enqueue (net-b may have it), but the claim ignores declared sites:
    net-a takes it, waits out ready_timeout_s for a site it declared it does not have, gives
    up "on sites" and stays READY, so the warm-first claim hands the job straight back to
    net-a. After max_attempts the job is FAILED without net-b ever being tried.

    Breaks: "a net may declare its `sites` and a job needing one it lacks is refused" (the
    claim must not do what enqueue refuses) and "refuse valid input / accept input that
    later fails": a job accepted because net-b may run it is failed on net-a alone."""
    world = sited
    job_id = world.enqueue("needs-site-99", required_sites=["site-99"])
    tried = []
    for _ in range(world.job(job_id).max_attempts):
        claims = [a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id]
        if not claims:
            break
        net, attempt = claims[0].net_name, claims[0].attempt
        tried.append(net)
        dispatch.scale_up(world.rt, job_id, net, attempt)
        world.clock.advance(121)
        dispatch.check_ready(world.rt, job_id, net, attempt)
    assert "net-a" not in tried, (tried, world.job(job_id).state, world.job(job_id).last_error)
