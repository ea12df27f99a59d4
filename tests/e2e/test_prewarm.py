"""Prewarm on the real stack (tasks/README.md "Prewarm"): a real Celery worker and a separate beat,
Redis, PostgreSQL, the local driver and a real NVFLARE server with two sites. flip-api's
hint (a plain Celery task) brings the server up and holds it past the normal idle grace; a
job sent within the hint runs on that warm server; a hint with no job releases the server
at T + grace."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select

from app.local.stack import NET, LocalStack, StackOptions
from app.schemas import PrewarmNet
from models import Job, JobEvent, JobState, NetEvent, NetState, Prewarm, PrewarmOutcome, ScaleEvent
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

EXPECTED_S = 85  # seconds on the 2-core CI machine (tests/tools/schedule.py)

GRACE_S = 4.0
INTERVAL_S = 1.0
WAIT_S = 240  # generous for a busy 2-core machine; the figures are printed


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    redis = PrivateRedis(tmp_path_factory.mktemp("redis"))
    redis.start()
    try:
        with fresh_pg_database("fld_e2e_prewarm") as url:
            options = StackOptions(
                workdir=tmp_path_factory.mktemp("prewarm"),
                database_url=url,
                broker_url=redis.url(),
                idle_timeout_s=GRACE_S,
                ready_timeout_s=90,
                housekeeping_interval_s=INTERVAL_S,
                embedded_beat=False,  # a separate beat, as in production
                extra_env={"PREWARM_MAX_S": "60"},
            )
            with LocalStack(options) as running:
                yield running
    finally:
        redis.stop()


def prewarm_row(stack: LocalStack, key: str) -> Prewarm:
    return stack.read(
        lambda s: s.scalar(select(Prewarm).where(Prewarm.caller_key == key, ~Prewarm.refused))
    )


def wait_stopped(stack: LocalStack) -> None:
    stack.wait_for(
        "the net STOPPED and its server gone",
        lambda: stack.net().state == NetState.STOPPED and stack.driver().observe().running == 0,
        WAIT_S,
    )


def net_moves_since(stack: LocalStack, since) -> list[tuple[str, str, float]]:
    return stack.read(
        lambda s: [
            (str(e.from_state), str(e.to_state), e.at.timestamp())
            for e in s.scalars(select(NetEvent).where(NetEvent.at >= since).order_by(NetEvent.id))
        ]
    )


def test_a_job_sent_within_the_hint_runs_on_the_held_warm_server(stack):
    wait_stopped(stack)
    stack.client.prewarm(PrewarmNet(caller_key="e2e-pw-1", net=NET, within_s=60))
    stack.wait_for("the prewarm stored", lambda: prewarm_row(stack, "e2e-pw-1"), WAIT_S)
    created = prewarm_row(stack, "e2e-pw-1").created_at
    ready_at = stack.wait_for(
        "the server ready (sites connected)",
        lambda: prewarm_row(stack, "e2e-pw-1").ready_at,
        WAIT_S,
    )
    assert stack.net().state == NetState.READY
    ready_s = (ready_at - created).total_seconds()
    # Held past the normal idle grace: beat's scale-down rounds leave it up.
    time.sleep(GRACE_S + 3 * INTERVAL_S)
    assert stack.net().state == NetState.READY and stack.driver().observe().running == 1

    sent = time.time()
    job_id = stack.enqueue("e2e-pw-job-1")
    job = stack.wait_for(
        "the job RUNNING",
        lambda: (
            (j := stack.job(job_id)) is not None
            and j.state in (JobState.RUNNING, JobState.COMPLETED, JobState.FAILED)
            and j
        ),
        WAIT_S,
        poll_s=0.05,
    )
    assert job.state != JobState.FAILED, job.last_error
    running_at = stack.read(
        lambda s: s.scalar(
            select(JobEvent.at).where(
                JobEvent.job_id == job_id, JobEvent.to_state == JobState.RUNNING
            )
        )
    )
    print(
        f"\nprewarm -> READY {ready_s:.1f} s; enqueue -> RUNNING "
        f"{(running_at.timestamp() - sent) * 1000:.0f} ms on the held server"
    )
    done = stack.wait_for(
        "the job COMPLETED",
        lambda: (j := stack.job(job_id)) is not None and j.state == JobState.COMPLETED and j,
        WAIT_S,
    )
    assert done.attempts == 0
    # One start, one scale-up, the job's whole path on the warm server.
    moves = net_moves_since(stack, created)
    assert [m[:2] for m in moves if m[1] == "STARTING"] == [("STOPPED", "STARTING")]
    history = stack.read(
        lambda s: [
            str(e.to_state)
            for e in s.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
        ]
    )
    assert history[:4] == ["QUEUED", "ASSIGNED", "DISPATCHING", "RUNNING"]
    ups = stack.read(
        lambda s: s.scalars(
            select(ScaleEvent.reason).where(
                ScaleEvent.at >= created, ScaleEvent.action == "scale_up"
            )
        ).all()
    )
    assert ups == ["prewarm: a job is likely soon"]
    # The job used the hold: the server goes at the job's end + the grace, not at 60 s.
    stack.wait_for(
        "the prewarm settled as used",
        lambda: prewarm_row(stack, "e2e-pw-1").outcome == PrewarmOutcome.USED,
        WAIT_S,
    )
    assert prewarm_row(stack, "e2e-pw-1").job_id == job_id
    wait_stopped(stack)
    stopped_at = moves_to(stack, created, "STOPPING")
    assert stopped_at - created < timedelta(seconds=60)


def moves_to(stack: LocalStack, since, state: str):
    at = stack.read(
        lambda s: s.scalar(
            select(NetEvent.at)
            .where(NetEvent.at >= since, NetEvent.to_state == NetState(state))
            .order_by(NetEvent.id)
            .limit(1)
        )
    )
    assert at is not None, f"no move to {state}"
    return at


def test_a_hint_with_no_job_releases_the_server_at_t_plus_grace(stack):
    within_s = 30.0  # longer than a local cold start, so the hold is what keeps it up
    wait_stopped(stack)
    stack.client.prewarm(PrewarmNet(caller_key="e2e-pw-2", net=NET, within_s=within_s))
    stack.wait_for("the prewarm stored", lambda: prewarm_row(stack, "e2e-pw-2"), WAIT_S)
    row = prewarm_row(stack, "e2e-pw-2")
    assert row.hold_until - row.created_at == timedelta(seconds=within_s)
    ready_at = stack.wait_for(
        "the server ready (sites connected)",
        lambda: prewarm_row(stack, "e2e-pw-2").ready_at,
        WAIT_S,
    )
    assert ready_at < row.hold_until  # ready within T: the hold, not the start, decides
    wait_stopped(stack)
    released = moves_to(stack, row.created_at, "STOPPING")
    due = row.hold_until + timedelta(seconds=GRACE_S)
    late_s = (released - due).total_seconds()
    print(f"\nreleased {late_s:.2f} s after T + grace (T {within_s:.0f} s, grace {GRACE_S:.0f} s)")
    assert released >= due  # never before T + grace
    assert late_s <= 3 * INTERVAL_S + 5  # within a scale-down round or two of it
    settled = stack.wait_for(
        "the prewarm settled as expired",
        lambda: (p := prewarm_row(stack, "e2e-pw-2")).outcome is not None and p,
        WAIT_S,
    )
    assert settled.outcome == PrewarmOutcome.EXPIRED and settled.job_id is None
    claimed = stack.read(
        lambda s: s.scalars(select(Job.id).where(Job.assigned_at >= row.created_at)).all()
    )
    assert claimed == []  # no job came: the hold alone kept the server
