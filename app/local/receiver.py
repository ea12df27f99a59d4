"""A tiny status-callback receiver on loopback, doing what flip-api's endpoint does: check
the signature over the raw body before parsing it, keep the event, answer 2xx (401 for a
bad signature). Used by `fl-dispatcher demo` and the end-to-end tests.

It binds one port for its whole life, so it can be stopped (connections are refused: a
receiver that is down) and started again on the same port, as a restarted flip-api would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from app.adapters.callbacks import (
    WEBHOOK_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_TIMESTAMP_HEADER,
    verify_webhook,
)
from app.process_control import free_port

HOST = "127.0.0.1"
PATH = "/fl/callbacks"


class Headers(Protocol):
    """The request's headers as the HTTP server hands them over (case-insensitive)."""

    def __getitem__(self, name: str) -> str | None: ...


# (headers, raw body) -> is the signature good? (tasks/README.md's verify_callback fits)
Verifier = Callable[[Headers, bytes], bool]


@dataclass(frozen=True)
class Received:
    """One request as it arrived, and what was answered."""

    headers: dict[str, str]
    body: bytes
    payload: dict[str, Any]
    valid: bool
    status: int
    at: float  # time.monotonic() on arrival

    @property
    def event_id(self) -> int | str | None:
        """The event's id (an int for a state change, "rejected-<n>" for a rejection)."""
        value = self.payload.get("event_id")
        return value if isinstance(value, int | str) else None

    def describe(self) -> str:
        """One line: event id, job and the move (or the rejection's reason)."""
        job = str(self.payload.get("job_id") or "-")[:8]
        if self.payload.get("kind") == "rejected":
            what = f"rejected: {self.payload.get('reason', '')}"
        else:
            what = f"{self.payload.get('from_state') or '-'} -> {self.payload.get('to_state')}"
        return f"event {self.event_id}  job {job}  {what}"


class LocalReceiver:
    """A threaded HTTP receiver of signed callbacks; `start()`, always `stop()`."""

    def __init__(
        self,
        secret: str,
        *,
        port: int | None = None,
        verifier: Verifier | None = None,
        on_event: Callable[[Received], None] | None = None,
    ) -> None:
        self.secret = secret
        self.port = port or free_port(HOST)
        self._verifier = verifier or self._verify
        self._on_event = on_event
        self._received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """What CALLBACK_URL should be."""
        return f"http://{HOST}:{self.port}{PATH}"

    @property
    def received(self) -> list[Received]:
        """Every request so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._received)

    @property
    def running(self) -> bool:
        """True while the port is being served."""
        return self._server is not None

    def __enter__(self) -> LocalReceiver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _verify(self, headers: Headers, body: bytes) -> bool:
        # The Standard Webhooks signature, which signs the event id as well.
        names = (WEBHOOK_ID_HEADER, WEBHOOK_TIMESTAMP_HEADER, WEBHOOK_SIGNATURE_HEADER)
        sent = {name: headers[name] for name in names}
        present = {name: value for name, value in sent.items() if value is not None}
        return verify_webhook(self.secret, present, body, now_s=time.time())

    def _handle(self, headers: Headers, items: dict[str, str], body: bytes) -> int:
        try:
            valid = self._verifier(headers, body)
        except (AttributeError, TypeError, ValueError):  # malformed headers: refused
            valid = False
        payload: dict[str, Any] = {}
        status = 200 if valid else 401
        if valid:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                payload = parsed
            else:
                status = 400
        received = Received(items, body, payload, valid, status, time.monotonic())
        with self._lock:
            self._received.append(received)
        if self._on_event is not None and status == 200:
            self._on_event(received)
        return status

    def start(self) -> None:
        """Listen (again) on the receiver's port."""
        if self._server is not None:
            return
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path != PATH:
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver._handle(self.headers, dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the dispatcher's own log says what it sent

        server = ThreadingHTTPServer((HOST, self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening: new connections are refused until `start()`."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
