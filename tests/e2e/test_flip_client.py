"""Done-when for the public contract (issue 21): flip-api's side written with nothing of
this project, only Celery, httpx, standardwebhooks, jsonschema and the document
`fl-dispatcher schema` prints. It enqueues with a plain `send_task`, computes the job id
from the printed namespace, looks the job up by its caller key over HTTP, verifies every
callback with the Standard Webhooks library, reports the results, maps every reason code to
FLIP's statuses, and validates what it sent and received (tasks, callbacks, HTTP answers)
against the printed schemas and /openapi.json. The stack it talks to is started by
tests/e2e/conftest.py (a real worker with beat, the status API, NVFLARE server and sites).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from celery import Celery
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

SECRET = "whsec_" + base64.b64encode(b"flip-client-secret-32-bytes-long").decode()
RUN_S = 300
SITES = ["site-1", "site-2"]


def _validate(schema: dict[str, Any], value: Any) -> None:
    jsonschema.validate(
        value,
        schema,
        cls=jsonschema.Draft202012Validator,
        format_checker=jsonschema.FormatChecker(),
    )


class Endpoint:
    """flip-api's callback endpoint: verifies with the Standard Webhooks library before
    parsing, 401 otherwise, and keeps what it accepted."""

    def __init__(self) -> None:
        self.webhook = Webhook(SECRET)
        self.accepted: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.refused = 0
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    event = endpoint.webhook.verify(body, headers)
                except WebhookVerificationError:
                    status = 401
                    with endpoint.lock:
                        endpoint.refused += 1
                else:
                    status = 200
                    with endpoint.lock:
                        endpoint.accepted.append((headers, event))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/fl/callbacks"

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [event for _, event in self.accepted]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wait(what: str, found: Callable[[], Any], timeout_s: float = RUN_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def contract() -> dict[str, Any]:
    """The contract as flip-api gets it: the command's output, nothing imported."""
    command = Path(sys.executable).with_name("fl-dispatcher")
    done = subprocess.run(
        [str(command), "schema"], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    server = Endpoint()
    yield server
    server.close()


@pytest.fixture(scope="module")
def flip(client_stack_factory, endpoint):
    return client_stack_factory(endpoint.url, SECRET)


def test_flip_api_drives_a_job_through_the_contract_alone(flip, endpoint, contract):
    celery = Celery("flip-api", broker=flip.broker_url)
    celery.conf.update(task_serializer="json", accept_content=["json"])
    http = httpx.Client(base_url=flip.api_url, timeout=10)

    def api_up() -> bool:
        try:
            return http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    _wait("the status API to answer", api_up, 60)
    openapi = http.get("/openapi.json").json()

    def send(task: str, payload: dict[str, Any]) -> None:
        _validate(contract["tasks"][task], payload)  # what flip-api sends is in the contract
        celery.send_task(task, kwargs={"payload": payload}, queue=contract["queue"])

    def answer_schema(path: str, status: int) -> dict[str, Any]:
        answer = openapi["paths"][path]["get"]["responses"][str(status)]
        return {
            **answer["content"]["application/json"]["schema"],
            "components": openapi["components"],
        }

    try:
        caller_key = f"flip-client/{uuid.uuid4().hex[:8]}"
        namespace = uuid.UUID(contract["job_id"]["namespace"])
        job_id = str(uuid.uuid5(namespace, caller_key))
        enqueue = {
            "caller_key": caller_key,
            "definition": "tiny-fedavg",
            "required_sites": SITES,
            "metadata": {"model_id": "m-client", "project_id": "p-1"},
        }
        send("fl_dispatcher.enqueue_job", enqueue)

        # Looked up by its key over HTTP: the id is the one flip-api computed.
        def by_key() -> dict[str, Any] | None:
            response = http.get(f"/jobs/by-key/{caller_key}")
            return response.json() if response.status_code == 200 else None

        job = _wait("the job by its caller key", by_key, 60)
        assert job["id"] == job_id
        _validate(answer_schema("/jobs/by-key/{caller_key}", 200), job)

        # The server holds the finished run for flip-api's results report.
        def state_events(state: str) -> list[dict[str, Any]]:
            return [
                e
                for e in endpoint.events()
                if e["kind"] == "state_change" and e["job_id"] == job_id and e["to_state"] == state
            ]

        _wait("FINISHING", lambda: state_events("FINISHING"))
        send(
            "fl_dispatcher.report_job_status",
            {"job_id": job_id, "status": "results_uploaded", "detail": "uploaded"},
        )
        [completed] = _wait("COMPLETED", lambda: state_events("COMPLETED"))
        assert completed["reason_code"] == "results_uploaded"

        # A refused enqueue and a reused key: rejected events with their codes.
        send(
            "fl_dispatcher.enqueue_job", {**enqueue, "caller_key": "flip-client-bad", "net": "nope"}
        )
        send("fl_dispatcher.enqueue_job", {**enqueue, "metadata": {"model_id": "other"}})
        rejected = _wait(
            "two rejected events",
            lambda: (
                (r := [e for e in endpoint.events() if e["kind"] == "rejected"])
                and len(r) >= 2
                and r
            ),
        )
        assert {e["reason_code"] for e in rejected} == {"rejected", "caller_key_conflict"}
        listed = http.get("/jobs", params={"caller_key": caller_key, "limit": 1}).json()
        _validate(answer_schema("/jobs", 200), listed)
        assert [j["id"] for j in listed["jobs"]] == [job_id]
    finally:
        celery.close()
        http.close()

    # Every callback verified (none refused), matched its webhook-id, and is in the contract.
    assert endpoint.refused == 0
    for headers, event in endpoint.accepted:
        assert headers["webhook-id"] == str(event["event_id"])
        _validate(contract["callbacks"][event["kind"]], event)

    # flip-api's mapping, from the contract alone: every code, every end it may come with.
    def flip_status(code: str, state: str | None) -> tuple[str | None, str | None]:
        entry = contract["reason_codes"][code]["flip"][state or "rejected"]
        return entry["model_status"], entry["job_status"]

    for code, entry in contract["reason_codes"].items():
        for state in entry["flip"]:
            model_status, _ = flip_status(code, None if state == "rejected" else state)
            assert model_status in {
                None,
                "RESULTS_UPLOADED",
                "RESULTS_UPLOAD_FAILED",
                "ERROR",
                "STOPPED",
            }, (code, state)
    assert flip_status(completed["reason_code"], "COMPLETED") == ("RESULTS_UPLOADED", "COMPLETED")
    assert flip_status("rejected", None) == ("ERROR", "COMPLETED")
