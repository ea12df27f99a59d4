"""A second break-it review of round 12 (0.3.1): the verdict a worker start keeps on a net
under a job (`nets.misconfigured_after_job`), the Flower strays' settling rest, and the
worker start's requeue. Each test was a way the promise (README's FlDispatcherNetMisconfigured
row, CHANGELOG 0.3.1, app/usecases/README.md) broke on b0f654a, a strict xfail until fixed:
a process whose start found a net's files wrong sends nothing through them
(`net_check.RefusingAdmin`), the monitor counts no grace across the fix, and a stray dated
after the stop counts only recent settling starts. One is open, a strict xfail: the start's
requeue waits for beat's next assign round.

The files a start finds wrong name another server; what the workers' clients then reach is
that server, which may answer (another project's, another net's). The monitor asks nothing
of it for a RUNNING job, but other paths still do, and the verdict's grace and the rest's
clock have edges of their own."""

from __future__ import annotations

from typing import Any
from unittest.mock import ANY

import pytest

from app.adapters import net_check
from app.celery_app import prepare_nets_at_start
from app.errors import AdminMisconfigured, ServerUnavailable
from app.usecases import dispatch, monitor, reconciler, scaling
from models import ACTIVE_JOB_STATES, JobState, NetState
from tests.fakes import FakeAdmin, FakeServer
from tests.unit.conftest import World, world_of
from tests.unit.test_flower_stray_settling import _rounds
from tests.unit.test_revived_strays import _flower, _strays
from tests.unit.test_revived_strays import _world as _flower_world
from tests.unit.test_start_verdict_under_a_job import FOREIGN, _start_with_wrong_files

pytestmark = pytest.mark.unit


def _start(world: World, sqlite_url: str, monkeypatch: Any, wrong: dict[str, str]) -> None:
    """A worker starts whose files for the nets in `wrong` (name -> why) name another server
    (none: every net's files are right, the human's fix)."""
    monkeypatch.setattr(net_check, "endpoint_problem", lambda net, _s, **_k: wrong.get(net.name))
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))


def _clients_reach(world: World, monkeypatch: Any, net: str, server: FakeServer) -> None:
    """What the workers' clients of `net` reach with the wrong files: `server`."""
    world.rt.forget_admin(net)
    real = world.rt.admin_factory
    monkeypatch.setattr(
        world.rt,
        "admin_factory",
        lambda n, s: FakeAdmin(server) if n.name == net else real(n, s),
    )


def test_a_finishing_flower_net_under_a_verdict_stops_no_run_of_another_net(
    tmp_path, job_root, sqlite_factory, clock, sqlite_url, monkeypatch
) -> None:
    """fl-a's job ended and is held FINISHING for flip-api's report; a redeploy gives fl-a a
    certificate naming fl-b's SuperLink (the start keeps the verdict: a job holds fl-a).
    The monitor asks nothing of a RUNNING job's net under a verdict, but its stop of the
    runs no job counts still covers a FINISHING net: it lists fl-b's runs as fl-a's, and
    stops fl-b's job's run, which no job on fl-a counts."""
    nets = [_flower(tmp_path, "fl-a"), _flower(tmp_path, "fl-b")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, RELEASE_AFTER="reported")
    world.server("fl-b").submitted["earlier"] = "nv-1"  # run ids differ between the two
    world.server("fl-b").statuses["nv-1"] = "FINISHED:COMPLETED"
    held = world.enqueue("a", net="fl-a")
    world.run_pipeline(held)
    counted = world.enqueue("b", net="fl-b")
    world.run_pipeline(counted)
    world.server("fl-a").statuses[str(world.job(held).nvflare_job_id)] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(held).state == JobState.FINISHING
    _start(world, sqlite_url, monkeypatch, {"fl-a": "certificate names fl-b.superlink"})
    assert world.net("fl-a").misconfigured_after_job is not None
    _clients_reach(world, monkeypatch, "fl-a", world.server("fl-b"))
    clock.advance(30)
    monitor.monitor_running_jobs(world.rt)
    run = str(world.job(counted).nvflare_job_id)
    # On b0f654a: fl-b's run reads FINISHED:ABORTED, stopped through fl-a's files.
    assert world.server("fl-b").statuses[run] == "RUNNING"


def test_a_run_lost_to_a_verdict_on_an_always_on_net_does_not_run_twice(
    always_on, sqlite_url, monkeypatch
) -> None:
    """The verdict's run is settled by LOST_JOB_POLICY (requeue) past SERVER_LOST_GRACE_S and
    kept as a stray; but the run lives on the always-on server the files do not reach.
    Reconcile settles the stray by asking the server the files reach, which knows no such
    run: the stray is forgotten, and the job is claimed onto the other net while its first
    run still trains (one live run per job)."""
    world = always_on
    reconciler.reconcile(world.rt)  # the always-on servers are READY
    job_id = world.enqueue("moves", required_sites=["site-1"])  # may run on either net
    world.run_pipeline(job_id)
    first = world.job(job_id).net_name
    _start(world, sqlite_url, monkeypatch, {first: FOREIGN})
    _clients_reach(world, monkeypatch, first, FakeServer())
    for _ in range(8):
        world.clock.advance(30)
        monitor.monitor_running_jobs(world.rt)
        reconciler.reconcile(world.rt)
        dispatch.claim_and_start(world.rt)
    job = world.job(job_id)
    first_run_live = world.server(first).statuses.get("nv-1") == "RUNNING"
    # On b0f654a: nv-1 RUNNING on the first net's server, the job ASSIGNED on the other.
    assert not (first_run_live and job.state in ACTIVE_JOB_STATES and job.net_name != first)


def test_an_abort_under_a_verdict_leaves_no_live_run_beside_the_next_job(
    always_on, sqlite_url, monkeypatch
) -> None:
    """flip-api aborts a job on an always-on net under a verdict. The abort goes through the
    files the start found wrong; the server they reach knows no such run ("nothing to
    abort"), so the job is ABORTED and no stray kept, while the run trains on net-a's own
    server. The human fixes the files and restarts: net-a takes the next job beside it."""
    world = always_on
    reconciler.reconcile(world.rt)
    job_id = world.enqueue("a", net="net-a")
    world.run_pipeline(job_id)
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    other = FakeServer()
    _clients_reach(world, monkeypatch, "net-a", other)
    world.abort(job_id)
    for _ in range(4):
        world.clock.advance(30)
        monitor.monitor_running_jobs(world.rt)
        reconciler.reconcile(world.rt)
    _start(world, sqlite_url, monkeypatch, {})  # fixed, and the workers restarted
    _clients_reach(world, monkeypatch, "net-a", world.server("net-a"))
    for _ in range(3):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)
    following = world.enqueue("next", net="net-a")
    dispatch.claim_and_start(world.rt)
    first_run_live = world.server("net-a").statuses.get("nv-1") == "RUNNING"
    # On b0f654a: the first job ABORTED, nv-1 RUNNING, the next job ASSIGNED on net-a.
    assert not (first_run_live and world.job(following).state in ACTIVE_JOB_STATES)


def test_a_dispatching_job_under_a_verdict_is_not_submitted_through_the_wrong_files(
    world, sqlite_url, monkeypatch
) -> None:
    """A job's submit began (DISPATCHING, its token stored) and its step is re-driven after a
    start found net-a's kit naming another server: the step submits there. The run lands
    on a server that is not net-a's; past the grace the job is lost, an attempt spent."""
    job_id = world.stuck_in_dispatching("d")
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    assert world.net("net-a").misconfigured_after_job == FOREIGN
    other = FakeServer()
    _clients_reach(world, monkeypatch, "net-a", other)
    world.clock.advance(600)  # the step's lease lapsed: re-driven
    attempts = world.job(job_id).attempts
    # The step meets a misconfigured net: it marks it, requeues its job and fails loud.
    with pytest.raises(AdminMisconfigured):
        dispatch.dispatch(world.rt, job_id, "net-a", attempts)
    # On b0f654a: the submit landed on the other server, the job RUNNING on net-a.
    assert other.submitted == {}
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, attempts)
    assert world.net("net-a").state == NetState.MISCONFIGURED
    assert [s.submit_token for s in _strays(world, "net-a")] == [job.submit_token or ANY]


def _running_under_a_verdict(world: World, sqlite_url: str, monkeypatch: Any) -> str:
    """A job RUNNING on net-a when a start finds its kit wrong, watched once (the grace's
    clock starts): its id."""
    job_id = world.enqueue("running", net="net-a")
    world.run_pipeline(job_id)
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    monitor.monitor_running_jobs(world.rt)
    return job_id


def test_a_restart_that_fixes_the_files_during_the_round_saves_the_run(
    world, sqlite_url, monkeypatch
) -> None:
    """Past the grace, a monitor round reads the verdict; a worker restarted with the files
    fixed commits (the verdict cleared) before the round acts on it. "Unless a worker
    restarted with the files fixed clears the verdict first": the run, alive on net-a's
    server, is taken for lost all the same (requeued, an attempt spent)."""
    job_id = _running_under_a_verdict(world, sqlite_url, monkeypatch)
    world.clock.advance(31)
    read = monitor._watchable

    def then_fixed(rows: Any) -> Any:
        watched = read(rows)
        _start(world, sqlite_url, monkeypatch, {})  # the fix's restart commits now
        return watched

    monkeypatch.setattr(monitor, "_watchable", then_fixed)
    monitor.monitor_running_jobs(world.rt)
    job = world.job(job_id)
    # On b0f654a: QUEUED, attempts 1, a stray kept and net-a taken down.
    assert (job.state, job.attempts) == (JobState.RUNNING, 0)


def test_a_blip_just_after_the_fix_does_not_lose_the_run_at_once(
    world, sqlite_url, monkeypatch
) -> None:
    """The verdict's grace started the round after the start (unreachable_since); 25 s in,
    the files are fixed and the workers restarted (the verdict cleared in time). The next
    round's first call to net-a's server fails once (a blip): the run counts as unreachable
    for 35 s, past the 30 s grace, though its server was asked once and failed once."""
    job_id = _running_under_a_verdict(world, sqlite_url, monkeypatch)
    world.clock.advance(25)
    monitor.monitor_running_jobs(world.rt)
    _start(world, sqlite_url, monkeypatch, {})  # fixed before the grace ended
    world.clock.advance(10)

    def blip() -> float:
        raise ServerUnavailable("blip")

    world.admin("net-a").server_start_time = blip
    monitor.monitor_running_jobs(world.rt)
    job = world.job(job_id)
    # On b0f654a: QUEUED, attempts 1 ("server not answering for 35s").
    assert (job.state, job.attempts) == (JobState.RUNNING, 0)


def test_a_one_second_clock_step_does_not_rest_a_healthy_flower_net_an_hour(
    tmp_path, job_root, sqlite_factory, clock
) -> None:
    """fl-a settled a stray by a start yesterday. Today a run is lost on it and kept as a
    stray; the clock steps back one second (an NTP step) before the net is taken down, so
    the stray reads recorded after the stop. Its SuperLink is healthy: without the step the
    next round starts it and settles the stray (the stray's job waits for it meanwhile); with
    it, the net rests SETTLE_REST_MAX_S (an hour), "once tried" read as any start ever."""
    world = _flower_world(tmp_path, job_root, sqlite_factory, clock)
    world.net_name = "fl-a"  # type: ignore[attr-defined]
    server = world.server("fl-a")
    server.statuses["5"] = "RUNNING"
    world.add_stray(world.enqueue("yesterday", net="net-a"), "fl-a", "5", token="tok-5")
    _rounds(world, 12)  # started, settled, idle, scaled down
    assert _strays(world, "fl-a") == [] and world.driver("fl-a").replicas == 0
    clock.advance(86400)
    server.statuses["7"] = "RUNNING"
    world.add_stray(world.enqueue("today", net="net-a"), "fl-a", "7", token="tok-7")
    clock.advance(-1)  # the step
    assert scaling.take_down(world.rt, "fl-a", "run lost")
    _rounds(world, 10)  # five minutes
    # On b0f654a: never started (replicas 0 each round), the stray kept.
    assert _strays(world, "fl-a") == [] and "7" in server.aborted


def test_a_job_the_start_requeues_is_assigned_without_waiting_for_beat(
    world, sqlite_url, monkeypatch
) -> None:
    """A job that may run on either net was claimed onto net-a (`fixed` was busy) and
    `fixed` is free since. A worker start finds net-a's kit wrong and requeues the job, its
    attempt kept; every other commit that makes a job claimable sends the assigner's kick
    (`kicks`), and so does the worker once ready (`worker_ready`, after the pool and an
    embedded beat forked), not leaving the job to beat's round, HOUSEKEEPING_INTERVAL_S away."""
    import celery
    from celery import signals

    from app import celery_app, names

    reconciler.reconcile(world.rt)
    blocker = world.enqueue("blocker", net="fixed")
    world.run_pipeline(blocker)
    job_id = world.enqueue("either", required_sites=["site-1"])
    claimed = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    assert claimed.net_name == "net-a"
    world.complete(blocker)
    sent: list[str] = []
    monkeypatch.setattr(celery.Celery, "send_task", lambda _app, name, *_a, **_k: sent.append(name))
    world.outbox.sent.clear()
    _start_with_wrong_files(world, sqlite_url, monkeypatch)
    assert world.job(job_id).state == JobState.QUEUED
    assert sent == []  # nothing before the fork
    settings = world.rt.settings.model_copy(update={"database_url": sqlite_url})
    monkeypatch.setattr(celery_app._Configured, "settings", settings)
    signals.worker_ready.send(sender=None)
    # On 66819a8: nothing sent, the job QUEUED with `fixed` READY.
    assert sent == [names.ASSIGN_NEXT_JOB]
    # A second worker ready: one kick per start, the pending one's marker notwithstanding
    # (it may be a kick lost with the worker this one replaces: test_ready_kick.py).
    signals.worker_ready.send(sender=None)
    assert sent == [names.ASSIGN_NEXT_JOB] * 2
