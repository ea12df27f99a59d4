"""The status callback receiver (flip-api) behind a small interface: the signing scheme,
its verification (what a receiver runs), and the HTTP sender.

Two signatures on every request, over the same raw body (compact JSON, sorted keys):

- Standard Webhooks (https://www.standardwebhooks.com): `webhook-id` (the event id),
  `webhook-timestamp` (Unix seconds) and `webhook-signature: v1,<base64 HMAC-SHA256 of
  "<id>.<timestamp>.<body>">`, so the event id is signed too and any Standard Webhooks
  library verifies it. The key: a CALLBACK_SECRET of the form `whsec_<base64>` is that
  secret (the decoded bytes); any other CALLBACK_SECRET is used as its UTF-8 bytes, which a
  receiver hands its library as `"whsec_" + base64(CALLBACK_SECRET)`.
- The earlier X-FL-Dispatcher-* headers, kept for one release so a receiver can switch:
  `sha256=<hex HMAC-SHA256(CALLBACK_SECRET as UTF-8, "<timestamp>.<body>")>`.

A receiver recomputes over the raw body bytes, compares in constant time, and refuses a
timestamp far from its own clock (a captured request cannot be replayed later). Every try
is signed afresh.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import ssl
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from app.redact import redact_text, redact_url

if TYPE_CHECKING:
    import httpx

TIMESTAMP_HEADER = "X-FL-Dispatcher-Timestamp"
SIGNATURE_HEADER = "X-FL-Dispatcher-Signature"
EVENT_ID_HEADER = "X-FL-Dispatcher-Event-Id"
SIGNATURE_PREFIX = "sha256="
WEBHOOK_ID_HEADER = "webhook-id"
WEBHOOK_TIMESTAMP_HEADER = "webhook-timestamp"
WEBHOOK_SIGNATURE_HEADER = "webhook-signature"
WEBHOOK_SECRET_PREFIX = "whsec_"  # noqa: S105 (the format's prefix, not a secret)
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
    within `tolerance_s` of its own clock `now_s`. False for any malformed header."""
    sent_at = _unix_seconds(timestamp)
    if sent_at is None or abs(now_s - sent_at) > tolerance_s:
        return False
    # compare_digest raises TypeError on non-ASCII text: refused, not an error.
    return signature.isascii() and hmac.compare_digest(sign(secret, sent_at, body), signature)


# A Unix time in seconds has 10 digits until the year 2286; far more is malformed (and an
# int too large for a float would raise in the comparison with the receiver's clock).
_MAX_TIMESTAMP_DIGITS = 15


def _unix_seconds(text: str) -> int | None:
    """A timestamp header's Unix seconds, or None unless it is plain ASCII digits."""
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_TIMESTAMP_DIGITS:
        return None
    return int(text)


def webhook_key(secret: str) -> bytes:
    """The Standard Webhooks HMAC key CALLBACK_SECRET stands for: the decoded bytes of a
    `whsec_<base64>` secret, otherwise the secret's UTF-8 bytes. ValueError for a `whsec_`
    secret that is not base64 (settings refuse it at start)."""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX):
        return secret.encode()
    try:
        key = base64.b64decode(secret[len(WEBHOOK_SECRET_PREFIX) :], validate=True)
    except binascii.Error:
        raise ValueError("a whsec_ secret must be base64 after its prefix") from None
    if not key:
        raise ValueError("a whsec_ secret must not be empty after its prefix")
    return key


def receiver_secret(secret: str) -> str:
    """What a receiver gives a Standard Webhooks library for this CALLBACK_SECRET."""
    if secret.startswith(WEBHOOK_SECRET_PREFIX):
        return secret
    return WEBHOOK_SECRET_PREFIX + base64.b64encode(secret.encode()).decode()


def webhook_signature(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: `v1,` and the base64 HMAC-SHA256 of
    `<id>.<timestamp>.<body>`."""
    signed = f"{event_id}.{timestamp}.".encode() + body
    mac = hmac.new(webhook_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now_s: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """What a Standard Webhooks receiver checks (`headers` with lower-case names): a `v1`
    signature among those sent matches id, timestamp and raw body, and the timestamp is
    within `tolerance_s` of its own clock. False for any malformed header, including the
    ones the `standardwebhooks` library refuses though a good signature is among them (an
    entry without exactly one comma, e.g. from a doubled space)."""
    event_id = headers.get(WEBHOOK_ID_HEADER)
    timestamp = headers.get(WEBHOOK_TIMESTAMP_HEADER)
    signatures = headers.get(WEBHOOK_SIGNATURE_HEADER)
    if not (event_id and timestamp and signatures):
        return False
    sent_at = _unix_seconds(timestamp)
    if sent_at is None or abs(now_s - sent_at) > tolerance_s:
        return False
    entries = signatures.split(" ")
    if not signatures.isascii() or any(entry.count(",") != 1 for entry in entries):
        return False
    try:
        expected = webhook_signature(secret, event_id, sent_at, body)
    except UnicodeEncodeError:  # an id no sender could have signed (a lone surrogate)
        return False
    return any(hmac.compare_digest(expected, sent) for sent in entries)


def signed_headers(
    secret: str,
    timestamp: int,
    body: bytes,
    event_id: int | str,
    previous: Sequence[str] = (),
) -> dict[str, str]:
    """Every header of one try: Standard Webhooks', and the earlier X-FL-Dispatcher-* ones
    (tasks/README.md "Status callbacks": kept for one release). `previous`: secrets a rotation is
    replacing; `webhook-signature` lists a v1 signature with each after the current one
    (space-separated, as Standard Webhooks allows), so a receiver on any of them verifies.
    The deprecated header carries the current secret's only."""
    signatures = [
        webhook_signature(key, str(event_id), timestamp, body)
        for key in dict.fromkeys((secret, *previous))
    ]
    return {
        "Content-Type": "application/json",
        WEBHOOK_ID_HEADER: str(event_id),
        WEBHOOK_TIMESTAMP_HEADER: str(timestamp),
        WEBHOOK_SIGNATURE_HEADER: " ".join(signatures),
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
    return redact_text(text)


# Of a receiver's answer only this much is read (the excerpt kept is shorter still): a
# receiver that answers with a huge body must not make the sender hold it all.
ANSWER_READ_BYTES = 4096
# What is kept of an answer whose body is not in the encoding its headers name.
UNDECODABLE_ANSWER = b"(an answer body that cannot be decoded)"


def _decoded_head(raw: bytes, content_encoding: str) -> bytes:
    """The answer's first bytes, read as sent, decoded as its Content-Encoding says into at
    most ANSWER_READ_BYTES: httpx's own decoders inflate each network read whole (a 64 KB
    read of gzip'd zeros is 64 MB), so the sender asks for no encoding and inflates here,
    bounded, what a receiver compresses all the same."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return raw
    if coding not in ("gzip", "x-gzip", "deflate"):
        # br, zstd or several codings: not worth a decoder for an operator's excerpt.
        return f"(an answer body in {coding[:40]!r} encoding)".encode()
    # 47 takes a gzip or zlib header (deflate is zlib-wrapped, RFC 9110); -15 a bare deflate
    # stream, which some servers send as `deflate` (httpx tries it too).
    for wbits in (47, -15):
        try:
            return zlib.decompressobj(wbits).decompress(raw, ANSWER_READ_BYTES)
        except zlib.error:
            continue
    return UNDECODABLE_ANSWER


class _Deadline:
    """When the POST under way must be over (time.monotonic()), shared by the connection
    that carries it: httpx's timeouts bound each read and write, and a receiver sending a
    byte every few seconds would never trip one."""

    def __init__(self) -> None:
        self.at = math.inf

    def bound(self, timeout: float | None, error: type[Exception]) -> float:
        """`timeout` cut to what is left of the deadline; `error` once nothing is left."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise error("the whole request took longer than CALLBACK_TIMEOUT_S")
        return left if timeout is None else min(timeout, left)


def _deadline_transport(deadline: _Deadline) -> httpx.HTTPTransport:
    """An httpx transport whose every connect, read and write ends by the deadline."""
    import httpcore
    import httpx

    class Stream(httpcore.NetworkStream):
        def __init__(self, stream: httpcore.NetworkStream) -> None:
            self._stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._stream.read(max_bytes, deadline.bound(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._stream.write(buffer, deadline.bound(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self._stream.close()

        def start_tls(
            self,
            ssl_context: ssl.SSLContext,
            server_hostname: str | None = None,
            timeout: float | None = None,
        ) -> httpcore.NetworkStream:
            bounded = deadline.bound(timeout, httpcore.ConnectTimeout)
            return Stream(self._stream.start_tls(ssl_context, server_hostname, bounded))

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    class Backend(httpcore.SyncBackend):
        def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Iterable[Any] | None = None,
        ) -> httpcore.NetworkStream:
            bounded = deadline.bound(timeout, httpcore.ConnectTimeout)
            return Stream(super().connect_tcp(host, port, bounded, local_address, socket_options))

    # No environment: no proxy, certificate or SSLKEYLOGFILE settings (Settings only).
    ssl_context = httpx.create_ssl_context(trust_env=False)
    transport = httpx.HTTPTransport(verify=ssl_context, trust_env=False)
    # httpx has no public way to choose the network backend its pool connects with; its
    # transport sends every request through `_pool` (a test trickles over real HTTP, so a
    # change there fails loudly rather than unbounding the deliveries).
    transport._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=Backend())
    return transport


def _as_text(body: bytes, encoding: str | None) -> str:
    """The answer's body as text for its excerpt, whatever charset it claims: a codec that is
    no text encoding (`hex`, `rot13`) raised LookupError out of the sender, which ended every
    delivery round on the same event; a text codec that refuses the `replace` handler
    (`idna`) or every decode (`undefined`) raises UnicodeError, read as UTF-8 just the same."""
    try:
        return body.decode(encoding or "utf-8", "replace")
    except (LookupError, UnicodeError):
        return body.decode("utf-8", "replace")


class HttpCallbackSender:
    """httpx, one client per delivery round: no redirects (a redirect is an answer, and
    following one would resend the signed body elsewhere), no proxy or certificate settings
    from the environment (configuration comes from Settings only). A whole POST (connect,
    send, the answer's status, headers and excerpt) ends within `timeout_s`, however slowly
    the receiver trickles. The client is made at the round's first POST: most rounds find
    nothing due, and a client builds an SSL context (measured: about 4% of an idle Celery
    worker's CPU when made every round)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._deadline = _Deadline()
        self._client: httpx.Client | None = None

    def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST the body; an HTTP error status is an answer, not an exception."""
        import httpx  # only a process that delivers loads it (the CLI's job view does not)

        if self._client is None:
            self._client = httpx.Client(
                timeout=self._timeout_s,
                follow_redirects=False,
                trust_env=False,
                transport=_deadline_transport(self._deadline),
                # The answer is only an excerpt for the record: asked uncompressed, and read
                # raw (`_decoded_head`) in case a receiver compresses it anyway.
                headers={"accept-encoding": "identity"},
            )
        self._deadline.at = time.monotonic() + self._timeout_s
        try:
            with self._client.stream(
                "POST", self._url, content=body, headers=dict(headers)
            ) as response:
                raw = bytearray()
                for chunk in response.iter_raw():
                    raw += chunk
                    if len(raw) >= ANSWER_READ_BYTES:
                        break  # the rest is never read; the connection is closed
                # A body its Content-Encoding does not describe is still an answer: the
                # status line came. (Let out, an error ended the round before any record,
                # and the same event came first again in every round after.)
                encoding = response.headers.get("content-encoding", "")
                head = _decoded_head(bytes(raw[:ANSWER_READ_BYTES]), encoding)
        except httpx.TransportError as exc:
            raise ReceiverUnreachable(describe_unreachable(exc, self._url)) from None
        finally:
            self._deadline.at = math.inf
        text = _as_text(head[:ANSWER_READ_BYTES], response.encoding)
        excerpt = " ".join(text[:ANSWER_EXCERPT_CHARS].split())
        return Answer(response.status_code, excerpt)

    def close(self) -> None:
        """Close the client's connections, if the round made one."""
        if self._client is not None:
            self._client.close()
