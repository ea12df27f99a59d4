"""Status callbacks carry Standard Webhooks signatures (webhook-id, webhook-timestamp,
webhook-signature) that the `standardwebhooks` library itself verifies, as flip-api would,
over real HTTP on loopback from the real sender; the event id is signed, and the earlier
X-FL-Dispatcher-* headers are still sent (one release)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.adapters.callbacks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    encode_body,
    receiver_secret,
    signed_headers,
    verify,
    verify_webhook,
)
from app.errors import SettingsError
from app.local.receiver import Headers, LocalReceiver, Received
from app.logs import secret_values
from app.settings import Settings, load_settings
from app.usecases import callbacks, intake
from tests.fixtures.db import FrozenClock
from tests.unit.conftest import one_net_world

PLAIN_SECRET = "plain-callback-secret-0123456789"
WHSEC_SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _library_verifier(secret: str):
    """flip-api's check, done by the Standard Webhooks library (not by this project)."""
    webhook = Webhook(receiver_secret(secret))

    def check(headers: Headers, body: bytes) -> bool:
        wanted = ("webhook-id", "webhook-timestamp", "webhook-signature")
        sent = {name: headers[name] for name in wanted if headers[name] is not None}
        try:
            webhook.verify(body, sent)
        except WebhookVerificationError:
            return False
        return True

    return check


@pytest.mark.parametrize("secret", [PLAIN_SECRET, WHSEC_SECRET], ids=["plain", "whsec"])
def test_every_delivered_event_verifies_with_the_standard_webhooks_library(
    tmp_path, job_root, sqlite_factory, secret
):
    # The library checks the timestamp against the real clock: the world's starts now.
    clock = FrozenClock(datetime.now(UTC))
    seen: list[Received] = []
    receiver = LocalReceiver(secret, verifier=_library_verifier(secret), on_event=seen.append)
    with receiver:
        world = one_net_world(
            tmp_path,
            job_root,
            sqlite_factory,
            clock,
            CALLBACK_URL=receiver.url,
            CALLBACK_SECRET=secret,
        )
        job_id = world.enqueue("signed", net="net-a")
        world.run_pipeline(job_id)
        intake.record_refusal(world.rt, "refused", "unknown net 'net-9'")
        callbacks.deliver_callbacks(world.rt)
    assert [r.status for r in receiver.received] == [200] * 5  # 4 moves, 1 rejection
    ids = sorted(str(r.payload["event_id"]) for r in seen)
    assert sorted(r.headers["webhook-id"] for r in seen) == ids
    assert any(i.startswith("rejected-") for i in ids)


@pytest.mark.parametrize("receiving_with", ["old", "new"])
def test_during_a_rotation_receivers_on_the_old_and_on_the_new_secret_both_verify(
    tmp_path, job_root, sqlite_factory, receiving_with
):
    # CALLBACK_SECRET is the new secret, CALLBACK_PREVIOUS_SECRET the one it replaces:
    # every try carries a v1 signature with each, so neither receiver refuses a single
    # event (three refusals of one event give it up for good).
    clock = FrozenClock(datetime.now(UTC))
    old, new = PLAIN_SECRET, WHSEC_SECRET
    secret = {"old": old, "new": new}[receiving_with]
    receiver = LocalReceiver(secret, verifier=_library_verifier(secret))
    with receiver:
        world = one_net_world(
            tmp_path,
            job_root,
            sqlite_factory,
            clock,
            CALLBACK_URL=receiver.url,
            CALLBACK_SECRET=new,
            CALLBACK_PREVIOUS_SECRET=old,
        )
        world.run_pipeline(world.enqueue("rotated", net="net-a"))
        intake.record_refusal(world.rt, "refused", "unknown net 'net-9'")
        callbacks.deliver_callbacks(world.rt)
    assert [r.status for r in receiver.received] == [200] * 5  # 4 moves, 1 rejection
    # The shipped receiver helper accepts any listed signature too.
    for request in receiver.received:
        headers = {k.lower(): v for k, v in request.headers.items()}
        assert verify_webhook(secret, headers, request.body, now_s=time.time())


def _headers(secret: str, event_id: str = "42") -> tuple[bytes, dict[str, str]]:
    body = encode_body({"event_id": 42, "kind": "state_change", "to_state": "RUNNING"})
    return body, signed_headers(secret, int(time.time()), body, event_id)


def malformed_webhook_requests(secret: str) -> dict[str, tuple[dict[str, str], bytes]]:
    """A genuine request, signed now, with one header (or the body's encoding) broken in
    each way a receiver meets: case -> (headers, body). Built when the test runs, so only
    the broken part can be what is refused (never a timestamp gone stale)."""
    body = encode_body({"event_id": 1, "to_state": "RUNNING"})
    sent = signed_headers(secret, int(time.time()), body, 1)
    good = sent["webhook-signature"]
    missing = [
        (f"no-{name}", {k: v for k, v in sent.items() if k != name}, body)
        for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
    ]
    broken = [
        (label, {**sent, name: value}, body)
        for label, name, value in [
            ("signature-without-a-comma", "webhook-signature", "v1" + good[3:]),
            ("signature-not-base64", "webhook-signature", "v1,***"),
            ("signature-cut-short", "webhook-signature", good[:-5]),
            ("two-spaces-before-a-good-one", "webhook-signature", "v1,x  " + good),
            ("non-ascii-signature", "webhook-signature", "v1,é" + good[4:]),
            ("timestamp-not-a-number", "webhook-timestamp", "soon"),
            ("timestamp-of-400-digits", "webhook-timestamp", "9" * 400),
            ("non-ascii-timestamp", "webhook-timestamp", "\u0661\u0667" + "\u0660" * 8),
            ("empty-signature", "webhook-signature", ""),
            ("a-lone-surrogate-in-the-id", "webhook-id", "\udc80"),
        ]
    ]
    cases = [*missing, *broken, ("body-not-utf-8", sent, body + b"\xff")]
    return {case: (headers, sent_body) for case, headers, sent_body in cases}


MALFORMED_CASES = list(malformed_webhook_requests(PLAIN_SECRET))


@pytest.mark.parametrize("case", MALFORMED_CASES)
def test_the_shipped_receiver_answers_401_to_every_malformed_header(case):
    # Over real HTTP: header bytes as a client may send them (non-ASCII as UTF-8, a lone
    # surrogate as the raw byte it stands for), checked by app.adapters.callbacks.
    headers, body = malformed_webhook_requests(PLAIN_SECRET)[case]
    with LocalReceiver(PLAIN_SECRET) as receiver:
        raw = {k: v.encode("utf-8", "surrogateescape") for k, v in headers.items()}
        answer = httpx.post(receiver.url, content=body, headers=raw, timeout=10)
    assert answer.status_code == 401
    assert [r.status for r in receiver.received] == [401]


def test_the_event_id_is_signed_a_swapped_one_is_refused():
    body, headers = _headers(PLAIN_SECRET)
    webhook = Webhook(receiver_secret(PLAIN_SECRET))
    assert webhook.verify(body, headers) == json.loads(body)
    with pytest.raises(WebhookVerificationError):
        webhook.verify(body, {**headers, "webhook-id": "43"})
    with pytest.raises(WebhookVerificationError):
        Webhook(receiver_secret("another-secret-0123456789")).verify(body, headers)


def test_the_earlier_headers_are_still_sent_and_verify():
    body, headers = _headers(PLAIN_SECRET)
    assert verify(
        PLAIN_SECRET,
        headers[TIMESTAMP_HEADER],
        headers[SIGNATURE_HEADER],
        body,
        now_s=time.time(),
    )


def test_a_whsec_secret_is_handed_to_the_library_as_it_is():
    assert receiver_secret(WHSEC_SECRET) == WHSEC_SECRET
    plain = receiver_secret(PLAIN_SECRET)
    assert base64.b64decode(plain.removeprefix("whsec_")) == PLAIN_SECRET.encode()


_B64_32 = base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


@pytest.mark.parametrize(
    "bad",
    [
        "whsec_not*base64!",
        "whsec_" + base64.b64encode(b"fifteen-bytes!!").decode(),
        # base64 of 32 bytes but for one stray character (a paste): webhook_key, which
        # signs every callback, refuses it, so the start must too
        "whsec_" + _B64_32[:20] + " " + _B64_32[20:],
    ],
    ids=["not-base64", "15-bytes", "a-space-inside"],
)
def test_a_whsec_secret_that_is_not_base64_of_16_bytes_stops_the_start(tmp_path, bad):
    extra: dict[str, Any] = {"CALLBACK_URL": "http://127.0.0.1:9/cb", "CALLBACK_SECRET": bad}
    with pytest.raises(SettingsError) as caught:
        Settings(FL_DISPATCHER_DATA_DIR=tmp_path, **extra)
    assert str(caught.value) == (
        "CALLBACK_SECRET: a whsec_ secret must be base64 of at least 16 bytes after whsec_ "
        "(e.g. whsec_ + `openssl rand -base64 32`)"
    )
    assert bad not in str(caught.value)


def test_a_whsec_secret_with_a_non_ascii_character_stops_the_start_naming_it(tmp_path):
    """A whsec_ secret pasted with a non-ASCII character (a typographic quote, a non-breaking
    space) is as bad as one with a stray space: the start must stop with the CALLBACK_SECRET
    message, as for any other non-base64 secret. base64.b64decode raises a plain ValueError
    (not binascii.Error) for non-ASCII text, which _check_webhook_secret does not catch:
    pydantic wraps it and the operator reads "field '(net)': Value error, string argument
    should contain only ASCII characters", which names neither the setting nor the fix."""
    bad = "whsec_" + _B64_32[:20] + "\u00a0" + _B64_32[20:]
    extra: dict[str, Any] = {"CALLBACK_URL": "http://127.0.0.1:9/cb", "CALLBACK_SECRET": bad}
    with pytest.raises(SettingsError) as caught:
        load_settings(FL_DISPATCHER_DATA_DIR=tmp_path, **extra)
    assert str(caught.value) == (
        "CALLBACK_SECRET: a whsec_ secret must be base64 of at least 16 bytes after whsec_ "
        "(e.g. whsec_ + `openssl rand -base64 32`)"
    )
    with pytest.raises(SettingsError):
        Settings(FL_DISPATCHER_DATA_DIR=tmp_path, **extra)


def test_a_whsec_secret_of_exactly_16_bytes_is_accepted(tmp_path):
    secret = "whsec_" + base64.b64encode(b"sixteen-bytes!!!").decode()
    extra: dict[str, Any] = {"CALLBACK_URL": "http://127.0.0.1:9/cb", "CALLBACK_SECRET": secret}
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, **extra)
    assert settings.callback_secret.get_secret_value() == secret


@pytest.mark.parametrize(
    ("previous", "message"),
    [
        ("too-short", "CALLBACK_PREVIOUS_SECRET must be at least 16 characters"),
        (
            "whsec_not*base64!-but-long-enough",
            "CALLBACK_PREVIOUS_SECRET: a whsec_ secret must be base64 of at least 16 bytes "
            "after whsec_ (e.g. whsec_ + `openssl rand -base64 32`)",
        ),
    ],
    ids=["short", "whsec-not-base64"],
)
def test_a_previous_secret_follows_the_rules_of_the_secret(tmp_path, previous, message):
    extra: dict[str, Any] = {
        "CALLBACK_URL": "http://127.0.0.1:9/cb",
        "CALLBACK_SECRET": PLAIN_SECRET,
        "CALLBACK_PREVIOUS_SECRET": previous,
    }
    with pytest.raises(SettingsError) as caught:
        Settings(FL_DISPATCHER_DATA_DIR=tmp_path, **extra)
    assert str(caught.value) == message
    assert previous not in str(caught.value)


def test_the_previous_secret_is_masked_in_logs_and_unused_once_unset(tmp_path):
    extra: dict[str, Any] = {"CALLBACK_URL": "http://127.0.0.1:9/cb"}
    rotating = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path,
        CALLBACK_SECRET=WHSEC_SECRET,
        CALLBACK_PREVIOUS_SECRET=PLAIN_SECRET,
        **extra,
    )
    assert PLAIN_SECRET in secret_values(rotating)
    assert PLAIN_SECRET not in json.dumps(rotating.redacted())
    assert rotating.callback_signing_secrets == (WHSEC_SECRET, PLAIN_SECRET)
    done = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, CALLBACK_SECRET=WHSEC_SECRET, **extra)
    assert done.callback_signing_secrets == (WHSEC_SECRET,)
