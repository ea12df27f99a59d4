"""The HTTP callback sender (app.adapters.callbacks.HttpCallbackSender, which makes its httpx
client at a round's first POST), against real loopback servers, not mocks: no redirect is
followed, no proxy or certificate setting comes from the environment, the timeout holds,
URL credentials never reach last_error, and a whole round through the real sender delivers
each job's events in order, signed, and backs off when the receiver cannot be reached.
(Every other delivery round in the unit tier passes a recording sender: test_callbacks.py.)"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from app.adapters.callbacks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WEBHOOK_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_TIMESTAMP_HEADER,
    HttpCallbackSender,
    ReceiverUnreachable,
    encode_body,
    signed_headers,
    verify,
    verify_webhook,
)
from app.local.receiver import HOST, PATH, LocalReceiver
from app.process_control import free_port
from app.usecases import callbacks, monitor
from models import JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of

SECRET = "a-callback-secret-of-some-length"
URL_PASSWORD = "url-pass-never-shown"


class Recorder:
    """A loopback HTTP server that records every request line and answers by `answer`."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.requests: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                recorder.requests.append(self.requestline)
                answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def answer_with(status: int, **headers: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


@pytest.fixture
def servers() -> Iterator[Callable[..., Recorder]]:
    started: list[Recorder] = []

    def start(answer: Callable[[BaseHTTPRequestHandler], None]) -> Recorder:
        started.append(Recorder(answer))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def clients_made(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Client]:
    """Every httpx.Client made from here on (the real class, counted)."""
    made: list[httpx.Client] = []
    real = httpx.Client

    def counted(*args: Any, **kwargs: Any) -> httpx.Client:
        client = real(*args, **kwargs)
        made.append(client)
        return client

    monkeypatch.setattr(httpx, "Client", counted)
    return made


def one_post(url: str, timeout_s: float = 5) -> Any:
    sender = HttpCallbackSender(url, timeout_s=timeout_s)
    try:
        body = encode_body({"event_id": 1})
        return sender.post(body, signed_headers(SECRET, int(time.time()), body, 1))
    finally:
        sender.close()


# --- the sender alone ----------------------------------------------------------------------


def test_a_redirect_is_an_answer_and_is_not_followed(servers):
    """Catches the lazily made client following redirects (follow_redirects=True): the
    signed body would be sent again to wherever the Location points."""
    elsewhere = servers(answer_with(200))
    redirector = servers(answer_with(307, Location=f"{elsewhere.base}/stolen"))
    answer = one_post(f"{redirector.base}{PATH}")
    assert answer.status == 307
    assert len(redirector.requests) == 1
    assert elsewhere.requests == []


def test_no_proxy_or_certificate_setting_is_taken_from_the_environment(servers, monkeypatch):
    """Catches the lazily made client losing trust_env=False (httpx's default is True): the
    body would go through the environment's proxy, and SSL_CERT_FILE pointing nowhere would
    fail the client's making."""
    proxy = servers(answer_with(502))
    receiver = servers(answer_with(204))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.base)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca-bundle.pem")
    assert one_post(f"{receiver.base}{PATH}").status == 204
    assert proxy.requests == []
    assert receiver.requests == [f"POST {PATH} HTTP/1.1"]


def test_the_timeout_reaches_the_lazily_made_client(servers):
    """Catches the lazily made client losing its timeout (httpx's default is 5 s): a
    receiver that never answers holds the round 0.3 s, not 5."""
    release = threading.Event()

    def hang(handler: BaseHTTPRequestHandler) -> None:
        release.wait(10)

    silent = servers(hang)
    started = time.monotonic()
    try:
        with pytest.raises(ReceiverUnreachable, match="ReadTimeout"):
            one_post(f"{silent.base}{PATH}", timeout_s=0.3)
        assert time.monotonic() - started < 3
    finally:
        release.set()


def test_close_closes_the_client_a_failed_post_made_and_may_be_called_twice(
    clients_made,
):
    """Catches close() that leaves the client made at the first POST open (its pool and SSL
    context leak once per round): here after that POST found no receiver."""
    url = f"http://someone:{URL_PASSWORD}@{HOST}:{free_port(HOST)}{PATH}"
    sender = HttpCallbackSender(url, timeout_s=5)
    body = encode_body({"event_id": 1})
    with pytest.raises(ReceiverUnreachable) as caught:
        sender.post(body, signed_headers(SECRET, int(time.time()), body, 1))
    assert URL_PASSWORD not in str(caught.value)
    assert str(caught.value).startswith("ConnectError: ")
    assert len(clients_made) == 1 and not clients_made[0].is_closed
    sender.close()
    sender.close()
    assert clients_made[0].is_closed


# --- a whole delivery round through the real sender -----------------------------------------


def world_with_receiver_at(port: int, tmp_path, job_root, sqlite_factory, clock) -> World:
    url = f"http://flip:{URL_PASSWORD}@{HOST}:{port}{PATH}"
    nets = [net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120)]
    return world_of(
        nets,
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        CALLBACK_URL=url,
        CALLBACK_SECRET=SECRET,
        CALLBACK_MAX_BACKOFF_S=10,
    )


def test_a_round_through_the_real_sender_delivers_in_order_and_signed(
    tmp_path, job_root, sqlite_factory, clock, clients_made
):
    """Every other round test passes a fake sender: this one lets deliver_callbacks make the
    real one. Catches a sender whose POST drops the signed headers or the body, or a round
    that makes a client per event."""

    def signed_at_the_worlds_clock(headers: Any, body: bytes) -> bool:
        # The world's clock is frozen: the receiver checks the time against it.
        now_s = clock().timestamp()
        names = (WEBHOOK_ID_HEADER, WEBHOOK_TIMESTAMP_HEADER, WEBHOOK_SIGNATURE_HEADER)
        webhook = {name: headers[name] for name in names}
        return verify_webhook(SECRET, webhook, body, now_s=now_s) and verify(
            SECRET, headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER], body, now_s=now_s
        )

    receiver = LocalReceiver(SECRET, verifier=signed_at_the_worlds_clock)
    receiver.start()
    try:
        world = world_with_receiver_at(receiver.port, tmp_path, job_root, sqlite_factory, clock)
        job_id = world.enqueue("j1", net="net-a")
        world.run_pipeline(job_id)
        nvflare_id = world.job(job_id).nvflare_job_id
        assert nvflare_id is not None
        world.server("net-a").statuses[nvflare_id] = "FINISHED:COMPLETED"
        monitor.monitor_running_jobs(world.rt)
        assert world.job(job_id).state == JobState.COMPLETED
        report = callbacks.deliver_callbacks(world.rt)
    finally:
        receiver.stop()
    got = receiver.received
    assert all(r.valid and r.status == 200 for r in got)
    assert [r.payload["to_state"] for r in got] == [
        "QUEUED",
        "ASSIGNED",
        "DISPATCHING",
        "RUNNING",
        "COMPLETED",
    ]
    assert [r.event_id for r in got] == sorted(r.event_id for r in got)  # type: ignore[type-var]
    assert report.delivered == 5 and report.retry_in_s is None
    assert len(clients_made) == 1 and clients_made[0].is_closed


def test_a_round_that_reaches_no_receiver_backs_off_without_url_credentials(
    tmp_path, job_root, sqlite_factory, clock
):
    """The real sender against a closed loopback port: the round backs off (a wake-up is
    scheduled, nothing delivered), and last_error names the failure without the URL's
    password."""
    world = world_with_receiver_at(free_port(HOST), tmp_path, job_root, sqlite_factory, clock)
    job_id = world.enqueue("j1", net="net-a")
    report = callbacks.deliver_callbacks(world.rt)
    assert report.delivered == 0
    assert report.retry_in_s is not None and report.retry_in_s > 0
    with world.rt.sessions() as session:
        shown = callbacks.delivery_status(session, uuid.UUID(str(job_id)))
    assert "ConnectError" in shown.last_error
    assert URL_PASSWORD not in json.dumps(shown, default=str)
