"""The status callback receiver (flip-api) behind a small interface: the signing scheme,
its verification (what a receiver runs), and the HTTP sender.

Scheme: the body is compact JSON with sorted keys, sent as is. The signature is
`sha256=<hex HMAC-SHA256(CALLBACK_SECRET, "<timestamp>.<body>")>` where `<timestamp>` is
the sender's Unix time in whole seconds, also sent in its own header. A receiver recomputes
it over the raw body bytes, compares in constant time, and refuses a timestamp far from its
own clock (a captured request cannot be replayed later). Every try is signed afresh.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.settings import redact_url

TIMESTAMP_HEADER = "X-FL-Dispatcher-Timestamp"
SIGNATURE_HEADER = "X-FL-Dispatcher-Signature"
EVENT_ID_HEADER = "X-FL-Dispatcher-Event-Id"
SIGNATURE_PREFIX = "sha256="
# How far a receiver should accept the timestamp from its own clock, by default.
DEFAULT_TOLERANCE_S = 300
# A receiver's answer is kept in last_error only this far (it is for an operator's eye).
ANSWER_EXCERPT_CHARS = 200


def encode_body(payload: Mapping[str, Any]) -> bytes:
    """The exact bytes sent and signed: compact JSON, sorted keys, UTF-8."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value for `body` sent at `timestamp` (Unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return SIGNATURE_PREFIX + mac.hexdigest()


def verify(
    secret: str,
    timestamp: str,
    signature: str,
    body: bytes,
    *,
    now_s: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """What a receiver checks: the signature matches the raw body and the timestamp is
    within `tolerance_s` of its own clock `now_s`."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(now_s - sent_at) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, sent_at, body), signature)


def signed_headers(secret: str, timestamp: int, body: bytes, event_id: int | str) -> dict[str, str]:
    """Every header of one try."""
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
        EVENT_ID_HEADER: str(event_id),
    }


class ReceiverUnreachable(Exception):
    """No HTTP answer: refused, reset, timed out, TLS failure. The message is safe to
    store and log (no URL credentials, never the secret)."""


@dataclass(frozen=True)
class Answer:
    """The receiver's HTTP answer to one try."""

    status: int
    excerpt: str = ""


class CallbackSender(Protocol):
    """Posts one signed body to the receiver."""

    def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        """The receiver's answer; `ReceiverUnreachable` if there was none."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def describe_unreachable(exc: BaseException, url: str) -> str:
    """One line for last_error and the log: the error class and message, with the URL's
    credentials masked wherever the message quotes it."""
    text = f"{type(exc).__name__}: {exc}".replace(url, redact_url(url))
    return redact_url(text)


class HttpCallbackSender:
    """httpx, one client per delivery round: no redirects (a redirect is an answer, and
    following one would resend the signed body elsewhere), no proxy or certificate settings
    from the environment (configuration comes from Settings only)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        import httpx  # only a process that delivers loads it (the CLI's job view does not)

        self._url = url
        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False)

    def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST the body; an HTTP error status is an answer, not an exception."""
        import httpx

        try:
            response = self._client.post(self._url, content=body, headers=dict(headers))
        except httpx.TransportError as exc:
            raise ReceiverUnreachable(describe_unreachable(exc, self._url)) from None
        excerpt = " ".join(response.text[:ANSWER_EXCERPT_CHARS].split())
        return Answer(response.status_code, excerpt)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()
