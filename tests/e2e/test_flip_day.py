"""FLIP's day, end to end: flip-api uploads a model's job bundle to S3 and enqueues it with a
plain Celery `send_task`; the dispatcher starts the net's NVFLARE server from zero, fetches
and prepares the bundle, runs it on the real server with two real sites, holds the server
while flip-api uploads the results, and scales it to zero once flip-api reports them
uploaded; flip-api's callback endpoint hears every move, signed and in order.

Everything is real and on loopback: moto's S3 server (this module's own, stoppable on a
fixed port), a private Redis as the broker, a fresh PostgreSQL database, a Celery worker
and a separate beat (subprocesses that reach S3 through S3_ENDPOINT_URL), the local scale
driver, an NVFLARE server and two sites, and an HTTP receiver that checks each signature
with tasks/README.md's own snippet. One stack for the module; each test uses its own model id.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from celery import Celery
from sqlalchemy import select

from app.local.nvflare import build_tiny_job
from app.local.receiver import LocalReceiver, Received
from app.local.stack import LocalStack, StackOptions
from app.schemas import job_id_for
from app.usecases.callbacks import delivery_status
from app.usecases.callbacks.receiver import RECEIVER_ID
from models import CallbackReceiver, JobEvent, JobState, NetEvent, NetState, ScaleEvent
from tests.e2e.lifecycle_stack import wait_scaled_to_zero, wait_state
from tests.fixtures.aws import MOTO_REGION, OwnedMotoServer
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

EXPECTED_S = 110  # seconds on the 2-core CI machine (tests/tools/schedule.py)

RUN_S = 240  # generous bounds for a 2-core machine; the measured numbers are far lower
BUCKET = "flip-models"
JOB_FOLDER = "tiny-fedavg"
SITES = ["site-1", "site-2"]
SECRET = "flip-day-callback-secret-0123456789"
IDLE_TIMEOUT_S = 3.0
HOUSEKEEPING_S = 1.0
README = Path(__file__).resolve().parents[2] / "tasks" / "README.md"  # "Status callbacks"
# flip-api's side of the wire: task names and queue as strings, no project import.
ENQUEUE = "fl_dispatcher.enqueue_job"
REPORT = "fl_dispatcher.report_job_status"
QUEUE = "fl_dispatcher"


# --- the real parts -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    with fresh_pg_database("fld_flipday") as url:
        yield url


@pytest.fixture(scope="module")
def broker_url(tmp_path_factory) -> Iterator[str]:
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def moto() -> Iterator[OwnedMotoServer]:
    server = OwnedMotoServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3(moto) -> Any:
    """flip-api's S3 client (dummy credentials of its own; nothing set in this process's
    environment), with the models bucket created."""
    client = boto3.session.Session().client(
        "s3",
        region_name=MOTO_REGION,
        endpoint_url=moto.url,
        aws_access_key_id="flip-api",
        aws_secret_access_key="flip-api-secret",
    )
    client.create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": MOTO_REGION}
    )
    return client


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> dict[str, bytes]:
    """The tiny FedAvg job as NVFLARE exports it: relative path -> content."""
    folder = build_tiny_job(tmp_path_factory.mktemp("bundle") / JOB_FOLDER)
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def readme_verify_callback() -> Callable[..., bool]:
    """tasks/README.md's verification snippet, executed as flip-api would copy it."""
    section = README.read_text().split("## Status callbacks", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    found = [block for block in blocks if "def verify_callback(" in block]
    assert found, "tasks/README.md lost its verification snippet"
    namespace: dict[str, Any] = {}
    exec(found[0], namespace)
    return namespace["verify_callback"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def receiver() -> Iterator[LocalReceiver]:
    """flip-api's callback endpoint: each signature checked, on arrival, by tasks/README.md's
    snippet (401 if it does not verify); a fixed port, so it can go down and come back."""
    verify_callback = readme_verify_callback()
    server = LocalReceiver(
        SECRET,
        verifier=lambda headers, body: verify_callback(SECRET.encode(), headers, body),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_database, broker_url, moto, receiver) -> Iterator[LocalStack]:
    aws = tmp_path_factory.mktemp("aws")  # empty: no ~/.aws profile can leak in
    options = StackOptions(
        workdir=tmp_path_factory.mktemp("flipday"),
        database_url=pg_database,
        broker_url=broker_url,
        idle_timeout_s=IDLE_TIMEOUT_S,
        ready_timeout_s=90,
        housekeeping_interval_s=HOUSEKEEPING_S,
        embedded_beat=False,  # a separate beat process, as in production
        extra_env={
            "RELEASE_AFTER": "reported",
            "CALLBACK_URL": receiver.url,
            "CALLBACK_SECRET": SECRET,
            "CALLBACK_MAX_BACKOFF_S": "2",
            "S3_ENDPOINT_URL": moto.url,
            "AWS_ACCESS_KEY_ID": "fl-dispatcher",
            "AWS_SECRET_ACCESS_KEY": "fl-dispatcher-secret",
            "AWS_DEFAULT_REGION": MOTO_REGION,
            "AWS_CONFIG_FILE": str(aws / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(aws / "credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            # An S3 outage of a few seconds stays within one attempt's retries.
            "RETRY_MAX": "6",
            "RETRY_BACKOFF_MAX_S": "2",
            "STUCK_AFTER_S": "30",
        },
    )
    with LocalStack(options) as running:
        yield running


@pytest.fixture(scope="module")
def flip(broker_url) -> Iterator[Callable[[str, dict[str, Any]], None]]:
    """flip-api's sender: a plain Celery app built here, sending by name to the queue."""
    app = Celery("flip-api", broker=broker_url)
    app.conf.update(task_serializer="json", accept_content=["json"])

    def send(task: str, payload: dict[str, Any]) -> None:
        app.send_task(task, kwargs={"payload": payload}, queue=QUEUE)

    yield send
    app.close()


# --- helpers ------------------------------------------------------------------------------


def upload(s3: Any, bundle: dict[str, bytes], model_id: str) -> str:
    """The bundle under s3://BUCKET/<model_id>/tiny-fedavg/; returns the definition."""
    for relative, body in bundle.items():
        s3.put_object(Bucket=BUCKET, Key=f"{model_id}/{JOB_FOLDER}/{relative}", Body=body)
    return f"s3://{BUCKET}/{model_id}/{JOB_FOLDER}"


def enqueue(flip: Callable[..., None], definition: str, model_id: str) -> uuid.UUID:
    """flip-api's enqueue of one model's training run; returns the job id flip-api
    derives from its own key."""
    caller_key = f"flip-job-{model_id}"
    flip(
        ENQUEUE,
        {
            "caller_key": caller_key,
            "definition": definition,
            "required_sites": SITES,
            "metadata": {"model_id": model_id, "project_id": "project-7"},
        },
    )
    return job_id_for(caller_key)


def report_uploaded(flip: Callable[..., None], job_id: uuid.UUID) -> None:
    flip(REPORT, {"job_id": str(job_id), "status": "results_uploaded", "detail": "day done"})


def new_model_id() -> str:
    return f"model-{uuid.uuid4().hex[:10]}"


def history(stack: LocalStack, job_id: uuid.UUID) -> list[tuple[int, str | None, str]]:
    """The job's moves as stored: (event id, from, to), in id order."""
    return stack.read(
        lambda s: [
            (e.id, e.from_state.value if e.from_state else None, e.to_state.value)
            for e in s.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
        ]
    )


def requests_for(receiver: LocalReceiver, job_id: uuid.UUID) -> list[Received]:
    return [r for r in receiver.received if r.payload.get("job_id") == str(job_id)]


def delivered(receiver: LocalReceiver, job_id: uuid.UUID) -> list[tuple[int, str | None, str]]:
    """The job's state changes in the order they first arrived (a redelivery, which
    at-least-once allows, carries the same event_id and is dropped as tasks/README.md says)."""
    seen: set[int] = set()
    moves = []
    for request in requests_for(receiver, job_id):
        payload = request.payload
        if payload.get("kind") != "state_change" or payload["event_id"] in seen:
            continue
        seen.add(payload["event_id"])
        moves.append((payload["event_id"], payload["from_state"], payload["to_state"]))
    return moves


def wait_all_delivered(
    stack: LocalStack, receiver: LocalReceiver, job_id: uuid.UUID
) -> list[tuple[int, str | None, str]]:
    """Every stored move of the job has reached the receiver; returns them."""

    def complete() -> list[tuple[int, str | None, str]] | None:
        stored = history(stack, job_id)
        return stored if stored and delivered(receiver, job_id) == stored else None

    return stack.wait_for(f"every event of job {job_id} at the receiver", complete, 60)


def net_moves_since(stack: LocalStack, after_id: int) -> list[tuple[str, str]]:
    return stack.read(
        lambda s: [
            (str(e.from_state), str(e.to_state))
            for e in s.scalars(select(NetEvent).where(NetEvent.id > after_id).order_by(NetEvent.id))
        ]
    )


def last_net_event_id(stack: LocalStack) -> int:
    return stack.read(lambda s: s.scalar(select(NetEvent.id).order_by(NetEvent.id.desc())) or 0)


def scale_events_for(stack: LocalStack, job_id: uuid.UUID) -> list[tuple[str, str]]:
    """(action, outcome) of the scale decisions taken for this job."""
    return stack.read(
        lambda s: [
            (e.action, e.outcome)
            for e in s.scalars(
                select(ScaleEvent)
                .where(ScaleEvent.reason.contains(str(job_id)))
                .order_by(ScaleEvent.id)
            )
        ]
    )


# --- the day --------------------------------------------------------------------------------


def test_flip_day_cold_start_run_hold_for_the_upload_report_then_scale_to_zero(
    stack, s3, bundle, flip, receiver
):
    wait_scaled_to_zero(stack)  # a cold start: no server runs before the job
    net_before = last_net_event_id(stack)
    model_id = new_model_id()
    definition = upload(s3, bundle, model_id)
    job_id = enqueue(flip, definition, model_id)

    job = wait_state(stack, job_id, JobState.RUNNING, JobState.FINISHING, JobState.FAILED)
    assert job.state != JobState.FAILED, job.last_error
    assert job.definition == definition and job.nvflare_job_id
    assert scale_events_for(stack, job_id) == [("scale_up", "ok")]
    assert net_moves_since(stack, net_before)[:2] == [
        ("STOPPED", "STARTING"),
        ("STARTING", "READY"),
    ]
    # What ran is the bundle fetched from S3 (every file as uploaded), prepared for the
    # job: NVFLARE's own job store shows the deploy map naming the two sites, both of
    # which ran it, and the run's end.
    assert stack.settings is not None and stack.deployment is not None
    fetched = stack.settings.data_dir.resolve() / "job-cache" / str(job_id) / "bundle" / JOB_FOLDER
    assert {
        p.relative_to(fetched).as_posix(): p.read_bytes() for p in fetched.rglob("*") if p.is_file()
    } == bundle

    # NVFLARE finished; the server is held for flip-api's upload, longer than the idle
    # grace and several housekeeping ticks.
    job = wait_state(stack, job_id, JobState.FINISHING, JobState.FAILED, JobState.COMPLETED)
    assert job.state == JobState.FINISHING, job.last_error
    [run] = [r for r in stack.job_store_runs() if r["job_id"] == job.nvflare_job_id]
    assert run["status"] == "FINISHED:COMPLETED"
    assert run["deploy_map"] == {"app": ["server", *SITES]} and run["min_clients"] == 2
    assert run["job_deploy_detail"] == ["server: OK", "site-1: OK", "site-2: OK"]
    assert all((stack.deployment.site_kits[s] / job.nvflare_job_id).is_dir() for s in SITES)
    held_until = time.monotonic() + IDLE_TIMEOUT_S + 3 * HOUSEKEEPING_S
    while time.monotonic() < held_until:
        assert stack.job(job_id).state == JobState.FINISHING
        assert stack.net().state == NetState.BUSY
        assert stack.driver().observe().running == 1
        time.sleep(0.5)

    report_uploaded(flip, job_id)
    job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED, JobState.ABORTED)
    assert job.state == JobState.COMPLETED, job.last_error
    wait_scaled_to_zero(stack)
    assert stack.driver().observe().running == 0
    moves = net_moves_since(stack, net_before)
    assert moves[-3:] == [("BUSY", "READY"), ("READY", "STOPPING"), ("STOPPING", "STOPPED")]
    assert scale_events_for(stack, job_id) == [("scale_up", "ok")]  # scale-down: idle

    # flip-api heard every move, in order, each signed (tasks/README.md's snippet said so).
    moves = wait_all_delivered(stack, receiver, job_id)
    assert [to for _, _, to in moves] == [
        "QUEUED",
        "ASSIGNED",
        "DISPATCHING",
        "RUNNING",
        "FINISHING",
        "COMPLETED",
    ]
    requests = requests_for(receiver, job_id)
    assert all(r.valid and r.status == 200 for r in requests)
    assert all(
        r.payload["metadata"] == {"model_id": model_id, "project_id": "project-7"} for r in requests
    )
    assert all(r.headers["X-FL-Dispatcher-Event-Id"] == str(r.event_id) for r in requests)
    done = requests[-1].payload
    assert done["to_state"] == "COMPLETED"
    assert done["reason"].startswith("flip-api reported results_uploaded")
    assert stack.read(lambda s: delivery_status(s, job_id)).pending == 0


def test_a_transient_s3_outage_during_the_download_ends_completed(
    stack, moto, s3, bundle, flip, receiver
):
    model_id = new_model_id()
    definition = upload(s3, bundle, model_id)
    down = moto.stop_at_first_download(BUCKET, model_id)
    try:
        job_id = enqueue(flip, definition, model_id)
        stack.wait_for("S3 to go down during the bundle's download", down.is_set, RUN_S)
        assert stack.job(job_id).state == JobState.ASSIGNED
        # The worker sees the outage (after botocore's own retries) and retries its step.
        stack.wait_for(
            "the worker to retry the download", lambda: stack.job(job_id).retries >= 1, 60
        )
        time.sleep(2)  # a few seconds more of outage
        assert stack.job(job_id).state == JobState.ASSIGNED
    finally:
        moto.start()  # back, on the same port

    job = wait_state(stack, job_id, JobState.FINISHING, JobState.FAILED, JobState.COMPLETED)
    assert job.state == JobState.FINISHING, job.last_error
    report_uploaded(flip, job_id)
    job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED)
    assert job.state == JobState.COMPLETED, job.last_error
    assert job.attempts == 0  # the outage cost retries of one attempt, never a requeue
    moves = wait_all_delivered(stack, receiver, job_id)
    assert "FAILED" not in [to for _, _, to in moves]
    wait_scaled_to_zero(stack)


def test_a_missing_prefix_fails_the_job_with_its_reason_and_never_scales_up(stack, flip, receiver):
    wait_scaled_to_zero(stack)
    model_id = new_model_id()  # nothing uploaded under it
    definition = f"s3://{BUCKET}/{model_id}/{JOB_FOLDER}"
    job_id = enqueue(flip, definition, model_id)

    job = wait_state(stack, job_id, JobState.FAILED, JobState.COMPLETED, JobState.RUNNING)
    assert job.state == JobState.FAILED
    assert definition in job.last_error and "missing or empty prefix" in job.last_error
    assert scale_events_for(stack, job_id) == []  # the driver was never asked
    assert stack.driver().observe().running == 0
    wait_scaled_to_zero(stack)
    moves = wait_all_delivered(stack, receiver, job_id)
    assert [to for _, _, to in moves] == ["QUEUED", "ASSIGNED", "FAILED"]
    [failed] = [
        r.payload for r in requests_for(receiver, job_id) if r.payload["to_state"] == "FAILED"
    ]
    assert "missing or empty prefix" in failed["reason"]


def test_a_receiver_that_is_down_for_a_while_gets_every_event_later_in_order(
    stack, s3, bundle, flip, receiver
):
    model_id = new_model_id()
    definition = upload(s3, bundle, model_id)
    receiver.stop()  # flip-api is down: connections are refused
    try:
        job_id = enqueue(flip, definition, model_id)
        refused = f"flip-job-{model_id}-refused"
        flip(ENQUEUE, {"caller_key": refused, "definition": definition, "net": "no-such-net"})
        job = wait_state(stack, job_id, JobState.FINISHING, JobState.FAILED, JobState.COMPLETED)
        assert job.state == JobState.FINISHING, job.last_error
        report_uploaded(flip, job_id)  # the pipeline never waits for the receiver
        job = wait_state(stack, job_id, JobState.COMPLETED, JobState.FAILED)
        assert job.state == JobState.COMPLETED, job.last_error
        status = stack.read(lambda s: delivery_status(s, job_id))
        assert status.delivered == 0 and status.pending == len(history(stack, job_id))
        resting = stack.read(lambda s: s.get(CallbackReceiver, RECEIVER_ID))
        assert resting is not None and "ConnectError" in (resting.last_error or "")
    finally:
        receiver.start()  # back, on the same port

    moves = wait_all_delivered(stack, receiver, job_id)
    assert [to for _, _, to in moves] == [
        "QUEUED",
        "ASSIGNED",
        "DISPATCHING",
        "RUNNING",
        "FINISHING",
        "COMPLETED",
    ]
    assert all(r.valid for r in requests_for(receiver, job_id))

    def rejected() -> list[Received]:
        return [
            r
            for r in receiver.received
            if r.payload.get("kind") == "rejected" and r.payload["caller_key"] == refused
        ]

    [event] = stack.wait_for("the rejected enqueue at the receiver", rejected, 60)[:1]
    assert event.valid and str(event.event_id).startswith("rejected-")
    assert event.payload["job_id"] == str(job_id_for(refused))
    assert "unknown net 'no-such-net'" in event.payload["reason"]
    wait_scaled_to_zero(stack)
