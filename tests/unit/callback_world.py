"""The status callbacks' unit world: a runtime with callbacks on (net-a scale-to-zero, a
static net), a recording receiver in place of flip-api's HTTP endpoint, and the steps the
callback tests share (tests/unit/test_callback*.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from app.adapters.callbacks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Answer,
    ReceiverUnreachable,
    verify,
)
from app.read_models import CallbackDelivery
from app.settings import Settings
from app.usecases import callbacks, monitor
from app.usecases.callbacks import receiver as callback_receiver
from models import CallbackReceiver, JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World

SECRET = "a-callback-secret-of-some-length"


class Receiver:
    """flip-api as the sender sees it: answers by a rule, or does not answer while down."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, Any], dict[str, str], int]] = []
        self.down = False
        self.rule: Callable[[dict[str, Any]], int] = lambda payload: 200
        self.during_post: Callable[[], None] | None = None

    def post(self, body: bytes, headers) -> Answer:
        if self.during_post is not None:
            self.during_post()
        if self.down:
            raise ReceiverUnreachable("ConnectError: [Errno 111] Connection refused")
        payload = json.loads(body)
        assert verify(
            SECRET,
            headers[TIMESTAMP_HEADER],
            headers[SIGNATURE_HEADER],
            body,
            now_s=float(headers[TIMESTAMP_HEADER]),
        )
        status = self.rule(payload)
        self.requests.append((payload, dict(headers), status))
        return Answer(status, "nope" if status >= 300 else "")

    def close(self) -> None:
        pass

    def sent(self, job_id=None) -> list[tuple[int, str]]:
        """(event_id, to_state) of every request, in the order they came."""
        return [
            (p["event_id"], p.get("to_state") or p["kind"])
            for p, _, _ in self.requests
            if job_id is None or p["job_id"] == str(job_id)
        ]

    def accepted(self, job_id=None) -> list[str]:
        return [
            p.get("to_state") or p["kind"]
            for p, _, status in self.requests
            if 200 <= status < 300 and (job_id is None or p["job_id"] == str(job_id))
        ]


def callback_settings(tmp_path, job_root, **extra: Any) -> Settings:
    nets = [
        net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120),
        net_decl(tmp_path, "fixed", "static"),
    ]
    values: dict[str, Any] = {
        "FL_DISPATCHER_DATA_DIR": tmp_path / "data",
        "JOB_ROOT": job_root,
        "NETS": json.dumps(nets),
        "PER_JOB_FL_SERVER": "true",
        "CALLBACK_URL": "http://flip-api.invalid/fl/callbacks",
        "CALLBACK_SECRET": SECRET,
        "CALLBACK_MAX_BACKOFF_S": 10,
    }
    return Settings(**(values | extra))


@pytest.fixture
def cb(tmp_path, job_root, sqlite_factory, clock) -> World:
    return World(callback_settings(tmp_path, job_root), sqlite_factory, clock)


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


def deliver(world: World, receiver: Receiver) -> callbacks.DeliveryReport:
    return callbacks.deliver_callbacks(world.rt, sender=receiver)


def complete(world: World, job_id) -> None:
    """The job's whole life through the real use cases: enqueued, run, finished."""
    world.run_pipeline(job_id)
    nvflare_id = world.job(job_id).nvflare_job_id
    world.server("net-a").statuses[nvflare_id] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.COMPLETED


LIFE = ["QUEUED", "ASSIGNED", "DISPATCHING", "RUNNING", "COMPLETED"]


def receiver_row(world: World) -> CallbackReceiver:
    with world.rt.sessions() as session:
        row = session.get(CallbackReceiver, callback_receiver.RECEIVER_ID)
        assert row is not None
        return row


def status(world: World, job_id) -> CallbackDelivery:
    with world.rt.sessions() as session:
        return callbacks.delivery_status(session, job_id)
