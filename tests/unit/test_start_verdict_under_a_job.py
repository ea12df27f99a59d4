"""Round 12's break-it of the verdict a worker start keeps on a net under a job
(`nets.misconfigured_after_job`, 0.3.1): the promise is that a net whose files name another
server is MISCONFIGURED with its jobs QUEUED, and that a net running a job when the worker
starts finishes that job first and goes MISCONFIGURED the moment the job lets it go.

Each test here was a way the promise broke on b65dd99, a strict xfail until fixed: a job
only claimed is requeued at the start (its attempt kept), the kept verdict shows as the
net's `last_error`, and the monitor asks nothing of a server the files do not reach.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.adapters import net_check
from app.celery_app import prepare_nets_at_start
from app.usecases import dispatch, monitor, reconciler, records, views
from models import ACTIVE_JOB_STATES, JobState, NetState
from tests.fakes import FakeAdmin, FakeServer

pytestmark = pytest.mark.unit

FOREIGN = "admin kit dials other-host:8003, but net net-a's server serves on net-a:8003"


def _net_a_dials_another_server(net: Any, _settings: Any, **_kw: Any) -> str | None:
    return FOREIGN if net.name == "net-a" else None


def _start_with_wrong_files(world: Any, sqlite_url: str, monkeypatch: Any) -> None:
    """A worker starts whose admin kit for net-a names another server."""
    monkeypatch.setattr(net_check, "endpoint_problem", _net_a_dials_another_server)
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))


def _claimed(world: Any, key: str) -> tuple[Any, int]:
    job_id = world.enqueue(key, net="net-a")
    assignment = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    return job_id, assignment.attempt


def _admin_reaches_another_server(world: Any, monkeypatch: Any) -> None:
    """What the started worker's admin for net-a reaches with that kit: another server (one
    that answers and knows no such run; one that does not answer ends the same way after
    SERVER_LOST_GRACE_S)."""
    other = FakeServer()
    world.rt.forget_admin("net-a")
    real_factory = world.rt.admin_factory

    def admin(net: Any, settings: Any) -> Any:
        return FakeAdmin(other) if net.name == "net-a" else real_factory(net, settings)

    monkeypatch.setattr(world.rt, "admin_factory", admin)


def test_a_job_only_claimed_when_the_start_finds_the_files_wrong_is_not_submitted(
    world, sqlite_url, monkeypatch
):
    job_id, attempt = _claimed(world, "claimed")
    assert (world.job(job_id).state, world.net("net-a").state) == (
        JobState.ASSIGNED,
        NetState.STARTING,
    )
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    # The chain's steps, as its messages deliver them after the start.
    dispatch.scale_up(world.rt, job_id, "net-a", attempt)
    dispatch.check_ready(world.rt, job_id, "net-a", attempt)
    dispatch.dispatch(world.rt, job_id, "net-a", attempt)
    # On main: RUNNING on net-a, its submit made with the wrong kit (nv-1), net BUSY.
    assert world.server("net-a").submitted == {}
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)
    assert (world.net("net-a").state, world.net("net-a").last_error) == (
        NetState.MISCONFIGURED,
        FOREIGN,
    )


def test_the_verdict_reason_survives_a_readiness_deadline_under_it(world, sqlite_url, monkeypatch):
    job_id, attempt = _claimed(world, "claimed")
    dispatch.scale_up(world.rt, job_id, "net-a", attempt)
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    # The kit dials a server that never answers as net-a's: readiness times out.
    world.server("net-a").up = False
    world.clock.advance(121)
    dispatch.check_ready(world.rt, job_id, "net-a", attempt)
    net = world.net("net-a")
    # On main: MISCONFIGURED with last_error "not ready after 120s: down", attempts 1.
    assert (net.state, net.last_error) == (NetState.MISCONFIGURED, FOREIGN)
    assert (world.job(job_id).state, world.job(job_id).attempts) == (JobState.QUEUED, 0)


def test_the_pending_verdict_is_visible_on_the_status_read(world, sqlite_url, monkeypatch):
    job_id = world.enqueue("running", net="net-a")
    world.run_pipeline(job_id)
    assert world.job(job_id).state == JobState.RUNNING
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    assert world.net("net-a").misconfigured_after_job == FOREIGN  # kept on the row: right
    status = views.collect_status(world.rt, None, 1.0)
    net_a = next(n for n in status.nets if n.name == "net-a")
    # On main: {"state": "BUSY", "last_error": null, ...}, no word of the verdict.
    assert FOREIGN in net_a.model_dump_json()


def test_a_run_under_a_kept_verdict_is_not_lost_through_the_wrong_kit(
    world, sqlite_url, monkeypatch
):
    job_id = world.enqueue("running", net="net-a")
    world.run_pipeline(job_id)
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    _admin_reaches_another_server(world, monkeypatch)
    monitor.monitor_running_jobs(world.rt)
    # On main: QUEUED (attempts 1), a stray kept, net-a MISCONFIGURED and scaled to 0 while
    # nv-1 still ran on net-a's own server.
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.RUNNING, 0)
    assert world.driver("net-a").replicas == 1
    with world.rt.sessions() as session:
        assert records.active_job(session, "net-a") is not None


def test_no_second_live_run_when_an_always_on_net_is_watched_through_the_wrong_kit(
    always_on, sqlite_url, monkeypatch
):
    world = always_on
    reconciler.reconcile(world.rt)  # the always-on servers are READY
    blocker = world.enqueue("blocker", net="fixed")
    world.run_pipeline(blocker)
    job_id = world.enqueue("moves", required_sites=["site-1"])  # may run on either net
    world.run_pipeline(job_id)
    assert world.job(job_id).net_name == "net-a"
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    _admin_reaches_another_server(world, monkeypatch)
    monitor.monitor_running_jobs(world.rt)
    world.complete(blocker)
    for _ in range(3):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)  # settles the stray through the wrong kit
        dispatch.claim_and_start(world.rt)
    first_run_live = world.server("net-a").statuses.get("nv-1") == "RUNNING"
    job = world.job(job_id)
    # On main: nv-1 RUNNING on net-a's server and the job ASSIGNED on `fixed`.
    assert not (first_run_live and job.state in ACTIVE_JOB_STATES and job.net_name != "net-a")
