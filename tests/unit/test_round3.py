"""Correctness round 3: paths by which a caller's or an operator's ordinary action lost a
job, started a second live run, kept a server up or stalled callbacks. Each test here
failed before its fix (README "Guarantees under test")."""

from __future__ import annotations

import json
import uuid

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from app.adapters.nvflare.base import AbortOutcome, AbortResult
from app.errors import InvalidRequest
from app.runtime import Runtime
from app.schemas import AbortJob, EnqueueJob, ReportedStatus, ReportJobStatus
from app.settings import Settings
from app.usecases import (
    abort,
    dispatch,
    intake,
    monitor,
    net_repairs,
    reconciler,
    scale_down,
    services,
)
from models import JobEvent, JobState, NetState, ReasonCode, RejectedRequest, StrayRun
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of

# --- 1. a report on an ABORTING job -------------------------------------------------------


@pytest.mark.parametrize("status", list(ReportedStatus))
def test_a_report_on_an_aborting_job_keeps_its_live_run_from_the_next_job(world, status):
    job_id = world.enqueue("first", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    intake.request_abort(world.rt, job_id, "user")  # ABORTING; abort_on_server not run yet
    intake.report_status(world.rt, ReportJobStatus(job_id=job_id, status=status))
    assert world.job(job_id).state in (JobState.ABORTED, JobState.COMPLETED, JobState.FAILED)
    abort.abort_on_server(world.rt, job_id)  # late: the job is over, it does nothing

    nxt = world.enqueue("next", net="net-a")
    if world.server("net-a").statuses[run] == "RUNNING":
        # The run is live: it is a stray, and the net takes no job beside it.
        assert dispatch.assign_jobs(world.rt) == []
        assert world.job(nxt).state == JobState.QUEUED
    abort.settle_stray_runs(world.rt, "net-a")
    assert world.server("net-a").statuses[run] != "RUNNING"
    assert [a.job_id for a in dispatch.assign_jobs(world.rt)] == [nxt]


def test_a_report_on_an_aborting_job_asks_for_its_run_to_be_settled(world):
    job_id = world.enqueue("first", net="net-a")
    world.run_pipeline(job_id)
    intake.request_abort(world.rt, job_id, "user")
    world.outbox.sent.clear()
    intake.report_status(
        world.rt, ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED)
    )
    assert ("fl_dispatcher.settle_stray_runs", {"net_name": "net-a"}) in world.outbox.sent


def test_a_run_recorded_twice_is_one_stray(world):
    job_id = world.enqueue("first", net="net-a")
    world.add_stray(job_id, "net-a", None, token="tok-1")
    world.add_stray(job_id, "net-a", "nv-1", token="tok-1")
    world.add_stray(job_id, "net-a", "nv-1")
    with world.rt.sessions() as session:
        strays = session.query(StrayRun).all()
    assert [(s.nvflare_job_id, s.submit_token) for s in strays] == [("nv-1", "tok-1")]


# --- 2. a prepared copy from an earlier attempt ---------------------------------------------


def test_a_bundle_changed_between_attempts_is_submitted_as_it_is_now(world, job_root):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    first = world.server("net-a").folders[-1]
    with world.rt.sessions.begin() as session:
        services.requeue_job(session, job_id, "server restarted", world.clock())
    (job_root / "tiny-job" / "app" / "config" / "train.py").write_text("v2")
    world.run_pipeline(job_id)
    second = world.server("net-a").folders[-1]
    assert second != first
    assert (second / "app" / "config" / "train.py").read_text() == "v2"


def test_a_bundle_rebuilt_with_the_same_sizes_and_mtimes_is_submitted_as_it_is_now(world, job_root):
    # A reproducible build (or an unpacked archive) gives every version the same mtimes:
    # the simulator's sweep found the copy keyed by size and mtime reused (seed 34).
    import os

    script = job_root / "tiny-job" / "app" / "config" / "train.py"
    script.write_text("v1")
    os.utime(script, ns=(10**18, 10**18))
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        services.requeue_job(session, job_id, "server restarted", world.clock())
    script.write_text("v2")
    os.utime(script, ns=(10**18, 10**18))
    world.run_pipeline(job_id)
    second = world.server("net-a").folders[-1]
    assert (second / "app" / "config" / "train.py").read_text() == "v2"


def test_reconcile_keeps_the_prepared_copy_of_a_job_that_may_be_claimed_again(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    folder = world.server("net-a").folders[-1]
    with world.rt.sessions.begin() as session:
        services.requeue_job(session, job_id, "server restarted", world.clock())
    reconciler.reconcile(world.rt)  # QUEUED: not active, but not over either
    assert folder.is_dir()
    with world.rt.sessions.begin() as session:
        services.finish_job(
            session, job_id, JobState.ABORTED, "user", world.clock(), code=ReasonCode.ABORTED
        )
    reconciler.reconcile(world.rt)
    assert not folder.exists()


# --- 4. an idle server kept up for a job that cannot be claimed ----------------------------


def test_an_idle_net_is_stopped_though_a_queued_job_waits_on_a_stray_elsewhere(world):
    done = world.enqueue("done", net="net-a")
    world.run_to_completion(done)
    blocked = world.enqueue("blocked", required_sites=["site-1"])  # fits net-a, stray elsewhere
    world.add_stray(blocked, "fixed", "nv-old")
    world.clock.advance(60)
    assert scale_down.scale_down_idle_nets(world.rt) == ["net-a"]
    assert world.job(blocked).state == JobState.QUEUED


# --- 5. payloads that cannot be stored or sent --------------------------------------------

HOSTILE = ["\ud800", "a\x00b", "\udfff tail"]
# pydantic itself refuses a lone surrogate in a plain string field (string_unicode).
UNSTORABLE = r"cannot be stored|as a unicode string"


@pytest.mark.parametrize("text", HOSTILE)
def test_enqueue_refuses_a_string_that_cannot_be_stored_or_sent(text):
    base = {"caller_key": "k", "definition": "tiny-job"}
    for payload in (
        base | {"metadata": {"model": text}},
        base | {"metadata": {text: 1}},
        base | {"metadata": {"nested": [{"deep": text}]}},
        base | {"definition": f"tiny{text}"},
        base | {"required_sites": [f"site{text}"]},
    ):
        with pytest.raises(ValidationError, match=UNSTORABLE):
            EnqueueJob.model_validate(payload)
    with pytest.raises(ValidationError, match=UNSTORABLE):
        ReportJobStatus(job_id=uuid.uuid4(), status=ReportedStatus.ERROR, detail=text)
    with pytest.raises(ValidationError, match=UNSTORABLE):
        AbortJob(job_id=uuid.uuid4(), reason=text)


def test_unicode_that_is_valid_is_accepted_as_is():
    text = "Hôpital 病院 🏥 \u200d\ufeff"
    job = EnqueueJob(caller_key="k", definition="tiny-job", metadata={text: [text]})
    assert job.metadata == {text: [text]}


def test_a_rejection_with_an_unstorable_caller_key_is_recorded(world):
    intake.reject_enqueue(world.rt, "bad\x00key\ud800", "caller_key: invalid")
    with world.rt.sessions() as session:
        rows = session.query(RejectedRequest).all()
    assert [(r.caller_key, r.job_id) for r in rows] == [("bad\\x00key\\ud800", None)]


# --- 6. backoff that overflows ---------------------------------------------------------------


# --- 8. a failure handler moves only what it owns --------------------------------------------


def test_exhausted_retries_never_requeue_a_job_a_re_sent_submit_has_adopted(world):
    job_id = world.enqueue("j", net="net-a")
    net, attempt = world.run_until_ready(job_id)
    # The first task's submit landed but its reply was lost on its last retry; reconcile's
    # re-sent dispatch (same token) adopted the run.
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
    assert world.job(job_id).state == JobState.RUNNING
    assert not dispatch.requeue_after_transient(
        world.rt, job_id, "dispatch: retries exhausted", net_name=net, attempt=attempt
    )
    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("net-a").state == NetState.BUSY


def test_exhausted_retries_leave_a_job_on_its_next_attempt_alone(world):
    job_id = world.enqueue("j", net="net-a")
    net, attempt = world.run_until_ready(job_id)
    with world.rt.sessions.begin() as session:
        services.requeue_job(session, job_id, "readiness gave up", world.clock())
    dispatch.assign_jobs(world.rt)  # attempt 1, ASSIGNED
    assert not dispatch.requeue_after_transient(
        world.rt, job_id, "scale_up: retries exhausted", net_name=net, attempt=attempt
    )
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.ASSIGNED, 1)


def test_a_failure_handler_without_a_step_binding_moves_nothing(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_until_ready(job_id)
    assert not dispatch.requeue_after_transient(world.rt, job_id, "abort_on_server: exhausted")
    assert world.job(job_id).state == JobState.ASSIGNED


def _last_reason(world: World, job_id) -> str:
    with world.rt.sessions() as session:
        return session.scalars(
            select(JobEvent.reason).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc())
        ).first()


# --- monitor: an abort between the round's read and its verdict ----------------------------


def test_an_abort_between_the_monitor_read_and_its_verdict_ends_the_job(held_for_report):
    world = held_for_report
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    server = world.server("net-a")
    server.statuses[run] = "FINISHED:COMPLETED"
    server.on_start_time = lambda: intake.request_abort(world.rt, job_id, "user")
    outcomes = monitor.monitor_running_jobs(world.rt)
    assert world.net("net-a").last_error is None, outcomes
    assert world.job(job_id).state == JobState.ABORTED
    assert "completed before the abort" in _last_reason(world, job_id)


def test_an_aborted_job_whose_run_completed_is_not_reported_completed_when_held(
    held_for_report,
):
    world = held_for_report
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses[world.job(job_id).nvflare_job_id] = "FINISHED:COMPLETED"
    assert world.abort(job_id) == JobState.ABORTED
    assert "no results report" in _last_reason(world, job_id)


def test_an_aborted_job_whose_run_completed_is_completed_when_not_held(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses[world.job(job_id).nvflare_job_id] = "FINISHED:COMPLETED"
    assert world.abort(job_id) == JobState.COMPLETED


# --- one rule for "the run is over" ----------------------------------------------------------


def test_an_accepted_abort_that_the_server_does_not_confirm_leaves_a_stray(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    admin = world.admin("net-a")
    admin.abort = lambda _id: AbortResult(AbortOutcome.ABORTED)  # type: ignore[method-assign]
    assert world.abort(job_id) == JobState.ABORTED
    assert world.server("net-a").statuses[run] == "RUNNING"
    with world.rt.sessions() as session:
        assert [s.nvflare_job_id for s in session.query(StrayRun)] == [run]
    assert dispatch.assign_jobs(world.rt) == []


# --- required sites the net does not have ---------------------------------------------------


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


def test_declared_default_sites_must_be_among_the_nets_sites(tmp_path, job_root):
    nets = [net_decl(tmp_path, "net-a", "ecs", sites=["site-1"])]  # defaults: site-1, site-2
    with pytest.raises(Exception, match=r"required_sites.*site-2.*not among its sites"):
        Settings(JOB_ROOT=job_root, NETS=json.dumps(nets))


def test_a_site_that_never_connects_is_the_jobs_problem_not_the_nets(sited):
    world = sited
    job_id = world.enqueue("j", net="net-b", required_sites=["site-1", "site-7"])
    net, attempt = next((a.net_name, a.attempt) for a in dispatch.assign_jobs(world.rt))
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


def _fresh_factory(tmp_path):
    from app.db import make_engine, session_factory
    from app.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(url)
    return session_factory(make_engine(url))


# --- nets removed by a redeploy --------------------------------------------------------------


@pytest.fixture
def two_nets(tmp_path, job_root, sqlite_factory, clock) -> World:
    nets = [net_decl(tmp_path, n, "ecs", ready_timeout_s=120) for n in ("net-a", "net-b")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


def _without_net_b(world: World, tmp_path) -> Runtime:
    """The same database after a redeploy whose NETS no longer declare net-b, once no
    process has declared it for the whole grace (a rolling deploy is over)."""
    world.clock.advance(services.undeclared_after_s(world.rt.settings) + 1)
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
    assert dispatch.assign_jobs(redeployed) == []


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
    dispatch.assign_jobs(world.rt)
    with world.rt.sessions.begin() as session:  # unpinned now, as if it had been
        services.get_job(session, job_id).requested_net = None
    reconciler.reconcile(_without_net_b(world, tmp_path))
    job = world.job(job_id)
    assert (job.state, job.attempts) in ((JobState.QUEUED, 0), (JobState.ASSIGNED, 0))
    assert job.net_name != "net-b"


# --- a worker that died holding a DISPATCHING job ------------------------------------------


def test_a_submit_whose_worker_died_is_re_sent_within_a_minute_with_the_defaults(
    tmp_path, job_root, sqlite_factory, clock
):
    world = world_of(
        [net_decl(tmp_path, "net-a", "ecs")], tmp_path, job_root, sqlite_factory, clock
    )
    assert world.rt.settings.stuck_after_s == 300  # the defaults, as shipped
    job_id = world.enqueue("j", net="net-a")
    net, attempt = world.run_until_ready(job_id)

    class WorkerDied(BaseException):
        """SIGKILL while the submit is on the wire."""

    def die() -> None:
        raise WorkerDied

    world.server("net-a").on_submit = die
    with pytest.raises(WorkerDied):
        dispatch.dispatch(world.rt, job_id, net, attempt)
    world.server("net-a").on_submit = None
    resent = ("fl_dispatcher.dispatch", {"job_id": str(job_id), "net_name": net, "attempt": 0})

    world.outbox.sent.clear()
    world.clock.advance(15)  # its try could still be going: left alone
    reconciler.reconcile(world.rt)
    assert resent not in world.outbox.sent
    world.clock.advance(30)
    reconciler.reconcile(world.rt)
    assert resent in world.outbox.sent
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
    assert world.job(job_id).state == JobState.RUNNING


def test_a_submit_still_being_retried_is_not_re_sent(tmp_path, job_root, sqlite_factory, clock):
    world = world_of(
        [net_decl(tmp_path, "net-a", "ecs")], tmp_path, job_root, sqlite_factory, clock
    )
    job_id = world.stuck_in_dispatching("j")
    for _ in range(6):  # the task's own retries, each announcing its next try
        world.clock.advance(55)
        dispatch.count_retry(world.rt, job_id, next_try_in_s=60)
        world.outbox.sent.clear()
        reconciler.reconcile(world.rt)
        assert not [t for t, _ in world.outbox.sent if t == "fl_dispatcher.dispatch"]
        assert world.job(job_id).state == JobState.DISPATCHING


# --- reconcile acts on what it read: a net claimed meanwhile keeps its server -------------


@pytest.mark.parametrize("read_as", [NetState.STOPPING, NetState.UNHEALTHY])
def test_a_scale_down_decided_on_an_old_read_spares_a_net_claimed_meanwhile(world, read_as):
    job_id = world.enqueue("j", net="net-a")
    dispatch.assign_jobs(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    assert world.net("net-a").state == NetState.STARTING
    stale = net_repairs.NetRow(read_as, world.clock())
    net_repairs.repair_scaling_net(world.rt, "net-a", stale)
    assert world.driver("net-a").replicas == 1
    assert world.net("net-a").state == NetState.STARTING


# --- why a QUEUED job waits ----------------------------------------------------------------


def test_a_queued_job_says_why_it_waits(world):
    from app.usecases.scaling import net_misconfigured
    from app.usecases.views import job_detail

    pinned = world.enqueue("pinned", net="net-a")
    net_misconfigured(world.rt, "net-a", None, "admin kit signed by another CA")
    strayed = world.enqueue("strayed", net="fixed")
    world.add_stray(strayed, "fixed", "nv-9")
    free = world.enqueue("free", net="fixed")
    with world.rt.sessions() as session:
        assert job_detail(session, pinned)["waiting_for"] == (
            "net net-a is MISCONFIGURED: admin kit signed by another CA"
        )
        assert job_detail(session, strayed)["waiting_for"].startswith(
            "an earlier run of it on net fixed is not settled yet"
        )
        assert job_detail(session, free)["waiting_for"] is None


# --- callbacks: one undeliverable job holds back no other ----------------------------------


# --- a run the server reports finished while its start time cannot be read -----------------


def test_a_run_finished_while_the_start_time_cannot_be_read_is_settled_not_lost(world):
    # The simulator's sweep (seed 310): a restarted server answered job statuses but not its
    # start time; monitor took the run for lost, requeued it, and the job completed twice.
    from app.errors import ServerUnavailable

    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    admin = world.admin("net-a")
    world.server("net-a").statuses[world.job(job_id).nvflare_job_id] = "FINISHED:COMPLETED"

    def no_start_time() -> float:
        raise ServerUnavailable("server reported no start time")

    admin.server_start_time = no_start_time  # type: ignore[method-assign]
    world.clock.advance(world.rt.settings.server_lost_grace_s + 1)
    outcomes = monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.COMPLETED, outcomes
    assert outcomes == {str(job_id): "completed"}
    # No run is left unwatched: the net is not counted unreachable, nor its grace started.
    net = world.net("net-a")
    assert (net.unreachable_since, net.last_error) == (None, None)


def test_a_net_declared_again_takes_no_job_beside_the_run_it_was_removed_with(two_nets, tmp_path):
    # The simulator's sweep (seed 167): the job was failed without its run being counted,
    # and net-b, declared again, took the next job beside that run.
    world = two_nets
    running = world.enqueue("running", net="net-b")
    world.run_pipeline(running)
    reconciler.reconcile(_without_net_b(world, tmp_path))
    _ended_for_the_removed_net(world, running)
    nxt = world.enqueue("next", net="net-b")  # the redeploy is undone: net-b is back
    assert all(a.job_id != nxt for a in dispatch.assign_jobs(world.rt))
    assert world.job(nxt).state == JobState.QUEUED
