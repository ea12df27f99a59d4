"""A net removed from the settings by a redeploy keeps its rows; its leftovers are settled
without asking a server nobody declares any more (and without crashing the loop). A net
counts as removed once no process has declared it for the grace (app/entrypoints/README.md:
`max(STUCK_AFTER_S, 20 x HOUSEKEEPING_INTERVAL_S)`), each process recording when it last
found its nets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from app.errors import ServerUnavailable
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import (
    abort,
    declared_nets,
    dispatch,
    monitor,
    reconciler,
    records,
    undeclared,
    unknown_submit,
)
from models import JobState, Net, NetState, StrayRun
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


def _redeploy_without_net_a(world, tmp_path, job_root) -> None:
    """NETS without net-a, its last stamp older than `removed_after_s` (grace + a quarter)."""
    world.clock.advance(declared_nets.removed_after_s(world.rt.settings) + 1)
    world.rt.settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "fixed", "static")]),
        PER_JOB_FL_SERVER="true",
    )


def _redeploy_without_net_a_and_restart_the_workers(world, tmp_path, job_root) -> None:
    """As _redeploy_without_net_a; the redeploy restarts the workers: no adapter built from
    the old settings survives."""
    _redeploy_without_net_a(world, tmp_path, job_root)
    world.rt._admins.clear()
    world.rt._drivers.clear()


def test_an_unknown_submit_on_a_net_no_longer_declared_is_settled_as_a_stray(
    world, tmp_path, job_root
):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    world.server("net-a").submit_error = ServerUnavailable("no reply")
    with pytest.raises(ServerUnavailable):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    _redeploy_without_net_a(world, tmp_path, job_root)

    assert unknown_submit.abandon_dispatch(world.rt, job_id, "submit outcome unknown")
    assert world.job(job_id).state == JobState.QUEUED
    with world.rt.sessions() as session:
        [stray] = session.scalars(select(StrayRun))
    assert (stray.net_name, stray.submit_token) == ("net-a", f"{job_id}-0")


def test_stray_runs_of_a_net_no_longer_declared_are_kept(world, tmp_path, job_root):
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-5")
    _redeploy_without_net_a(world, tmp_path, job_root)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1


def test_a_job_assigned_to_a_net_no_longer_declared_and_pinned_to_it_fails_at_once(
    world, tmp_path, job_root
):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    _redeploy_without_net_a(world, tmp_path, job_root)
    redriven = reconciler.reconcile(world.rt).redriven  # no deadline to wait out
    assert f"{job_id}: failed: pinned to an undeclared net" in redriven
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.FAILED, 0)
    assert job.last_error == (
        "net net-a is no longer declared (NETS): its server is no longer watched or scaled; "
        "stop it by hand if it still runs"
    )


def test_a_row_of_a_net_no_longer_declared_never_holds_up_a_claim(world, tmp_path, job_root):
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").state = NetState.READY  # first in the claim order
    _redeploy_without_net_a(world, tmp_path, job_root)
    job_id = world.enqueue("anywhere", required_sites=["site-1"])
    claims = dispatch.claim_and_start(world.rt)
    assert [(a.job_id, a.net_name) for a in claims] == [(job_id, "fixed")]


def _row_of_a_removed_net(world, declared_at: datetime | None) -> None:
    """A row of net `gone`, which no NETS declares any more, last declared then."""
    with world.rt.sessions.begin() as session:
        session.add(
            Net(
                name="gone",
                state=NetState.STOPPED,
                state_changed_at=world.clock(),
                declared_at=declared_at,
            )
        )


def _undeclared(world) -> list[str]:
    with world.rt.sessions() as session:
        return declared_nets.undeclared_nets(session, world.rt.settings, world.clock())


def test_each_round_records_that_this_process_still_declares_its_nets(world):
    """note_declared (each reconcile) stamps the nets this process declares, and only those."""
    before = world.clock()
    _row_of_a_removed_net(world, before)
    world.clock.advance(60)
    with world.rt.sessions.begin() as session:
        declared_nets.note_declared(session, world.rt.settings, world.clock())
    with world.rt.sessions() as session:
        declared = {n.name: n.declared_at for n in session.scalars(select(Net))}
    assert declared == {"net-a": world.clock(), "fixed": world.clock(), "gone": before}


@pytest.mark.parametrize(
    ("stuck_after_s", "interval_s", "grace_s"),
    [(300, 60, 1200), (3600, 60, 3600)],
    ids=["twenty intervals", "stuck_after_s"],
)
def test_the_grace_before_a_net_counts_as_removed_is_the_longer_of_the_two(
    tmp_path, job_root, stuck_after_s, interval_s, grace_s
):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "fixed", "static")]),
        STUCK_AFTER_S=stuck_after_s,
        HOUSEKEEPING_INTERVAL_S=interval_s,
    )
    assert declared_nets.undeclared_after_s(settings) == grace_s


def test_a_net_last_declared_a_whole_grace_ago_counts_as_removed_only_after_it(world):
    """Stamps are renewed a quarter grace old (issue 37): removed past grace + a quarter."""
    _row_of_a_removed_net(world, world.clock())
    world.clock.advance(declared_nets.removed_after_s(world.rt.settings))
    assert _undeclared(world) == []
    world.clock.advance(1)
    assert _undeclared(world) == ["gone"]


def test_a_net_no_process_declared_since_migration_0007_counts_as_removed(world):
    """Migration 0007 added `declared_at` empty: a net removed by the deploy that brought it
    in was never declared since, and counts as removed at once."""
    _row_of_a_removed_net(world, None)
    assert _undeclared(world) == ["gone"]


def test_a_net_this_process_declares_never_counts_as_removed(world):
    """However long ago its row was stamped (or never): a net in this process's own NETS is
    not removed, whatever the order of the round's steps."""
    with world.rt.sessions.begin() as session:
        records.get_net(session, "net-a").declared_at = None
        records.get_net(session, "fixed").declared_at = world.clock() - timedelta(days=30)
    assert _undeclared(world) == []


def _strays(world) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _claimed_unpinned(world) -> str:
    """A job claimed onto net-a without being pinned to it: its id."""
    job_id = world.enqueue("claimed", net="net-a")
    dispatch.claim_and_start(world.rt)
    with world.rt.sessions.begin() as session:  # unpinned now, as if it had been
        records.get_job(session, job_id).requested_net = None
    return job_id


def test_a_job_only_claimed_onto_a_removed_net_is_requeued_and_reported(world, tmp_path, job_root):
    job_id = _claimed_unpinned(world)
    _redeploy_without_net_a(world, tmp_path, job_root)
    redriven = reconciler.reconcile(world.rt).redriven
    assert f"{job_id}: requeued from an undeclared net" in redriven
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.QUEUED, 0)


def test_a_finishing_job_on_a_removed_net_is_left_to_flip_apis_report(
    held_for_report, tmp_path, job_root
):
    world = held_for_report
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FINISHING
    _redeploy_without_net_a(world, tmp_path, job_root)
    assert undeclared.settle_undeclared(world.rt) == []
    assert world.job(job_id).state == JobState.FINISHING
    assert _strays(world) == []


def test_an_aborting_job_on_a_removed_net_ends_aborted_saying_so(world, tmp_path, job_root):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:  # the server was never told
        records.abort_job(session, job_id, "user", world.clock())
    _redeploy_without_net_a(world, tmp_path, job_root)
    assert undeclared.settle_undeclared(world.rt) == [f"{job_id}: aborted: on undeclared net net-a"]
    assert world.job(job_id).state == JobState.ABORTED


def test_a_running_job_on_a_removed_net_fails_and_its_run_is_kept_by_id_and_token(
    world, tmp_path, job_root
):
    """The stray names the run both ways, so a net declared again finds it to abort."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    _redeploy_without_net_a(world, tmp_path, job_root)
    assert undeclared.settle_undeclared(world.rt) == [f"{job_id}: failed: on undeclared net net-a"]
    assert world.job(job_id).state == JobState.FAILED
    [stray] = _strays(world)
    assert (stray.net_name, stray.job_id, stray.nvflare_job_id, stray.submit_token) == (
        "net-a",
        job_id,
        run,
        f"{job_id}-0",
    )


def test_a_job_that_already_ended_on_a_removed_net_is_left_as_it_was(world, tmp_path, job_root):
    job_id = world.enqueue("j", net="net-a")
    world.run_to_completion(job_id)
    _redeploy_without_net_a(world, tmp_path, job_root)
    assert undeclared.settle_undeclared(world.rt) == []
    assert world.job(job_id).state == JobState.COMPLETED
    assert _strays(world) == []


def test_every_job_waiting_on_a_stray_of_a_removed_net_fails_past_one_that_ended(
    world, tmp_path, job_root
):
    ended = world.enqueue("ended", required_sites=["site-1"])
    with world.rt.sessions.begin() as session:
        records.abort_job(session, ended, "user", world.clock())
    world.add_stray(ended, "net-a", "nv-1")  # read first: its job is over, nothing to end
    waiting = world.enqueue("waiting", required_sites=["site-1"])
    world.add_stray(waiting, "net-a", "nv-2")
    _redeploy_without_net_a(world, tmp_path, job_root)
    assert undeclared.settle_undeclared(world.rt) == [
        f"{waiting}: failed: its earlier run is on undeclared net net-a"
    ]
    assert world.job(waiting).state == JobState.FAILED


def _pinned_queued(world) -> str:
    return world.enqueue("pinned", net="net-a")


def _waiting_on_a_stray(world) -> str:
    job_id = world.enqueue("waiting", required_sites=["site-1"])
    world.add_stray(job_id, "net-a", "nv-5")
    return job_id


@pytest.mark.parametrize(
    ("setup", "step"),
    [
        (_claimed_unpinned, "requeue_job"),
        (_pinned_queued, "finish_job"),
        (_waiting_on_a_stray, "finish_job"),
    ],
    ids=["claimed-there", "pinned-there", "waiting-on-its-stray-there"],
)
def test_a_job_that_cannot_be_settled_is_recorded_on_the_removed_net(
    world, tmp_path, job_root, monkeypatch, setup, step
):
    """The failure is isolated to that net and recorded on it as any housekeeping loop's is
    (its last_error, naming the loop, shown by /fl/status and the CLI)."""
    job_id = setup(world)
    _redeploy_without_net_a(world, tmp_path, job_root)

    def crash(*args, **kwargs):
        raise RuntimeError("bug in a settlement")

    monkeypatch.setattr(records, step, crash)
    assert undeclared.settle_undeclared(world.rt) == []
    assert world.net("net-a").last_error == "reconcile: RuntimeError: bug in a settlement"
    assert world.job(job_id).state in (JobState.ASSIGNED, JobState.QUEUED)  # next round's


# --- a redeploy that drops net-b: its jobs and the runs they leave -----------------------------


@pytest.fixture
def two_nets(tmp_path, job_root, sqlite_factory, clock) -> World:
    nets = [net_decl(tmp_path, n, "ecs", ready_timeout_s=120) for n in ("net-a", "net-b")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


def _without_net_b(world: World, tmp_path) -> Runtime:
    """The same database after a redeploy whose NETS no longer declare net-b, once no
    process has declared it for the whole grace (a rolling deploy is over)."""
    world.clock.advance(declared_nets.removed_after_s(world.rt.settings) + 1)
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=world.rt.settings.job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs", ready_timeout_s=120)]),
        PER_JOB_FL_SERVER="true",
    )
    return Runtime(
        settings=settings,
        engine=world.rt.engine,
        sessions=world.rt.sessions,
        clock=world.clock,
        driver_factory=lambda net, s: world.drivers.setdefault(net.name, world.driver("net-a")),
        admin_factory=lambda net, s: world.admin(net.name),
        outbox=world.outbox,
    )


def _ended_for_the_removed_net(world: World, job_id) -> None:
    job = world.job(job_id)
    assert job.state == JobState.FAILED, (job.caller_key, job.state)
    assert "net-b" in (job.last_error or "") and "no longer declared" in (job.last_error or "")


def test_a_running_job_on_a_removed_net_fails_saying_why(two_nets, tmp_path):
    world = two_nets
    running = world.enqueue("running", net="net-b")
    world.run_pipeline(running)
    reconciler.reconcile(_without_net_b(world, tmp_path))
    _ended_for_the_removed_net(world, running)


def test_a_dispatching_job_on_a_removed_net_fails_and_never_runs_twice(two_nets, tmp_path):
    world = two_nets
    job_id = world.stuck_in_dispatching("dispatching", net="net-b")
    world.clock.advance(3600)
    redeployed = _without_net_b(world, tmp_path)
    reconciler.reconcile(redeployed)
    _ended_for_the_removed_net(world, job_id)
    assert dispatch.claim_and_start(redeployed) == []


def test_a_queued_job_whose_stray_is_on_a_removed_net_fails_and_the_stray_stays(two_nets, tmp_path):
    world = two_nets
    waiting = world.enqueue("strayed", required_sites=["site-1"])
    world.add_stray(waiting, "net-b", None, token="t")
    reconciler.reconcile(_without_net_b(world, tmp_path))
    _ended_for_the_removed_net(world, waiting)
    with world.rt.sessions() as session:  # kept: net-b, declared again, waits for it
        assert session.query(StrayRun).count() == 1


def test_a_queued_job_pinned_to_a_removed_net_fails_saying_why(two_nets, tmp_path):
    world = two_nets
    pinned = world.enqueue("pinned", net="net-b")
    reconciler.reconcile(_without_net_b(world, tmp_path))
    _ended_for_the_removed_net(world, pinned)


def test_a_job_only_claimed_onto_a_removed_net_goes_back_to_the_queue(two_nets, tmp_path):
    world = two_nets
    job_id = world.enqueue("claimed", net="net-b")
    dispatch.claim_and_start(world.rt)
    with world.rt.sessions.begin() as session:  # unpinned now, as if it had been
        records.get_job(session, job_id).requested_net = None
    reconciler.reconcile(_without_net_b(world, tmp_path))
    job = world.job(job_id)
    assert (job.state, job.attempts) in ((JobState.QUEUED, 0), (JobState.ASSIGNED, 0))
    assert job.net_name != "net-b"


def test_a_net_declared_again_takes_no_job_beside_the_run_it_was_removed_with(two_nets, tmp_path):
    # The simulator's sweep (seed 167): the job was failed without its run being counted,
    # and net-b, declared again, took the next job beside that run.
    world = two_nets
    running = world.enqueue("running", net="net-b")
    world.run_pipeline(running)
    reconciler.reconcile(_without_net_b(world, tmp_path))
    _ended_for_the_removed_net(world, running)
    nxt = world.enqueue("next", net="net-b")  # the redeploy is undone: net-b is back
    assert all(a.job_id != nxt for a in dispatch.claim_and_start(world.rt))
    assert world.job(nxt).state == JobState.QUEUED


def test_a_worker_still_on_the_previous_nets_never_fails_the_jobs_of_a_net_just_added(
    tmp_path, job_root, sqlite_factory, clock
):
    """A redeploy adds net-b to NETS. While it rolls out (ECS replaces tasks one by one), a
    worker still on the previous declaration (net-a only) runs one of beat's reconcile
    rounds. `_settle_undeclared` takes "not in my NETS" for "removed": the job RUNNING on the
    healthy new net-b is FAILED (and a QUEUED job pinned to it too), its run goes on
    unwatched, and the up-to-date workers then hand net-b, released, to the next job beside
    that run.

    Breaks: "lose a job" (a valid RUNNING job is failed by a routine redeploy) and "a run
    that no job counts ... is a stray run: the net takes no new job until it is aborted"."""
    nets = [net_decl(tmp_path, n, "ecs", ready_timeout_s=120) for n in ("net-a", "net-b")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    running = world.enqueue("running", net="net-b")
    world.run_pipeline(running)
    run = world.job(running).nvflare_job_id
    pinned = world.enqueue("pinned", net="net-b")

    previous = Runtime(
        settings=Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path / "data",
            JOB_ROOT=job_root,
            NETS=json.dumps([nets[0]]),
            PER_JOB_FL_SERVER="true",
        ),
        engine=world.rt.engine,
        sessions=world.rt.sessions,
        clock=world.clock,
        driver_factory=lambda net, s: world.driver(net.name),
        admin_factory=lambda net, s: world.admin(net.name),
        outbox=world.outbox,
    )
    reconciler.reconcile(previous)  # beat's round, taken by the not-yet-replaced worker

    assert world.job(running).state == JobState.RUNNING, world.job(running).last_error
    assert world.job(pinned).state == JobState.QUEUED, world.job(pinned).last_error
    assert world.server("net-b").statuses[run] == "RUNNING"


# --- a redeploy that drops net-a and restarts the workers ------------------------------------


@pytest.mark.parametrize("step", ["start", "check_ready", "dispatch"])
def test_a_chain_step_for_a_net_a_redeploy_removed_ends_its_chain(world, tmp_path, job_root, step):
    """The chain of a job claimed onto net-a is in flight when a redeploy drops net-a from
    NETS: its next step must end the chain (reconcile settles the job), not raise an
    unclassified KeyError (Celery's "raised unexpected", a traceback per step)."""
    job_id = world.enqueue("j", net="net-a")
    if step == "dispatch":
        world.run_until_ready(job_id)
    else:
        [claim] = dispatch.claim_and_start(world.rt)
        assert claim.net_name == "net-a"
        if step == "check_ready":
            dispatch.scale_up(world.rt, job_id, "net-a", 0)
    _redeploy_without_net_a_and_restart_the_workers(world, tmp_path, job_root)

    result = getattr(dispatch, step)(world.rt, job_id, "net-a", 0)

    assert result.step.ends_chain
    assert result.detail == "net net-a is no longer declared (NETS)"
    assert world.job(job_id).state != JobState.RUNNING


def test_an_abort_in_flight_for_a_net_a_redeploy_removed_leaves_the_job_to_reconcile(
    world, tmp_path, job_root
):
    """flip-api aborts a RUNNING job on net-a; the redeploy that drops net-a lands before the
    worker runs abort_on_server: it must leave the job to reconcile (fix 7 aborts it), not
    raise KeyError."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        records.abort_job(session, job_id, "user", world.clock())
    _redeploy_without_net_a_and_restart_the_workers(world, tmp_path, job_root)

    assert abort.abort_on_server(world.rt, job_id) in (JobState.ABORTING, JobState.ABORTED)


def test_a_net_declared_again_by_restarted_workers_takes_no_job_beside_its_old_run(
    world, tmp_path, job_root
):
    """net-a runs job `old` when a redeploy removes it from NETS; reconcile fails `old` (its
    run may live on a server nothing watches). A second redeploy declares net-a again while
    that run still lives: net-a must take no job beside it (one live run per server)."""
    declared = world.rt.settings
    old = world.enqueue("old", net="net-a")
    world.run_pipeline(old)
    _redeploy_without_net_a_and_restart_the_workers(world, tmp_path, job_root)
    reconciler.reconcile(world.rt)
    assert world.job(old).state == JobState.FAILED
    world.rt.settings = declared  # net-a declared again; its server still runs `old`'s run
    world.rt._admins.clear()
    world.rt._drivers.clear()
    new = world.enqueue("new", net="net-a")

    claims = dispatch.claim_and_start(world.rt)

    assert [c.job_id for c in claims if c.net_name == "net-a"] == [], (
        f"job {new} claimed onto net-a beside run {world.job(old).nvflare_job_id}"
    )


# --- an unpinned QUEUED job whose sites only a removed net had --------------------------------


def _sited(tmp_path, name: str, kind: str, sites: list[str] | None) -> dict[str, object]:
    return net_decl(tmp_path, name, kind, **({} if sites is None else {"sites": sites}))


@pytest.fixture
def sited(tmp_path, job_root, sqlite_factory, clock) -> World:
    """net-a has site-1..3; `fixed` (static) has site-1 and site-2 only."""
    nets = [
        _sited(tmp_path, "net-a", "ecs", ["site-1", "site-2", "site-3"]),
        _sited(tmp_path, "fixed", "static", ["site-1", "site-2"]),
    ]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


def _declare(world: World, tmp_path, *nets: dict[str, object]) -> None:
    """This process's NETS after a redeploy (the clock is left as it is)."""
    world.rt.settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=world.rt.settings.job_root,
        NETS=json.dumps(list(nets)),
        PER_JOB_FL_SERVER="true",
    )


def _fixed_only(world: World, tmp_path, *, after_s: float | None = None) -> None:
    """NETS without net-a (the only net with site-3), `after_s` after its last stamp
    (default: past the grace that makes it removed)."""
    grace_s = declared_nets.removed_after_s(world.rt.settings)
    world.clock.advance(grace_s + 1 if after_s is None else after_s)
    _declare(world, tmp_path, _sited(tmp_path, "fixed", "static", ["site-1", "site-2"]))


def test_an_unpinned_queued_job_only_a_removed_net_could_run_fails_saying_why(sited, tmp_path):
    """As a QUEUED job pinned to a removed net: it can never run (an enqueue of it today is
    refused: "no net has every site"), so it FAILS, net_removed, saying which sites; a job a
    declared net can run is left to the queue."""
    world = sited
    doomed = world.enqueue("needs-site-3", required_sites=["site-3"])
    split = world.enqueue("needs-1-and-3", required_sites=["site-1", "site-3"])
    runnable = world.enqueue("needs-site-1", required_sites=["site-1"])
    _fixed_only(world, tmp_path)
    redriven = reconciler.reconcile(world.rt).redriven
    for job_id in (doomed, split):
        job = world.job(job_id)
        assert (job.state, job.reason_code) == (JobState.FAILED, "net_removed"), job_id
        assert "site-3" in (job.last_error or "") and "no declared net" in (job.last_error or "")
        assert f"{job_id}: failed: no declared net has its sites" in redriven
    assert world.job(runnable).state in (JobState.QUEUED, JobState.ASSIGNED)


def test_an_unpinned_job_whose_sites_went_with_a_net_waits_out_the_grace(sited, tmp_path):
    """Within the grace the net may come back (a rolling deploy, a rollback): the job waits."""
    world = sited
    job_id = world.enqueue("needs-site-3", required_sites=["site-3"])
    _fixed_only(world, tmp_path, after_s=declared_nets.undeclared_after_s(world.rt.settings))
    reconciler.reconcile(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


def test_an_unpinned_job_waits_while_a_declared_net_declares_no_sites(sited, tmp_path):
    """A net that does not declare its sites may have any (`NetConfig.lacks`): it can run the
    job, so the job waits for it."""
    world = sited
    job_id = world.enqueue("needs-site-3", required_sites=["site-3"])
    world.clock.advance(declared_nets.removed_after_s(world.rt.settings) + 1)
    _declare(
        world,
        tmp_path,
        _sited(tmp_path, "fixed", "static", ["site-1", "site-2"]),
        _sited(tmp_path, "any", "ecs", None),
    )
    reconciler.reconcile(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


def test_an_unpinned_job_waits_while_a_net_this_process_lacks_was_declared_lately(sited, tmp_path):
    """net-a is removed, but net-b, which this process does not declare, was declared by
    another process within the grace (a rolling deploy adds it, or this worker is the one
    left behind): net-b's sites are unknown here, it may have site-3, so nothing is failed
    for want of a site until every net this process lacks is past the grace."""
    world = sited
    job_id = world.enqueue("needs-site-3", required_sites=["site-3"])
    _fixed_only(world, tmp_path)
    with world.rt.sessions.begin() as session:
        session.add(
            Net(
                name="net-b",
                state=NetState.STOPPED,
                state_changed_at=world.clock(),
                declared_at=world.clock(),
            )
        )
    reconciler.reconcile(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


def test_a_round_with_a_removed_net_reads_no_more_for_the_jobs_it_could_not_run(sited, tmp_path):
    """The unpinned jobs are read with the pinned ones, in the settlement's one read of the
    removed nets' jobs: a quiet round with a removed net costs what it did (the fleet, that
    read, the strays, the heartbeat), however many jobs wait."""
    from tests.unit.test_housekeeping_cost import statements

    world = sited
    for i in range(3):
        world.enqueue(f"needs-site-1-{i}", required_sites=["site-1"], net="fixed")
    world.enqueue("needs-site-2", required_sites=["site-2"])
    _fixed_only(world, tmp_path)
    with world.rt.sessions.begin() as session:  # `fixed` busy: the jobs stay QUEUED
        records.get_net(session, "fixed").state = NetState.MISCONFIGURED
    reconciler.reconcile(world.rt)  # stamps what this process declares
    with statements(world.rt.sessions) as sent:
        assert reconciler.reconcile(world.rt).redriven == ()
    assert len(sent) == 4, sent


def test_the_jobs_looked_at_for_their_sites_are_those_queued_before_the_removal_settled(
    sited, tmp_path
):
    """Jobs accepted twice the grace after the last removed net's stamp were accepted by
    processes without it (their enqueue checked the sites): a quiet round reads none."""
    world = sited
    stamp = world.net("net-a").declared_at
    _fixed_only(world, tmp_path)
    grace = timedelta(seconds=2 * declared_nets.removed_after_s(world.rt.settings))
    with world.rt.sessions() as session:
        stamps = dict(session.execute(select(Net.name, Net.declared_at)).all())
    removal = declared_nets.removal(stamps, world.rt.settings, world.clock())
    assert removal == declared_nets.Removal(["net-a"], stamp + grace)
    never = declared_nets.removal({**stamps, "net-a": None}, world.rt.settings, world.clock())
    assert never.sites_horizon == world.clock()  # removed before migration 0007: every job


def test_a_round_past_the_horizon_reads_no_queued_job_for_its_sites(sited, tmp_path, monkeypatch):
    """The jobs read for their sites are those queued before the horizon only: one queued
    later (its enqueue checked its sites against these NETS) is never read again."""
    world = sited
    early = world.enqueue("early", required_sites=["site-1"])
    _fixed_only(world, tmp_path)
    checked: list[list[str]] = []
    real = undeclared.runnable
    monkeypatch.setattr(
        undeclared, "runnable", lambda s, sites: checked.append(sites) or real(s, sites)
    )
    with world.rt.sessions.begin() as session:  # `fixed` out of service: the jobs stay QUEUED
        records.get_net(session, "fixed").state = NetState.MISCONFIGURED
    reconciler.reconcile(world.rt)
    assert checked == [["site-1"]] and world.job(early).state == JobState.QUEUED
    world.clock.advance(2 * declared_nets.removed_after_s(world.rt.settings))
    world.enqueue("late", required_sites=["site-2"])
    with world.rt.sessions.begin() as session:
        records.abort_job(session, early, "user", world.clock())  # gone from the queue
    checked.clear()
    reconciler.reconcile(world.rt)
    assert checked == []


def test_one_queued_row_without_sites_stops_neither_the_round_nor_the_others(sited, tmp_path):
    """A row the checks cannot read (required_sites JSON null, a hand edit) is one row: the
    settlement of the others and the rest of the round go on, as a pinned job's do."""
    from sqlalchemy import update

    from models import Job

    world = sited
    bad = world.enqueue("bad-row", required_sites=["site-1"])
    doomed = world.enqueue("needs-site-3", required_sites=["site-3"])
    with world.rt.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == bad).values(required_sites=None))
    _fixed_only(world, tmp_path)
    reconciler.reconcile(world.rt)
    assert world.job(doomed).state == JobState.FAILED


def test_a_net_removed_before_its_stamp_existed_leaves_no_read_growing_with_the_queue(
    sited, tmp_path, monkeypatch
):
    """As the test above, for a net whose row has no stamp (removed before migration 0007,
    which added `declared_at`: no process ever stamps it). Its horizon was the round's own
    `now`, so every round read every unpinned QUEUED job and checked its sites, however
    long after the removal they were queued: a round's cost grew with the queue for good."""
    from sqlalchemy import update

    world = sited
    _fixed_only(world, tmp_path)
    with world.rt.sessions.begin() as session:
        session.execute(update(Net).where(Net.name == "net-a").values(declared_at=None))
        records.get_net(session, "fixed").state = NetState.MISCONFIGURED  # jobs stay QUEUED
    reconciler.reconcile(world.rt)  # the first round after the upgrade may read them all
    world.clock.advance(2 * declared_nets.removed_after_s(world.rt.settings))
    world.enqueue("late", required_sites=["site-2"])  # checked by its enqueue against NETS
    world.clock.advance(60)
    checked: list[list[str]] = []
    real = undeclared.runnable
    monkeypatch.setattr(
        undeclared, "runnable", lambda s, sites: checked.append(sites) or real(s, sites)
    )
    reconciler.reconcile(world.rt)
    assert checked == []


# --- a job that moved on between the round's read and its lock ---------------------------------


def test_an_unrunnable_job_aborted_since_the_rounds_read_is_left_and_not_reported(
    sited, tmp_path, monkeypatch
):
    """The round read the job QUEUED with sites no declared net has; a user's abort committed
    before its lock (staged at the round's check of its sites): the job stays ABORTED and the
    round reports nothing for it."""
    world = sited
    doomed = world.enqueue("needs-site-3", required_sites=["site-3"])
    _fixed_only(world, tmp_path)
    check = undeclared.runnable
    aborted: list[str] = []

    def check_then_aborted(settings: Settings, sites: list[str] | None) -> bool:
        if not aborted:  # the round's check, before the lock (no read once it is held)
            aborted.append(str(doomed))
            world.abort(doomed)
        return check(settings, sites)

    monkeypatch.setattr(undeclared, "runnable", check_then_aborted)
    assert undeclared.settle_undeclared(world.rt) == []
    assert world.job(doomed).state == JobState.ABORTED


def test_a_job_on_a_removed_net_aborted_since_the_rounds_read_is_left_and_not_reported(
    world, tmp_path, job_root, monkeypatch
):
    """The round read the job ASSIGNED to removed net-a; an abort committed before its lock
    (staged as the round enters the job's isolation): nothing is settled or reported."""
    job_id = _claimed_unpinned(world)
    _redeploy_without_net_a(world, tmp_path, job_root)
    guard = undeclared.isolated

    @contextmanager
    def aborted_then_guarded(rt: Runtime, loop: str, net_name: str) -> Iterator[None]:
        if world.job(job_id).state == JobState.ASSIGNED:
            with world.rt.sessions.begin() as session:
                records.abort_job(session, job_id, "user", world.clock())
        with guard(rt, loop, net_name):
            yield

    monkeypatch.setattr(undeclared, "isolated", aborted_then_guarded)
    assert undeclared.settle_undeclared(world.rt) == []
    assert world.job(job_id).state == JobState.ABORTED
    assert _strays(world) == []
