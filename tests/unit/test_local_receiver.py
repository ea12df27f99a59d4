"""The local callback receiver (demo, e2e) against the real HTTP sender on loopback: it
accepts what is signed with its secret, refuses anything else, and can go down and come
back on the same port."""

from __future__ import annotations

import time

import pytest

from app.adapters.callbacks import (
    HttpCallbackSender,
    ReceiverUnreachable,
    encode_body,
    signed_headers,
)
from app.local.receiver import LocalReceiver, Received

SECRET = "local-receiver-secret-0123456789"


@pytest.fixture
def receiver():
    seen: list[Received] = []
    server = LocalReceiver(SECRET, on_event=seen.append)
    server.seen = seen  # type: ignore[attr-defined]
    server.start()
    yield server
    server.stop()


def post(receiver: LocalReceiver, payload: dict, secret: str = SECRET, event_id=1) -> int:
    sender = HttpCallbackSender(receiver.url, timeout_s=5)
    try:
        body = encode_body(payload)
        return sender.post(body, signed_headers(secret, int(time.time()), body, event_id)).status
    finally:
        sender.close()


def test_a_signed_event_is_accepted_and_handed_on(receiver):
    payload = {
        "event_id": 7,
        "kind": "state_change",
        "job_id": "6f1c0c1e-aaaa",
        "from_state": None,
        "to_state": "QUEUED",
    }
    assert post(receiver, payload, event_id=7) == 200
    [got] = receiver.seen
    assert got.valid and got.payload == payload and got.event_id == 7
    assert got.headers["X-FL-Dispatcher-Event-Id"] == "7"
    assert got.describe() == "event 7  job 6f1c0c1e  - -> QUEUED"


def test_a_forged_event_is_refused_and_not_handed_on(receiver):
    assert (
        post(receiver, {"event_id": 8, "to_state": "FAILED"}, secret="another-secret-entirely")
        == 401
    )
    assert receiver.seen == []
    [got] = receiver.received
    assert not got.valid and got.status == 401


def test_it_goes_down_and_comes_back_on_the_same_port(receiver):
    port = receiver.port
    receiver.stop()
    with pytest.raises(ReceiverUnreachable):
        post(receiver, {"event_id": "rejected-1", "kind": "rejected", "reason": "x"})
    receiver.start()
    assert receiver.port == port
    assert post(receiver, {"event_id": "rejected-1", "kind": "rejected", "reason": "x"}) == 200
    assert receiver.seen[0].describe() == "event rejected-1  job -  rejected: x"


@pytest.fixture
def clients_made(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every httpx.Client made from here on (the real class, counted)."""
    import httpx

    made: list[object] = []
    real = httpx.Client

    def counted(*args: object, **kwargs: object) -> httpx.Client:
        client = real(*args, **kwargs)  # type: ignore[arg-type]
        made.append(client)
        return client

    monkeypatch.setattr(httpx, "Client", counted)
    return made


def test_a_round_with_nothing_to_post_makes_no_client(clients_made):
    # Most delivery rounds find nothing due; a client builds an SSL context.
    sender = HttpCallbackSender("http://127.0.0.1:9/never", timeout_s=5)
    sender.close()
    assert clients_made == []


def test_one_client_serves_every_post_of_a_round(receiver, clients_made):
    sender = HttpCallbackSender(receiver.url, timeout_s=5)
    try:
        for event_id in (1, 2):
            body = encode_body({"event_id": event_id})
            headers = signed_headers(SECRET, int(time.time()), body, event_id)
            assert sender.post(body, headers).status == 200
    finally:
        sender.close()
    assert len(clients_made) == 1
    assert [got.event_id for got in receiver.seen] == [1, 2]
