"""The Control API client holds no connection to the SuperLink between calls.

Seen in the compose stack (tests/containers/test_compose_stack.py): the SuperLink (flwr
1.42, uvicorn) stopped after a job waits, before it exits, for every connection still open
to it to close; the worker, the housekeeper and the api each keep a client of the net, and
an idle keep-alive connection from any of them held the stop 9 to 20 s, until the engine's
SIGKILL at `stop_timeout_s`. Here a plain HTTP/1.1 server stands in for the SuperLink and
says when the client's connection ended.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.adapters.flower.client import FlowerControlClient
from app.adapters.flower.proto import control_pb2


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the client says otherwise
    ended: threading.Event

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = control_pb2.ListNodesResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/protobuf")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle(self) -> None:
        try:
            super().handle()  # serves requests until the connection is closed
        finally:
            type(self).ended.set()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def superlink() -> Iterator[tuple[str, threading.Event]]:
    Handler.ended = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", Handler.ended
    finally:
        server.shutdown()
        server.server_close()


def test_a_call_leaves_no_connection_open_while_the_client_lives(superlink):
    address, ended = superlink
    client = FlowerControlClient(net_name="fl-1", address=address, insecure=True)
    assert client.connected_sites() == []
    assert client.connected  # the client itself stays usable
    assert ended.wait(5), "the connection outlived the call"
    assert client.connected_sites() == []  # and the next call opens a new one
    client.close()
