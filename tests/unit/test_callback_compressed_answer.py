"""Review b: a receiver's compressed answer makes the callback sender hold it whole.

Promise (app/adapters/callbacks.py): "Of a receiver's answer only this much is read (the
excerpt kept is shorter still): a receiver that answers with a huge body must not make the
sender hold it all" (ANSWER_READ_BYTES = 4096).

Scenario: the receiver (flip-api, or whatever answers at CALLBACK_URL: a proxy, a captive
portal, a misrouted host) answers a callback 200 with `Content-Encoding: gzip` and a body
of about 200 KB that inflates to 200 MB of zeros. httpx asks for gzip by default
(`Accept-Encoding: gzip, deflate`) and `iter_bytes()` inflates each network read whole.

What happens: one POST makes the sender allocate about 150 MB (the first 64 KB read
inflates to 64 MB, then copied into `head`), 40,000 times ANSWER_READ_BYTES; a few such
answers at once (the delivery task runs in every worker process) exhaust a small
container's memory.
"""

from __future__ import annotations

import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.adapters.callbacks import ANSWER_READ_BYTES, HttpCallbackSender, signed_headers

INFLATED_BYTES = 200 * 1024 * 1024


def _gzip_of_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    return packer.compress(b"\0" * size) + packer.flush()


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    body = _gzip_of_zeros(INFLATED_BYTES)
    assert len(body) < 300_000

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/fl-callback"
    server.shutdown()
    server.server_close()


def test_a_compressed_answer_is_not_inflated_past_what_the_sender_reads(receiver: str) -> None:
    sender = HttpCallbackSender(receiver, timeout_s=20)
    body = b'{"event_id":1}'
    headers = signed_headers("a-callback-secret-0123456789", 1_700_000_000, body, 1)
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
