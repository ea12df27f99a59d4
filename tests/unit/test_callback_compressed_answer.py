"""A receiver's compressed answer costs the callback sender no more than it means to read.

Promise (app/adapters/callbacks.py): "Of a receiver's answer only this much is read (the
excerpt kept is shorter still): a receiver that answers with a huge body must not make the
sender hold it all" (ANSWER_READ_BYTES = 4096).

Scenario: the receiver (flip-api, or whatever answers at CALLBACK_URL: a proxy, a captive
portal, a misrouted host) answers a callback 200 with `Content-Encoding: gzip` and a body
of about 200 KB that inflates to 200 MB of zeros. httpx asks for gzip by default
(`Accept-Encoding: gzip, deflate`) and `iter_bytes()` inflates each network read whole:
one POST made the sender allocate about 150 MB, and a few such answers at once (the
delivery task runs in every worker process) exhaust a small container's memory.

Expected: the sender asks for no encoding, reads at most ANSWER_READ_BYTES of the body as
sent, and inflates a compressed one (sent despite the ask) only that far.
"""

from __future__ import annotations

import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.adapters.callbacks import (
    ANSWER_READ_BYTES,
    Answer,
    HttpCallbackSender,
    signed_headers,
)

INFLATED_BYTES = 200 * 1024 * 1024


def _gzip_of_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    return packer.compress(b"\0" * size) + packer.flush()


@contextmanager
def _serving(body: bytes, encoding: str, seen: list[str] | None = None) -> Iterator[str]:
    """A receiver answering every POST 200 with `body` labelled `encoding`; the
    Accept-Encoding of each request goes to `seen`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            if seen is not None:
                seen.append(self.headers.get("Accept-Encoding", ""))
            self.send_response(200)
            self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/fl-callback"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    body = _gzip_of_zeros(INFLATED_BYTES)
    assert len(body) < 300_000
    with _serving(body, "gzip") as url:
        yield url


def _post(url: str) -> Answer:
    sender = HttpCallbackSender(url, timeout_s=20)
    body = b'{"event_id":1}'
    try:
        return sender.post(body, signed_headers("a-callback-secret-0123456789", 1, body, 1))
    finally:
        sender.close()


def test_a_compressed_answer_is_not_inflated_past_what_the_sender_reads(receiver: str) -> None:
    sender = HttpCallbackSender(receiver, timeout_s=20)
    body = b'{"event_id":1}'
    headers = signed_headers("a-callback-secret-0123456789", 1_700_000_000, body, 1)
    # A process's first POST loads httpx and httpcore (about 5 MB): a cost once, not the
    # answer's.
    _post(receiver)
    tracemalloc.start()
    try:
        answer = sender.post(body, headers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        sender.close()
    assert answer.status == 200
    # Generous: 256 times what the sender means to read, 1 MB.
    assert peak < 256 * ANSWER_READ_BYTES, (
        f"one answer of {INFLATED_BYTES // 2**20} MB inflated made the sender allocate "
        f"{peak / 2**20:.0f} MB (ANSWER_READ_BYTES is {ANSWER_READ_BYTES})"
    )


def test_a_callback_asks_for_an_answer_in_no_encoding() -> None:
    seen: list[str] = []
    with _serving(b"stored", "identity", seen) as url:
        assert _post(url) == Answer(200, "stored")
    assert seen == ["identity"]


def _packed(text: bytes, wbits: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return packer.compress(text) + packer.flush()


PACKED_ANSWERS = {
    "gzip": (_packed(b"stored, thanks", 31), "gzip"),
    "deflate": (_packed(b"stored, thanks", 15), "deflate"),  # zlib-wrapped, as RFC 9110
    "bare-deflate": (_packed(b"stored, thanks", -15), "deflate"),  # as some servers send
}


@pytest.mark.parametrize("body, encoding", PACKED_ANSWERS.values(), ids=PACKED_ANSWERS.keys())
def test_a_compressed_answer_sent_all_the_same_is_kept_as_its_text(
    body: bytes, encoding: str
) -> None:
    with _serving(body, encoding) as url:
        assert _post(url) == Answer(200, "stored, thanks")


def test_an_answer_in_an_encoding_the_sender_does_not_decode_is_still_an_answer() -> None:
    with _serving(b"\x8b\x02\x80stored\x03", "br") as url:
        assert _post(url) == Answer(200, "(an answer body in 'br' encoding)")
