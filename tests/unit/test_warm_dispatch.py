"""A warm net's job goes to RUNNING in one task: the chain's first step finds the server up
and ready and submits the job itself, ending the chain. Everything else keeps the chain:
a cold net, a site missing, a step of an older attempt. Tasks run as functions with a
`retry` that raises Celery's Retry, as in test_tasks.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from celery.exceptions import Retry

from app import names
from app.errors import ServerUnavailable
from app.usecases import abort, dispatch, monitor, retries
from app.usecases.dispatch import Step
from models import JobState, NetState
from tasks import base
from tasks.registered import TASKS

CHAIN = ["wait_ready", "dispatch"]  # what Celery keeps in the request of a chain's step


@pytest.fixture
def rt(world):
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


@contextmanager
def chain_request() -> Iterator[object]:
    """The scale_up task's request, as Celery gives it to the first step of a chain."""
    TASKS[names.SCALE_UP].push_request(chain=list(CHAIN), retries=0)
    try:
        yield TASKS[names.SCALE_UP].request
    finally:
        TASKS[names.SCALE_UP].pop_request()


def warm_net(world) -> None:
    """net-a READY with its server up: one job ran on it and finished."""
    first = world.enqueue("warm-up", net="net-a")
    world.run_pipeline(first)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.net("net-a").state == NetState.READY


def claim(world, key: str) -> uuid.UUID:
    job_id = world.enqueue(key, net="net-a")
    TASKS[names.ASSIGN_NEXT_JOB].run()
    assert world.job(job_id).state == JobState.ASSIGNED
    return job_id


def test_a_warm_nets_job_goes_to_running_in_one_task_and_ends_its_chain(rt):
    warm_net(rt)
    job_id = claim(rt, "warm")

    with chain_request() as request:
        assert TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a") == "dispatched"
        assert request.chain is None  # wait_ready and dispatch never run

    job = rt.job(job_id)
    assert job.state == JobState.RUNNING
    assert job.nvflare_job_id == "nv-2"
    assert rt.net("net-a").state == NetState.BUSY
    assert rt.driver("net-a").calls == [1]  # the warm-up's scale-up only


def test_a_cold_net_keeps_the_chain_for_wait_ready_and_dispatch(rt):
    job_id = claim(rt, "cold")

    with chain_request() as request:
        assert TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a") == "done"
        assert request.chain == CHAIN

    assert rt.job(job_id).state == JobState.ASSIGNED
    assert rt.driver("net-a").calls == [1]
    assert rt.server("net-a").submitted == {}


def test_a_warm_net_missing_a_site_leaves_the_wait_to_wait_ready(rt):
    warm_net(rt)
    job_id = rt.enqueue("needs-site-9", net="net-a", required_sites=["site-9"])
    TASKS[names.ASSIGN_NEXT_JOB].run()

    with chain_request() as request:
        assert TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a") == "not_ready"
        assert request.chain == CHAIN  # wait_ready polls on with its countdown

    assert rt.job(job_id).state == JobState.ASSIGNED
    rt.server("net-a").sites.append("site-9")
    assert dispatch.check_ready(rt.rt, job_id, "net-a", 0).step == Step.DONE
    assert dispatch.dispatch(rt.rt, job_id, "net-a", 0).step == Step.DONE
    assert rt.job(job_id).state == JobState.RUNNING


def test_a_transient_submit_failure_retries_the_step_which_resumes_with_the_same_token(rt):
    warm_net(rt)
    job_id = claim(rt, "flaky")
    server = rt.server("net-a")
    server.submit_error = ServerUnavailable("reply lost")

    with (
        chain_request(),
        mock.patch.object(TASKS[names.SCALE_UP], "retry", side_effect=Retry()) as retry,
        pytest.raises(Retry),
    ):
        TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a")
    assert isinstance(retry.call_args.kwargs["exc"], ServerUnavailable)
    job = rt.job(job_id)
    assert (job.state, job.submit_token) == (JobState.DISPATCHING, f"{job_id}-0")

    server.submit_error = None
    with chain_request() as request:
        assert TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a") == "dispatched"
        assert request.chain is None
    job = rt.job(job_id)
    assert job.state == JobState.RUNNING
    assert server.submitted[f"{job_id}-0"] == job.nvflare_job_id
    assert sum(1 for token in server.submitted if token.startswith(str(job_id))) == 1


def test_a_step_of_an_older_attempt_never_submits_the_next_one(rt):
    warm_net(rt)
    job_id = claim(rt, "requeued")
    retries.requeue_after_transient(rt.rt, job_id, "the net failed", net_name="net-a", attempt=0)
    TASKS[names.ASSIGN_NEXT_JOB].run()
    assert (rt.job(job_id).state, rt.job(job_id).attempts) == (JobState.ASSIGNED, 1)

    with chain_request() as request:
        # The first attempt's step, delivered late: skipped, chain ended, nothing submitted.
        assert TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a", attempt=0) == (
            "skipped"
        )
        assert request.chain is None
    assert not any(t.startswith(str(job_id)) for t in rt.server("net-a").submitted)
    assert rt.job(job_id).state == JobState.ASSIGNED

    with chain_request():
        assert TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a", attempt=1) == (
            "dispatched"
        )
    assert rt.server("net-a").submitted[f"{job_id}-1"] == rt.job(job_id).nvflare_job_id


def test_a_stopped_report_while_the_submit_is_in_flight_holds_the_net_until_the_abort(rt):
    """flip-api reports "stopped" while the submit is on the wire: the job goes ABORTING,
    not ABORTED, so its net is not handed to the next job (whose submit would share the
    server with this run once it lands) until the run is aborted."""
    warm_net(rt)
    job_id = claim(rt, "stopped-in-flight")
    waiting = rt.enqueue("next", net="net-a")
    server = rt.server("net-a")
    claimed_meanwhile: list[object] = []

    def flip_api_stops_it() -> None:
        TASKS[names.REPORT_JOB_STATUS].run(payload={"job_id": str(job_id), "status": "stopped"})
        claimed_meanwhile.extend(dispatch.claim_and_start(rt.rt))

    server.on_submit = flip_api_stops_it
    TASKS[names.SCALE_UP].run(job_id=str(job_id), net_name="net-a")

    assert claimed_meanwhile == []
    job = rt.job(job_id)
    assert job.state == JobState.ABORTING
    assert ("fl_dispatcher.abort_on_server", {"job_id": str(job_id)}) in rt.outbox.sent
    assert abort.abort_on_server(rt.rt, job_id) == JobState.ABORTED
    assert server.aborted == [job.nvflare_job_id]
    [next_claim] = dispatch.claim_and_start(rt.rt)
    assert next_claim.job_id == waiting
