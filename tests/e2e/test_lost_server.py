"""The server lost between readiness and submit, on the lifecycle stack (tests/e2e/
lifecycle_stack.py) of this module's own: the case waits out the product's bound on an
unknown submit outcome (RETRY_MAX x (backoff + one submit try) + STUCK_AFTER_S, re-sent
meanwhile), about 100 s, so it runs beside test_lifecycle.py rather than after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from app.db import unit_of_work
from app.local.stack import NET, LocalStack
from app.runtime import Runtime
from app.schemas import EnqueueJob
from app.usecases import dispatch, enqueue
from models import JobEvent, JobState
from tests.e2e.lifecycle_stack import (
    RUN_S,
    lifecycle_database,
    lifecycle_stack,
    private_broker,
    wait_scaled_to_zero,
    wait_state,
)

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

EXPECTED_S = 170  # seconds on the 2-core CI machine (tests/tools/schedule.py)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    with (
        lifecycle_database("fld_e2e_lost") as database,
        private_broker(tmp_path_factory.mktemp("redis")) as broker_url,
        lifecycle_stack(tmp_path_factory.mktemp("e2e"), database, broker_url) as running,
    ):
        yield running


def test_server_lost_between_readiness_and_submit_requeues_then_completes(stack):
    """The worker is stopped, the first two steps run here against the real server, the
    server dies, then the worker gets the dispatch step: it fails transiently, retries,
    runs out; the submit's outcome is unknown, so the attempt is abandoned only once the
    reconciler has settled its token (the net is taken down), then the job is requeued (never
    deleted) and completes on a later attempt."""
    wait_scaled_to_zero(stack)
    stack.stop_worker()
    assert stack.settings is not None
    rt = Runtime.from_settings(stack.settings)
    try:
        with unit_of_work(rt.sessions) as session:
            job_id = enqueue.enqueue_job(
                session,
                stack.settings,
                EnqueueJob(caller_key="e2e-lost", definition="tiny-fedavg", net=NET),
                rt.clock(),
            ).job_id
        [_claim] = dispatch.claim_and_start(rt)
        assert dispatch.scale_up(rt, job_id, NET, 0).step == dispatch.Step.DONE

        def ready() -> bool:
            return dispatch.check_ready(rt, job_id, NET, 0).step == dispatch.Step.DONE

        stack.wait_for("the real server to be ready", ready, RUN_S, poll_s=0.5)
    finally:
        rt.close()
    stack.driver().scale(0)  # the server is gone between readiness and submit
    stack.start_worker()
    stack.client.app.send_task(
        "fl_dispatcher.dispatch",
        kwargs={"job_id": str(job_id), "net_name": NET, "attempt": 0},
        queue="fl_dispatcher",
    )
    job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED)
    assert job.state == JobState.COMPLETED, job.last_error
    assert job.attempts == 1
    assert job.retries >= 1
    history = stack.read(
        lambda s: [
            (str(e.from_state), str(e.to_state))
            for e in s.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
        ]
    )
    assert ("DISPATCHING", "QUEUED") in history
    wait_scaled_to_zero(stack)
