"""How an abort ends: a run that had finished keeps its verdict, a run the server says is
over (or does not know) leaves nothing behind, and whatever may still be alive is kept as a
stray run until the server confirms it stopped; the queue is kicked once a net is free. A
completed run held for flip-api's report ends its aborted job ABORTED, and an abort that
lands between a monitor round's read and its verdict ends the job all the same."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app import names
from app.adapters.backend import AbortOutcome, AbortResult
from app.errors import ServerUnavailable, UnknownAdminError
from app.usecases import abort, dispatch, intake, monitor, reconciler
from models import JobEvent, JobState, NetState, StrayRun
from tests.unit.scale_history import scale_decisions

KICK = (names.ASSIGN_NEXT_JOB, {})


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _last_reason(world, job_id) -> str:
    with world.rt.sessions() as session:
        events = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all()
        return events[-1].reason


def _running(world, net: str = "net-a"):
    job_id = world.enqueue("j", net=net)
    world.run_pipeline(job_id)
    world.outbox.sent.clear()
    return job_id


def _aborting(world, job_id) -> None:
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING


@pytest.mark.parametrize(
    ("nvflare_status", "verdict"),
    [
        ("FINISHED:COMPLETED", JobState.COMPLETED),
        ("FINISHED:EXECUTION_EXCEPTION", JobState.FAILED),
        ("FINISHED:ABNORMAL", JobState.ABORTED),  # no verdict: the abort's
    ],
)
def test_a_run_that_finished_before_the_abort_keeps_its_verdict(world, nvflare_status, verdict):
    job_id = _running(world)
    world.server("net-a").statuses["nv-1"] = nvflare_status
    _aborting(world, job_id)
    assert abort.abort_on_server(world.rt, job_id) == verdict
    assert world.job(job_id).state == verdict
    assert _last_reason(world, job_id) == f"finished before abort: NVFLARE {nvflare_status}"
    assert world.net("net-a").state == NetState.READY
    assert KICK in world.outbox.sent
    assert world.server("net-a").aborted == []
    assert _strays(world) == []  # it ran (a start time): its end is proof, nothing held


def test_a_confirmed_abort_says_so(world):
    job_id = _running(world)
    _aborting(world, job_id)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    assert _last_reason(world, job_id) == "aborted on the server"
    assert world.server("net-a").aborted == ["nv-1"]
    assert _strays(world) == []
    assert KICK in world.outbox.sent


def test_a_finished_run_whose_verdict_cannot_be_read_is_aborted(world):
    job_id = _running(world)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    _aborting(world, job_id)

    def no_status(_: str):
        raise ServerUnavailable("gone again")

    world.admin("net-a").job_status = no_status  # type: ignore[method-assign]
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    assert _last_reason(world, job_id) == "finished before abort: gone again"


@pytest.mark.parametrize(
    ("status_now", "stray_kept"),
    [("RUNNING", True), ("FINISHED:ABORTED", False), (None, False)],
    ids=["still-running", "over", "unknown-to-the-server"],
)
def test_nothing_to_abort_is_believed_only_if_the_server_says_the_run_is_over(
    world, status_now, stray_kept
):
    job_id = _running(world)
    server = world.server("net-a")
    if status_now is None:
        del server.statuses["nv-1"]
    else:
        server.statuses["nv-1"] = status_now
    world.admin("net-a").abort = lambda _: AbortResult(  # type: ignore[method-assign]
        AbortOutcome.NOTHING_TO_ABORT, "not running"
    )
    _aborting(world, job_id)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    assert _last_reason(world, job_id) == "nothing to abort: not running"
    strays = _strays(world)
    assert [(s.job_id, s.nvflare_job_id, s.reason) for s in strays] == (
        [(job_id, "nv-1", "nothing to abort: not running")] if stray_kept else []
    )


def test_an_expired_abort_on_an_always_on_net_keeps_the_run_as_a_stray(world):
    job_id = _running(world, "fixed")
    world.admin("fixed").abort = _unconfirmed  # type: ignore[method-assign]
    _aborting(world, job_id)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING

    assert abort.expire_abort(world.rt, job_id) == JobState.ABORTED
    reason = f"abort not confirmed within {world.rt.settings.abort_timeout_s:.0f}s"
    assert _last_reason(world, job_id) == reason
    [stray] = _strays(world)
    assert (stray.net_name, stray.nvflare_job_id, stray.submit_token, stray.reason) == (
        "fixed",
        "nv-1",
        f"{job_id}-0",
        reason,
    )
    assert world.net("fixed").state not in (NetState.STOPPING, NetState.STOPPED)
    assert world.drivers.get("fixed") is None or world.drivers["fixed"].calls == []
    assert KICK in world.outbox.sent


def test_an_expired_abort_leaves_a_job_that_is_no_longer_aborting_alone(world):
    job_id = _running(world)
    assert abort.expire_abort(world.rt, job_id) == JobState.RUNNING
    assert _strays(world) == []


def _unconfirmed(_: str):
    raise UnknownAdminError("odd reply")


def _stray_on_fixed(world, *, nvflare_job_id: str | None, token: str | None):
    job_id = world.enqueue(f"stray-{nvflare_job_id}-{token}", net="fixed")
    world.add_stray(job_id, "fixed", nvflare_job_id, token)
    return job_id


def test_a_stray_known_only_by_its_token_is_found_and_aborted(world):
    server = world.server("fixed")
    server.submitted["tok-1"] = "nv-9"
    server.statuses["nv-9"] = "RUNNING"
    _stray_on_fixed(world, nvflare_job_id=None, token="tok-1")
    assert abort.settle_stray_runs(world.rt, "fixed") == 0
    assert server.aborted == ["nv-9"]
    assert _strays(world) == []


def test_a_stray_whose_abort_has_not_taken_effect_yet_is_kept(world):
    server = world.server("fixed")
    server.statuses["nv-9"] = "RUNNING"
    _stray_on_fixed(world, nvflare_job_id="nv-9", token=None)
    accepted = []
    world.admin("fixed").abort = lambda run: (  # type: ignore[method-assign]
        accepted.append(run) or AbortResult(AbortOutcome.ABORTED)
    )
    world.outbox.sent.clear()
    assert abort.settle_stray_runs(world.rt, "fixed") == 1
    assert accepted == ["nv-9"]
    assert len(_strays(world)) == 1
    assert KICK not in world.outbox.sent  # nothing was freed
    server.statuses["nv-9"] = "FINISHED:ABORTED"  # it stopped meanwhile
    assert abort.settle_stray_runs(world.rt, "fixed") == 0
    assert KICK in world.outbox.sent


def test_strays_of_a_silent_server_are_kept_and_the_others_settled(world):
    server = world.server("fixed")
    server.statuses["nv-9"] = "RUNNING"
    _stray_on_fixed(world, nvflare_job_id="nv-9", token=None)
    _stray_on_fixed(world, nvflare_job_id=None, token=None)  # nothing to look for
    server.up = False
    world.outbox.sent.clear()
    assert abort.settle_stray_runs(world.rt, "fixed") == 1  # only the one without a run went
    assert [s.nvflare_job_id for s in _strays(world)] == ["nv-9"]
    assert KICK in world.outbox.sent
    world.outbox.sent.clear()
    assert abort.settle_stray_runs(world.rt, "fixed") == 1
    assert KICK not in world.outbox.sent
    server.up = True
    assert abort.settle_stray_runs(world.rt, "fixed") == 0
    assert dispatch.claim_and_start(world.rt) != []  # the net takes jobs again


def test_a_stray_the_server_has_never_heard_of_is_forgotten(world):
    _stray_on_fixed(world, nvflare_job_id="nv-unknown", token=None)
    assert abort.settle_stray_runs(world.rt, "fixed") == 0
    assert _strays(world) == []


def test_a_stray_another_round_forgot_meanwhile_counts_as_settled(world):
    """Two settle rounds at once (a kick's and beat's): a stray the other round forgot while
    this one asked the server is not counted as left, and its net is freed for the queue."""
    server = world.server("fixed")
    server.statuses["nv-9"] = "RUNNING"
    _stray_on_fixed(world, nvflare_job_id="nv-9", token=None)
    admin = world.admin("fixed")
    real_abort = admin.abort

    def abort_while_another_round_settles(run_id: str) -> AbortResult:
        with world.rt.sessions.begin() as session:
            for stray in session.scalars(select(StrayRun)):
                session.delete(stray)
        return real_abort(run_id)

    admin.abort = abort_while_another_round_settles  # type: ignore[method-assign]
    world.outbox.sent.clear()
    assert abort.settle_stray_runs(world.rt, "fixed") == 0
    assert KICK in world.outbox.sent


def test_every_stray_a_silent_server_holds_is_counted(world):
    server = world.server("fixed")
    for run in ("nv-8", "nv-9"):
        server.statuses[run] = "RUNNING"
        _stray_on_fixed(world, nvflare_job_id=run, token=None)
    server.up = False
    assert abort.settle_stray_runs(world.rt, "fixed") == 2


def test_an_expired_abort_on_a_scale_to_zero_net_takes_the_server_down(world):
    job_id = _running(world)
    world.admin("net-a").abort = _unconfirmed  # type: ignore[method-assign]
    _aborting(world, job_id)
    abort.abort_on_server(world.rt, job_id)
    assert abort.expire_abort(world.rt, job_id) == JobState.ABORTED
    assert world.driver("net-a").replicas == 0
    assert scale_decisions(world, "net-a")[-1] == (0, f"run of job {job_id} could not be aborted")
    assert _strays(world) == []  # gone with the server


@pytest.mark.parametrize("error", [ServerUnavailable("reply lost"), UnknownAdminError("odd")])
@pytest.mark.parametrize("failing", ["abort", "find_run"])
def test_a_stray_whose_abort_or_search_fails_is_kept(world, error, failing):
    """An abort or a run search that errors says nothing about the run: it stays a stray."""
    server = world.server("fixed")
    server.submitted["tok-1"] = "nv-9"
    server.statuses["nv-9"] = "RUNNING"
    _stray_on_fixed(world, nvflare_job_id=None, token="tok-1")

    def fails(_: str):
        raise error

    setattr(world.admin("fixed"), failing, fails)
    world.outbox.sent.clear()
    assert abort.settle_stray_runs(world.rt, "fixed") == 1
    assert len(_strays(world)) == 1
    assert KICK not in world.outbox.sent


def test_aborting_ends_within_the_abort_timeout_and_takes_the_server_down(world):
    # tests/sim/FINDINGS.md, hole 10
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)

    def unknown(_: str):
        raise UnknownAdminError("odd reply")

    world.admin("net-a").abort = unknown  # type: ignore[method-assign]
    assert world.abort(job_id) == JobState.ABORTING
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    reconciler.reconcile(world.rt)
    job = world.job(job_id)
    assert (job.state == JobState.ABORTED and "not confirmed" in (job.last_error or "")) or (
        job.state == JobState.ABORTED
    )
    assert world.driver("net-a").replicas == 0
    assert world.net("net-a").state == NetState.STOPPED


def test_an_abort_the_server_did_not_hear_leaves_a_stray_run_not_a_second_job_beside_it(world):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").up = False  # a blip: the admin side cannot reach the server
    assert world.abort(job_id) == JobState.ABORTED  # no error reaches the caller
    assert [s.nvflare_job_id for s in _strays(world)] == ["nv-1"]
    world.enqueue("next", net="net-a")
    assert dispatch.claim_and_start(world.rt) == []  # not beside a run that may still go on
    world.server("net-a").up = True
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert world.server("net-a").aborted == ["nv-1"]
    assert [a.net_name for a in dispatch.claim_and_start(world.rt)] == ["net-a"]


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
    assert dispatch.claim_and_start(world.rt) == []
