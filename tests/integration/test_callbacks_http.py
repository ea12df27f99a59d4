"""Status callbacks over real HTTP: a threaded http.server on loopback receives what the
real httpx sender posts, while the real use cases drive jobs on PostgreSQL (fakes only for
the NVFLARE server and the scale driver). Delivery is called as the task calls it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from app import names
from app.adapters.callbacks import EVENT_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from app.read_models import CallbackDelivery
from app.settings import Settings
from app.usecases import callbacks, monitor
from models import JobState
from tests.fixtures.db import FrozenClock, net_decl
from tests.unit.conftest import World

pytestmark = pytest.mark.integration

SECRET = "integration-callback-secret"
LIFE = ["QUEUED", "ASSIGNED", "DISPATCHING", "RUNNING", "COMPLETED"]
HANG = -1  # a rule's answer meaning: say nothing for longer than CALLBACK_TIMEOUT_S


class HttpReceiver:
    """flip-api's callback endpoint: verifies each request's signature against the raw
    body and answers what `rule` says. Can be down (nothing listens on its port)."""

    def __init__(self, port: int, clock: FrozenClock) -> None:
        self.port = port
        self.clock = clock
        self.rule: Callable[[dict[str, Any]], int] = lambda payload: 200
        self.requests: list[dict[str, Any]] = []  # payload + "_valid" + "_status"
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/fl/callbacks"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                payload = json.loads(body)
                status = receiver.rule(payload)
                payload["_valid"] = verify(
                    SECRET,
                    self.headers[TIMESTAMP_HEADER],
                    self.headers[SIGNATURE_HEADER],
                    body,
                    now_s=receiver.clock().timestamp(),
                )
                payload["_status"] = status
                payload["_event_id_header"] = self.headers[EVENT_ID_HEADER]
                receiver.requests.append(payload)
                if status == HANG:
                    time.sleep(1.0)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def states(self, job_id: Any) -> list[str]:
        return [
            p["to_state"]
            for p in self.requests
            if p["job_id"] == str(job_id) and p["kind"] == "state_change"
        ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def receiver(clock) -> Iterator[HttpReceiver]:
    receiver = HttpReceiver(free_port(), clock)
    yield receiver
    receiver.stop()


@pytest.fixture
def make_world(tmp_path, job_root, pg_factory, clock, receiver):
    def make(**extra: Any) -> World:
        nets = [
            net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120),
            net_decl(tmp_path, "fixed", "static"),
        ]
        settings = Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path / "data",
            JOB_ROOT=job_root,
            NETS=json.dumps(nets),
            PER_JOB_FL_SERVER="true",
            CALLBACK_URL=receiver.url,
            CALLBACK_SECRET=SECRET,
            CALLBACK_MAX_BACKOFF_S=30,
            **extra,
        )
        return World(settings, pg_factory, clock)

    return make


def run_to_completion(world: World, key: str, net: str) -> Any:
    job_id = world.enqueue(key, net=net)
    world.run_pipeline(job_id)
    world.server(net).statuses[world.job(job_id).nvflare_job_id] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.COMPLETED
    return job_id


def status(world: World, job_id: Any) -> CallbackDelivery:
    with world.rt.sessions() as session:
        return callbacks.delivery_status(session, job_id)


def test_every_event_of_two_lives_arrives_in_order_and_signed(make_world, receiver):
    world = make_world()
    receiver.start()
    a = run_to_completion(world, "a", "net-a")
    b = run_to_completion(world, "b", "fixed")

    report = callbacks.deliver_callbacks(world.rt)
    assert (report.delivered, report.failed, report.retry_in_s) == (10, 0, None)
    assert receiver.states(a) == LIFE and receiver.states(b) == LIFE
    assert all(p["_valid"] for p in receiver.requests)
    for job_id in (a, b):
        ids = [p["event_id"] for p in receiver.requests if p["job_id"] == str(job_id)]
        assert ids == sorted(ids)
    running = next(p for p in receiver.requests if p["to_state"] == "RUNNING")
    assert (running["caller_key"], running["nvflare_job_id"], running["attempt"]) == (
        "a",
        "nv-1",
        1,
    )
    assert callbacks.deliver_callbacks(world.rt).delivered == 0
    assert len(receiver.requests) == 10


def test_a_receiver_that_was_down_gets_every_event_later_in_order(make_world, receiver, clock):
    world = make_world()
    job_id = run_to_completion(world, "a", "net-a")  # the pipeline never waits for it

    waits = []
    for _ in range(3):  # connection refused, each time after a longer rest
        report = callbacks.deliver_callbacks(world.rt)
        assert report.delivered == 0 and report.retry_in_s is not None
        waits.append(report.retry_in_s)
        clock.advance(report.retry_in_s)
    assert waits == [2.0, 4.0, 8.0]
    got = status(world, job_id)
    assert got.pending == 5 and got.delivered == 0
    assert "ConnectError" in got.last_error

    late = run_to_completion(world, "b", "fixed")  # more history while it is down
    receiver.start()
    report = callbacks.deliver_callbacks(world.rt)
    assert report.delivered == 10
    assert receiver.states(job_id) == LIFE and receiver.states(late) == LIFE
    assert all(p["_valid"] for p in receiver.requests)
    assert status(world, job_id).pending == 0


def test_a_rejecting_receiver_is_not_retried_for_ever(make_world, receiver, clock):
    world = make_world(CALLBACK_MAX_4XX_TRIES=2)
    receiver.rule = lambda payload: 400
    receiver.start()
    job_id = run_to_completion(world, "a", "net-a")

    for _ in range(12):
        callbacks.deliver_callbacks(world.rt)
        clock.advance(30)
    # each event twice (CALLBACK_MAX_4XX_TRIES), in order, then given up
    assert receiver.states(job_id) == [state for state in LIFE for _ in range(2)]
    got = status(world, job_id)
    assert (got.delivered, got.failed, got.pending) == (0, 5, 0)
    assert "HTTP 400: ok (rejected 2 times" in got.last_error
    before = len(receiver.requests)
    clock.advance(3600)
    callbacks.deliver_callbacks(world.rt)
    assert len(receiver.requests) == before


def test_a_receiver_that_times_out_gets_the_event_again_with_the_same_id(
    make_world, receiver, clock
):
    world = make_world(CALLBACK_TIMEOUT_S=0.3)
    answers = iter([HANG])
    receiver.rule = lambda payload: next(answers, 200)
    receiver.start()
    job_id = world.enqueue("a", net="net-a")

    report = callbacks.deliver_callbacks(world.rt)
    assert report.delivered == 0 and report.retry_in_s == 2.0
    assert "Timeout" in status(world, job_id).last_error
    clock.advance(2)
    assert callbacks.deliver_callbacks(world.rt).delivered == 1
    first, again = receiver.requests
    assert first["event_id"] == again["event_id"] and again["_status"] == 200


class TricklingReceiver:
    """A receiver on loopback that reads the request and then sends its answer one byte at
    a time, each well inside the read timeout, so no single phase ever times out: the
    status line and headers (`body_only` False) or, after prompt headers, the body."""

    def __init__(self, port: int, *, body_only: bool, interval_s: float = 0.05) -> None:
        self.port = port
        self.requests = 0
        self.finished = threading.Event()  # the whole answer went out
        self._stop = threading.Event()
        self._body_only = body_only
        self._interval_s = interval_s
        self._listener = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        body = b"x" * 600  # 600 x 50 ms: half a minute, far past any deadline under test
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with conn:
                conn.recv(65536)  # the request (small; the answer does not depend on it)
                self.requests += 1
                if self._body_only:
                    conn.sendall(head)
                    head = b""
                try:
                    for byte in head + body:
                        if self._stop.wait(self._interval_s):
                            return
                        conn.sendall(bytes([byte]))
                except OSError:
                    continue  # the sender hung up: wait for its next try
                self.finished.set()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


@pytest.mark.parametrize("body_only", [False, True], ids=["trickled-headers", "trickled-body"])
def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_timeout(
    tmp_path, job_root, pg_factory, clock, body_only
):
    # httpx's timeouts bound each read; a byte every 50 ms never trips a 1 s one, so only a
    # deadline for the whole request keeps a delivery from holding its worker.
    trickler = TricklingReceiver(free_port(), body_only=body_only)
    try:
        settings = Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path / "data",
            JOB_ROOT=job_root,
            NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs")]),
            CALLBACK_URL=f"http://127.0.0.1:{trickler.port}/fl/callbacks",
            CALLBACK_SECRET=SECRET,
            CALLBACK_TIMEOUT_S=1,
        )
        world = World(settings, pg_factory, clock)
        job_id = world.enqueue("a", net="net-a")

        report = callbacks.deliver_callbacks(world.rt)
        assert not trickler.finished.is_set()
        assert trickler.requests == 1
        assert report.delivered == 0 and report.retry_in_s == 2.0
        assert "Timeout" in status(world, job_id).last_error
    finally:
        trickler.close()


def test_the_status_api_shows_what_is_not_delivered_yet(make_world, receiver, clock):
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from app.entrypoints.api import create_app

    world = make_world()
    receiver.rule = lambda payload: 503
    receiver.start()
    job_id = world.enqueue("a", net="net-a")
    clock.advance(20)
    callbacks.deliver_callbacks(world.rt)

    with TestClient(create_app(world.rt)) as client:
        detail = client.get(f"/jobs/{job_id}")
        metrics = client.get("/metrics").text
    assert detail.status_code == 200
    assert detail.json()["callbacks"] == {
        "delivered": 0,
        "pending": 1,
        "failed": 0,
        "last_error": f"event {receiver.requests[0]['event_id']}: HTTP 503: ok",
        "next_attempt_at": (clock() + timedelta(seconds=2)).isoformat(),
    }
    values = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert values["fl_dispatcher_callback_undelivered_events"] == 1
    assert values["fl_dispatcher_callback_oldest_undelivered_seconds"] == 20
    assert values["fl_dispatcher_callback_failed_events_total"] == 0


def test_a_refused_enqueue_reaches_the_receiver_as_a_rejected_event(make_world, receiver, clock):
    """Through the worker's door (the enqueue task refuses the payload), on PostgreSQL, over
    HTTP: the receiver is down at first, then gets the rejected event and a job's whole life,
    each signed, with ids that cannot collide."""
    from app.schemas import job_id_for
    from tasks import base
    from tasks.registered import TASKS

    world = make_world()
    base.set_runtime(world.rt)
    try:
        refused = TASKS[names.ENQUEUE_JOB].run(
            payload={"caller_key": "flip-bad", "definition": "tiny-job", "net": "nope"}
        )
    finally:
        base.set_runtime(None)
    job_id = run_to_completion(world, "a", "net-a")  # never waits for the rejected event

    report = callbacks.deliver_callbacks(world.rt)
    # Two tries unanswered (the rejected event, then one other before the receiver is taken
    # for down): the first rest, 2 s.
    assert report.delivered == 0 and report.retry_in_s == 2.0
    clock.advance(2)
    receiver.start()
    report = callbacks.deliver_callbacks(world.rt)
    assert (report.delivered, report.failed, report.retry_in_s) == (6, 0, None)

    assert all(p["_valid"] and p["_status"] == 200 for p in receiver.requests)
    [rejected] = [p for p in receiver.requests if p["kind"] == "rejected"]
    assert rejected["job_id"] == str(job_id_for("flip-bad"))
    assert rejected["caller_key"] == "flip-bad"
    assert rejected["reason"] == refused["rejected"] and "unknown net 'nope'" in rejected["reason"]
    assert rejected["event_id"] == rejected["_event_id_header"]
    assert rejected["event_id"].startswith("rejected-")
    assert receiver.states(job_id) == LIFE
    ids = [str(p["event_id"]) for p in receiver.requests]
    assert len(set(ids)) == len(ids) == 6
    assert callbacks.deliver_callbacks(world.rt).delivered == 0  # once, not again
