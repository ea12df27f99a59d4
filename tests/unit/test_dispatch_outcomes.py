"""What the dispatch step does once its submit returns: the server gets the job's prepared
copy (its sites, its resource spec); the step's result names the run, as does a warm
start's; the start time after the submit is the one the monitor compares against; a run
that lands for a job aborted meanwhile, or gone meanwhile, is asked to stop by the step
itself; a submit refused as misconfigured says why on the net."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from app import names
from app.errors import AdminMisconfigured
from app.usecases import abort, dispatch, monitor, records
from app.usecases.dispatch import Step, StepResult
from models import JobState, NetState, ReasonCode, StrayRun


def _ready(world, key: str = "j", **kw):
    job_id = world.enqueue(key, net="net-a", **kw)
    dispatch.claim_and_start(world.rt)
    assert dispatch.scale_up(world.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == Step.DONE
    return job_id


def test_the_server_is_sent_the_jobs_prepared_copy(world):
    spec = {"site-2": {"gpu": 1}}
    job_id = _ready(world, required_sites=["site-2"], metadata={"resource_spec": spec})
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0) == StepResult(Step.DONE, "nv-1")
    [folder] = world.server("net-a").folders
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["deploy_map"] == {"app": ["server", "site-2"]}
    assert meta["resource_spec"] == spec
    # And to the submit itself, for a backend with no meta.json (a Flower run's config).
    assert world.server("net-a").submit_args == [(("site-2",), spec)]


def test_a_warm_start_runs_the_whole_chain_and_names_the_run(world):
    first = world.enqueue("first", net="net-a")
    world.run_to_completion(first)
    job_id = world.enqueue("warm", net="net-a")
    [claim] = dispatch.claim_and_start(world.rt)
    assert dispatch.start(world.rt, job_id, "net-a", claim.attempt) == StepResult(
        Step.DISPATCHED, "nv-2"
    )


def test_a_server_that_restarted_before_the_submit_holds_the_run(world):
    """Readiness saw one server; the submit reached its successor: the successor's start
    time is recorded, so the monitor does not take the run for lost."""
    job_id = _ready(world)
    server = world.server("net-a")

    def restarted() -> None:
        server.restart(2000.0)

    server.on_submit = restarted
    dispatch.dispatch(world.rt, job_id, "net-a", 0)
    assert world.net("net-a").server_start_time == 2000.0
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING


def test_a_run_landing_for_a_job_aborted_meanwhile_is_stopped_by_the_step(world):
    job_id = _ready(world)
    server = world.server("net-a")

    def aborted_in_flight() -> None:
        with world.rt.sessions.begin() as session:
            records.abort_job(session, job_id, "user", world.clock())
        world.outbox.sent.clear()  # the abort's own messages are handled: no run id yet

    server.on_submit = aborted_in_flight
    result = dispatch.dispatch(world.rt, job_id, "net-a", 0)
    assert result == StepResult(Step.SKIPPED, "run nv-1 landed after the job moved on")
    assert world.job(job_id).nvflare_job_id == "nv-1"
    assert world.outbox.sent == [
        (names.ABORT_ON_SERVER, {"job_id": str(job_id)}),
        (names.SETTLE_STRAY_RUNS, {"net_name": "net-a"}),
    ]
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    assert server.aborted == ["nv-1"]


def test_a_run_landing_for_a_job_gone_meanwhile_is_kept_as_a_stray_naming_it(world):
    job_id = _ready(world)

    def failed_in_flight() -> None:
        with world.rt.sessions.begin() as session:
            records.finish_job(
                session,
                job_id,
                JobState.FAILED,
                "flip-api",
                world.clock(),
                code=ReasonCode.REPORTED_ERROR,
            )

    world.server("net-a").on_submit = failed_in_flight
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    with world.rt.sessions() as session:
        [stray] = session.scalars(select(StrayRun))
        assert (stray.job_id, stray.nvflare_job_id, stray.submit_token, stray.reason) == (
            job_id,
            "nv-1",
            f"{job_id}-0",
            "submit landed for a job that is FAILED",
        )
    assert (names.ABORT_ON_SERVER, {"job_id": str(job_id)}) in world.outbox.sent


def test_a_submit_refused_as_misconfigured_says_why_on_the_net(world):
    job_id = _ready(world)
    world.server("net-a").submit_error = AdminMisconfigured("admin kit rejected")
    with pytest.raises(AdminMisconfigured):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    net = world.net("net-a")
    assert (net.state, net.last_error) == (NetState.MISCONFIGURED, "admin kit rejected")


def test_a_late_readiness_step_that_meets_a_misconfigured_net_ends_quietly(world):
    """Seed 1025 (chaos): a wait_ready that stalled while its job was ASSIGNED resumes after
    a duplicate of it dispatched the job, and meets a broken admin kit. It marked nothing
    (the job is not its own any more): it must not raise (Celery's "raised unexpected") nor
    take the net of a running job out of service."""
    job_id = world.enqueue("j", net="net-a")
    [claim] = dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", claim.attempt)
    admin = world.admin("net-a")
    real = admin.is_ready

    def meanwhile(sites):
        admin.is_ready = real  # type: ignore[method-assign]
        assert dispatch.check_ready(world.rt, job_id, "net-a", 0).step == dispatch.Step.DONE
        assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == dispatch.Step.DONE
        raise AdminMisconfigured("admin kit rejected")

    admin.is_ready = meanwhile  # type: ignore[method-assign]

    result = dispatch.check_ready(world.rt, job_id, "net-a", 0)

    assert result.step == dispatch.Step.SKIPPED
    assert world.job(job_id).state == JobState.RUNNING
    assert world.net("net-a").state == NetState.BUSY


def _strays(world):
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def test_a_submit_that_lands_after_flip_api_ended_the_job_is_aborted(world):
    # tests/sim/FINDINGS.md, hole 6
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    dispatch.check_ready(world.rt, job_id, "net-a", 0)
    server = world.server("net-a")

    def flip_api_reports_error() -> None:
        with world.rt.sessions.begin() as session:
            records.finish_job(
                session,
                job_id,
                JobState.FAILED,
                "flip-api: error",
                world.clock(),
                code=ReasonCode.REPORTED_ERROR,
            )

    server.on_submit = flip_api_reports_error
    assert dispatch.dispatch(world.rt, job_id, "net-a", 0).step == Step.SKIPPED
    assert (names.SETTLE_STRAY_RUNS, {"net_name": "net-a"}) in world.outbox.sent
    assert len(_strays(world)) == 1
    assert dispatch.claim_and_start(world.rt) == []  # net-a takes no job while it is unsettled
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert server.aborted == ["nv-1"]
