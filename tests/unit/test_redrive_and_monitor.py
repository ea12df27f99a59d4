"""What reconcile's re-drive and the monitor report, and when, to the second: a job stuck in
ASSIGNED is requeued (on a net the process does not declare, past STUCK_AFTER_S alone), a
DISPATCHING one's submit re-sent (a worker that died copying the bundle held it for one try)
then abandoned, an ABORTING one's abort re-sent then expired, each only once strictly past
its margin and each saying why, a submit still held holding back no other job; a FINISHING
job's report wait expires strictly past REPORT_TIMEOUT_S with the configured outcome; the
monitor's result has a verdict for every watched job, one whose net's round crashed
included, and a server that answered again gets a fresh grace next time."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from app import names
from app.adapters.backend import Readiness, ServerState
from app.parallel import ProbeResult, Sequential
from app.runtime import Runtime
from app.settings import Settings
from app.usecases import dispatch, monitor, reconciler, records, retries, step_leases, views
from app.usecases.dispatch import Step
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, dispatch_through_a_start_time_blip, world_of


def _world(tmp_path, job_root, sqlite_factory, clock, **extra) -> World:
    nets = [net_decl(tmp_path, n, "ecs") for n in ("net-a", "net-b")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, **extra)


def _running_on_each_net(world) -> tuple[str, str]:
    """A running job on net-a and one on net-b: their ids."""
    a = world.enqueue("a", net="net-a")
    world.run_pipeline(a)
    b = world.enqueue("b", net="net-b")
    world.run_pipeline(b)
    return a, b


def _redriven(world) -> tuple[str, ...]:
    return reconciler.reconcile(world.rt).redriven


def test_a_job_stuck_in_assigned_is_requeued_strictly_past_its_margin(world):
    """The backstop: a job whose re-driven chains never get anywhere (each message lost)."""
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)  # its chain is lost, and every re-driven one too
    margin = world.rt.settings.net("net-a").ready_timeout_s + world.rt.settings.stuck_after_s
    world.clock.advance(margin)
    assert _redriven(world) == (f"{job_id}: pipeline re-driven",)
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: requeued",)
    job = world.job(job_id)
    assert (job.state, job.last_error) == (
        JobState.QUEUED,
        f"stuck in ASSIGNED for {margin + 1:.0f}s",
    )


def _polling(world, job_id: str) -> None:
    """Claimed, scaled up, one readiness poll answered "not ready" (its server is still
    coming): the chain would poll again after READY_POLL_S."""
    world.server("net-a").up = False
    dispatch.claim_and_start(world.rt)
    assert dispatch.scale_up(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.NOT_READY


def _pipelines_sent(world, job_id: str) -> list[dict[str, object]]:
    sent = world.outbox.sent
    return [kw for task, kw in sent if task == "pipeline" and kw["job_id"] == str(job_id)]


def test_a_chain_whose_worker_died_polling_readiness_is_re_driven_strictly_past_the_poll_lease(
    world,
):
    """The worker dies between two readiness polls (its countdown message held unacked, so
    Redis hands it out again only after hours): the monitor round, every
    HOUSEKEEPING_INTERVAL_S, starts the chain again for the same attempt one poll lease
    after the last poll began, once, never requeueing the job."""
    job_id = world.enqueue("j", net="net-a")
    _polling(world, job_id)
    claimed = len(_pipelines_sent(world, job_id))
    world.clock.advance(step_leases.poll_lease_s(world.rt.settings))
    assert str(job_id) not in monitor.monitor_running_jobs(world.rt)
    world.clock.advance(1)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "pipeline re-driven"
    assert _pipelines_sent(world, job_id)[claimed:] == [
        {"job_id": str(job_id), "net_name": "net-a", "attempt": 0}
    ]
    # The re-drive holds the job: neither the next monitor round nor reconcile sends another.
    assert str(job_id) not in monitor.monitor_running_jobs(world.rt)
    assert _redriven(world) == ()
    job = world.job(job_id)
    assert (job.state, job.attempts) == (JobState.ASSIGNED, 0)
    # The re-driven chain takes it from there, on the server that kept starting.
    world.server("net-a").up = True
    assert dispatch.start(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert world.job(job_id).state == JobState.RUNNING


def test_a_re_drive_the_broker_refuses_says_so_and_is_tried_again_after_its_lease(
    world, monkeypatch
):
    """A broker down when the lapsed chain is re-driven: the round says the broker refused
    it (not "re-driven"), and the round after the new lease lapses tries again."""
    job_id = world.enqueue("j", net="net-a")
    _polling(world, job_id)
    monkeypatch.setattr(world.outbox, "start_pipeline", lambda *_a: False)
    lease = step_leases.poll_lease_s(world.rt.settings)
    world.clock.advance(lease + 1)
    verdict = monitor.monitor_running_jobs(world.rt)[str(job_id)]
    assert verdict == "pipeline re-driven: the broker refused it"
    monkeypatch.undo()
    claimed = len(_pipelines_sent(world, job_id))
    world.clock.advance(step_leases.handoff_lease_s(world.rt.settings) + 1)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "pipeline re-driven"
    assert len(_pipelines_sent(world, job_id)) == claimed + 1


def test_with_the_defaults_a_dead_workers_job_is_re_driven_within_a_minute():
    """app/usecases/README.md's bound: the longest lease between two of a step's writes plus
    one monitor round, with every default."""
    settings = Settings(NETS="[]")
    assert step_leases.redrive_bound_s(settings) <= 60


def test_a_chain_lost_before_its_first_step_is_re_driven_strictly_past_the_hand_off(world):
    """A claim's chain never reached a worker (a lost message, a worker killed holding it):
    re-driven one hand-off lease after the claim, not at the readiness deadline."""
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    world.clock.advance(step_leases.handoff_lease_s(world.rt.settings))
    assert _redriven(world) == ()
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: pipeline re-driven",)


def test_a_worker_killed_inside_scale_up_is_re_driven_strictly_past_one_try(world, monkeypatch):
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)

    class WorkerDied(BaseException):
        """SIGKILL while the bundle is fetched."""

    def die(*args, **kwargs):
        raise WorkerDied

    monkeypatch.setattr(dispatch, "materialize", die)
    with pytest.raises(WorkerDied):
        dispatch.scale_up(world.rt, job_id, "net-a", 0)
    world.clock.advance(step_leases.step_try_s(world.rt.settings))
    assert _redriven(world) == ()
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: pipeline re-driven",)


def test_a_step_waiting_its_retry_countdown_is_never_re_driven_beside_itself(world):
    """scale_up failed transiently and its task scheduled a retry in 60 s (count_retry
    records it): the job is left alone until that retry would have started and run one try,
    then re-driven (the retry's message was lost with its worker)."""
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    retries.count_retry(world.rt, uuid.UUID(str(job_id)), next_try_in_s=60)
    world.clock.advance(60 + step_leases.step_try_s(world.rt.settings))
    assert str(job_id) not in monitor.monitor_running_jobs(world.rt)
    assert _redriven(world) == ()
    world.clock.advance(1)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "pipeline re-driven"


def test_a_job_claimed_onto_a_net_this_process_lacks_is_requeued_strictly_past_the_margin(
    tmp_path, job_root, sqlite_factory, clock
):
    """Mid rolling deploy, a process that does not declare the job's net knows no readiness
    deadline for it (and its chain's steps end at once there): the job counts as stuck
    strictly past STUCK_AFTER_S alone."""
    world = _world(tmp_path, job_root, sqlite_factory, clock, STUCK_AFTER_S=60)
    job_id = world.enqueue("j", net="net-b")
    dispatch.claim_and_start(world.rt)
    old = _process_declaring_only_net_a(world, tmp_path, STUCK_AFTER_S=60)
    world.clock.advance(60)
    assert reconciler.reconcile(old).redriven == ()
    world.clock.advance(1)
    assert reconciler.reconcile(old).redriven == (f"{job_id}: requeued",)
    assert world.job(job_id).state == JobState.QUEUED


def _process_declaring_only_net_a(world: World, tmp_path, **extra) -> Runtime:
    """Another process on the same database whose NETS declare net-a only (net-b is not
    counted removed: the world's process declared it within the grace)."""
    settings = Settings(
        **{
            "FL_DISPATCHER_DATA_DIR": tmp_path / "data",
            "JOB_ROOT": world.rt.settings.job_root,
            "NETS": json.dumps([net_decl(tmp_path, "net-a", "ecs")]),
            "PER_JOB_FL_SERVER": "true",
        }
        | extra
    )
    return Runtime(
        settings=settings,
        engine=world.rt.engine,
        sessions=world.rt.sessions,
        clock=world.clock,
        driver_factory=lambda net, s: world.driver(net.name),
        admin_factory=lambda net, s: world.admin(net.name),
        outbox=world.outbox,
    )


def test_a_submit_whose_worker_died_preparing_its_copy_is_re_sent_strictly_past_one_try(
    world, monkeypatch
):
    """The dispatch step holds its job for one submit try from its start, before it fetches
    and copies the bundle: a worker that dies there is left alone that long, then re-sent."""
    job_id = world.enqueue("j", net="net-a")
    net, attempt = world.run_until_ready(job_id)

    class WorkerDied(BaseException):
        """SIGKILL while the bundle is copied."""

    def die(*args, **kwargs):
        raise WorkerDied

    monkeypatch.setattr(dispatch, "prepare", die)
    with pytest.raises(WorkerDied):
        dispatch.dispatch(world.rt, job_id, net, attempt)
    assert world.job(job_id).state == JobState.DISPATCHING
    world.clock.advance(retries.submit_try_s(world.rt.settings))  # exactly one try
    assert _redriven(world) == ()
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: dispatch re-sent",)


def test_a_submit_still_held_holds_back_no_other_stuck_job(
    tmp_path, job_root, sqlite_factory, clock
):
    nets = [net_decl(tmp_path, n, "ecs") for n in ("net-a", "net-b", "net-c")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    # A held one first and last, whatever order the round reads them in.
    held = [world.stuck_in_dispatching("held-1", net="net-a")]
    gone = world.stuck_in_dispatching("gone", net="net-b")
    held.append(world.stuck_in_dispatching("held-2", net="net-c"))
    with world.rt.sessions.begin() as session:
        for job_id in held:  # a worker holds each submit for another hour
            records.get_job(session, job_id).step_due_at = world.clock() + timedelta(hours=1)
        records.get_job(session, gone).step_due_at = None  # nobody holds this one
    world.clock.advance(1)
    assert _redriven(world) == (f"{gone}: dispatch re-sent",)


def test_a_stuck_submit_is_re_sent_then_abandoned_each_strictly_past_its_margin(world):
    job_id = world.stuck_in_dispatching("j")  # the submit is never heard of again
    settings = world.rt.settings
    try_s = retries.submit_try_s(settings)
    retries.count_retry(world.rt, job_id, next_try_in_s=60)  # its last word: a retry
    world.clock.advance(60 + try_s)  # exactly when it had to be heard of again
    assert _redriven(world) == ()
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: dispatch re-sent",)
    # The re-sent submit holds the job in turn, until it too would have been heard of.
    world.clock.advance(step_leases.handoff_lease_s(settings))
    assert _redriven(world) == ()
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: dispatch re-sent",)
    # Abandoned strictly past every try and wait its retries could take, plus the margin.
    give_up_s = settings.retry_max * (settings.retry_backoff_max_s + try_s) + settings.stuck_after_s
    with world.rt.sessions.begin() as session:
        job = records.get_job(session, job_id)
        job.step_due_at = None  # nobody holds it
        age_s = (world.clock() - job.state_changed_at).total_seconds()
    world.clock.advance(give_up_s - age_s)
    assert _redriven(world) == (f"{job_id}: dispatch re-sent",)
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).step_due_at = None
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: dispatch abandoned, token settled",)
    job = world.job(job_id)
    assert (job.state, job.last_error) == (
        JobState.QUEUED,
        f"submit outcome unknown for {give_up_s + 1:.0f}s",
    )


def test_a_stuck_abort_is_re_sent_then_expired_each_strictly_past_its_margin(
    tmp_path, job_root, sqlite_factory, clock
):
    world = _world(tmp_path, job_root, sqlite_factory, clock, ABORT_TIMEOUT_S=3600)
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False  # the abort is never heard
    with world.rt.sessions.begin() as session:
        records.abort_job(session, job_id, "user", world.clock())
    # Re-sent each round once it is one housekeeping interval old (not STUCK_AFTER_S: with
    # both it and ABORT_TIMEOUT_S at 300 s it was never re-sent; review 21b).
    interval = world.rt.settings.housekeeping_interval_s
    world.clock.advance(interval)
    assert _redriven(world) == ()
    world.clock.advance(1)
    world.outbox.sent.clear()
    assert _redriven(world) == (f"{job_id}: abort re-sent",)
    assert (names.ABORT_ON_SERVER, {"job_id": str(job_id)}) in world.outbox.sent
    world.clock.advance(3600 - interval - 1)  # exactly the timeout
    assert _redriven(world) == (f"{job_id}: abort re-sent",)
    world.clock.advance(1)
    assert _redriven(world) == (f"{job_id}: abort expired",)


def _finishing(world, key: str = "j"):
    job_id = world.enqueue(key, net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    assert monitor.monitor_running_jobs(world.rt) == {
        str(job_id): "finishing: waiting for flip-api's results report"
    }
    return job_id


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_a_report_wait_expires_strictly_past_the_timeout_as_configured(
    tmp_path, job_root, sqlite_factory, clock, outcome
):
    world = _world(
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        RELEASE_AFTER="reported",
        REPORT_TIMEOUT_OUTCOME=outcome,
    )
    # Older than the timeout, never FINISHING (claimed, its chain never run: re-driven).
    old = world.enqueue("old-and-queued", net="net-b")
    job_id = _finishing(world)
    with world.rt.sessions() as session:
        history = views.job_detail(session, job_id).history
    assert history[-1].reason == (
        "NVFLARE FINISHED:COMPLETED; holding the server for results upload"
    )
    world.clock.advance(world.rt.settings.report_timeout_s)
    assert monitor.monitor_running_jobs(world.rt) == {str(old): "pipeline re-driven"}
    world.clock.advance(1)
    target = JobState(outcome.upper())
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): f"report timeout: {target}"}
    assert world.job(job_id).state == target


def test_every_watched_job_has_a_verdict_a_crashed_nets_too(
    tmp_path, job_root, sqlite_factory, clock
):
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    a, b = _running_on_each_net(world)

    def boom() -> float:
        raise RuntimeError("bug")

    world.admin("net-a").server_start_time = boom  # type: ignore[method-assign]
    assert monitor.monitor_running_jobs(world.rt) == {
        str(a): "monitor failed (see the net's last_error)",
        str(b): "running",
    }
    assert world.net("net-a").last_error == "monitor_running_jobs: RuntimeError: bug"
    assert world.net("net-b").last_error is None


def test_a_server_that_answered_again_gets_a_fresh_grace(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    grace = world.rt.settings.server_lost_grace_s
    world.server("net-a").up = False
    monitor.monitor_running_jobs(world.rt)  # unreachable from now
    world.clock.advance(grace - 1)
    world.server("net-a").up = True
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "running"}
    world.clock.advance(grace - 1)
    world.server("net-a").up = False
    monitor.monitor_running_jobs(world.rt)  # quiet again: a new grace starts here
    world.clock.advance(grace - 1)
    assert world.job(job_id).state == JobState.RUNNING
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)].startswith(
        "server not answering for"
    )
    assert world.job(job_id).state == JobState.RUNNING


def test_a_start_time_unknown_at_dispatch_is_learnt_by_the_monitor(world):
    """Neither readiness nor the submit could tell the server's start time: the monitor
    learns it, so a restart under the job is still seen."""
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    admin = world.admin("net-a")
    admin.is_ready = lambda sites: Readiness(  # type: ignore[method-assign]
        True, ServerState.STARTED, ("site-1", "site-2"), (), server_start_time=None
    )
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    dispatch_through_a_start_time_blip(world, job_id)
    assert world.net("net-a").server_start_time is None
    assert monitor.monitor_running_jobs(world.rt) == {str(job_id): "running"}
    assert world.net("net-a").server_start_time == 1000.0
    world.server("net-a").restart(2000.0)  # the server restarted under the job
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.QUEUED


class _NetAHangs(Sequential):
    """A round in which net-a's server hangs past the round's deadline (as Prober reports it),
    noting the deadline each round was given."""

    def __init__(self) -> None:
        self.deadlines: list[float] = []

    def run(self, calls, timeout_s):
        self.deadlines.append(timeout_s)
        results = super().run({k: c for k, c in calls.items() if k != "net-a"}, timeout_s)
        return results | {"net-a": ProbeResult(error="probe timed out")}


def test_a_net_whose_round_outlived_its_deadline_has_its_jobs_reported_not_watched(
    tmp_path, job_root, sqlite_factory, clock
):
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    a, b = _running_on_each_net(world)
    world.rt.fan_out = hangs = _NetAHangs()
    assert monitor.monitor_running_jobs(world.rt) == {
        str(a): "not watched this round: probe timed out",
        str(b): "running",
    }
    # a round waits out one admin command on a hung server, and a little more
    assert hangs.deadlines[0] > world.rt.settings.admin_command_timeout_s


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
        retries.count_retry(world.rt, job_id, next_try_in_s=60)
        world.outbox.sent.clear()
        reconciler.reconcile(world.rt)
        assert not [t for t, _ in world.outbox.sent if t == "fl_dispatcher.dispatch"]
        assert world.job(job_id).state == JobState.DISPATCHING


def _live_runs(world: World, net: str) -> list[str]:
    server = world.server(net)
    return sorted(run for run, status in server.statuses.items() if status == "RUNNING")


def test_a_live_submit_holder_is_never_taken_for_gone_and_abandoned(world, monkeypatch):
    """A job is DISPATCHING for a while (its earlier submits went unanswered); reconcile
    re-sends its dispatch. That dispatch takes its lease (`submit_try_s`: login + command +
    15 s) and then prepares the bundle copy, which for a large bundle takes longer than the
    lease (here 40 s). Reconcile, seeing the lease over and the job past its budget, takes the
    live holder for gone, finds no run for the token (it has not been sent yet) and requeues
    the job; its next attempt runs. Then the holder's submit goes out with the old token and
    a second live run of the same job lands.

    Breaks: "At most one live run per job, whatever fails" (the commit: "a worker that died
    is known gone within about 50 s": here a worker that did not die is taken for gone)."""
    job_id = world.stuck_in_dispatching("slow-prepare")
    world.clock.advance(850)  # under the abandon age (retry budget + STUCK_AFTER_S: 870 s)
    reconciler.reconcile(world.rt)  # holder gone (no lease): dispatch re-sent
    resent = {"job_id": str(job_id), "net_name": "net-a", "attempt": 0}
    assert ("fl_dispatcher.dispatch", resent) in world.outbox.sent
    real_prepare = dispatch.prepare
    seen: list = []

    def slow_prepare(*args, **kwargs):
        folder = real_prepare(*args, **kwargs)
        if not seen:
            seen.append(True)
            world.clock.advance(40)  # copying a large bundle
            reconciler.reconcile(world.rt)  # the round that runs meanwhile
            if world.job(job_id).state == JobState.QUEUED:
                world.run_pipeline(job_id)  # its next attempt, on the freed net
        return folder

    monkeypatch.setattr(dispatch, "prepare", slow_prepare)
    dispatch.dispatch(world.rt, job_id, "net-a", 0)  # the re-sent message
    runs = _live_runs(world, "net-a")
    assert len(runs) <= 1, f"two live runs of one job: {runs}"
