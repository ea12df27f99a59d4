"""The status API's contract with flip-api, on PostgreSQL built by migrations: lookup by
caller key, a reused key with another payload (409), cursor pages, the size limit enforced
by a real uvicorn before a body is read, and what /openapi.json tells a client generator
(operation ids, the API-key scheme, the callbacks as webhooks)."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from app.process_control import free_port
from app.schemas import job_id_for
from app.settings import Settings
from app.usecases import intake
from tests.fixtures.db import net_decl
from tests.unit.conftest import World

pytestmark = pytest.mark.integration

KEY = "contract-api-key-7f3a"
AUTH = {"X-API-Key": KEY}


@pytest.fixture
def world(tmp_path, job_root, pg_factory, clock) -> World:
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs")]),
        API_SECRET=KEY,
        API_MAX_BODY_BYTES=64 * 1024,
    )
    return World(settings, pg_factory, clock)


@pytest.fixture
def client(world) -> Iterator[TestClient]:
    with TestClient(create_app(world.rt)) as client:
        yield client


BODY = {"caller_key": "flip/run-1", "definition": "tiny-job", "net": "net-a"}


def test_a_job_is_found_by_its_caller_key_even_one_with_slashes(client, world):
    assert client.post("/jobs", json=BODY, headers=AUTH).status_code == 201
    found = client.get("/jobs/by-key/flip/run-1")
    assert found.status_code == 200
    assert (found.json()["id"], found.json()["caller_key"]) == (
        str(job_id_for("flip/run-1")),
        "flip/run-1",
    )
    listed = client.get("/jobs", params={"caller_key": "flip/run-1"}).json()
    assert [j["id"] for j in listed["jobs"]] == [found.json()["id"]]

    missing = client.get("/jobs/by-key/nobody")
    assert (missing.status_code, missing.json()["detail"]) == (
        404,
        "no job with caller_key 'nobody'",
    )
    intake.record_refusal(world.rt, "refused-1", "unknown net 'net-9'")
    refused = client.get("/jobs/by-key/refused-1")
    assert refused.status_code == 410
    assert refused.json()["reason_code"] == "rejected"


def test_a_reused_caller_key_with_another_payload_is_409_and_changes_nothing(client):
    first = client.post("/jobs", json=BODY, headers=AUTH)
    same = client.post("/jobs", json=BODY, headers=AUTH)
    other = client.post("/jobs", json={**BODY, "priority": 9}, headers=AUTH)
    assert (first.status_code, same.status_code, other.status_code) == (201, 200, 409)
    assert same.json()["job_id"] == first.json()["job_id"]
    assert other.json()["reason_code"] == "caller_key_conflict"
    assert other.json()["detail"].startswith(
        f"caller_key 'flip/run-1' already names job {first.json()['job_id']}"
    )
    assert client.get("/jobs/by-key/flip/run-1").json()["priority"] == 0


def test_jobs_come_in_cursor_pages_each_job_once(client, world):
    made = [str(world.enqueue(f"page-{n}", net="net-a")) for n in range(5)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/jobs", params=params).json()
        pages += 1
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == made[::-1]  # newest first, none twice, none missed
    bad = client.get("/jobs", params={"cursor": "bm90LWEtY3Vyc29y"})
    assert (bad.status_code, bad.json()["detail"]) == (400, "cursor is not one this API returned")


@pytest.mark.parametrize(
    "instant", ["9999-12-31T23:00:00-05:00", "0001-01-01T01:00:00+05:00", "2026-01-01T00:00:00"]
)
def test_a_tampered_cursor_is_a_400_even_when_its_instant_leaves_the_calendar_in_utc(
    client, world, instant
):
    """A cursor's instant is compared in UTC: one whose UTC instant is past year 9999 or
    before year 1 cannot be a job's, and is the documented 400, not a 500."""
    world.enqueue("k-page", net="net-a")
    raw = f"{instant}|{job_id_for('k-page')}"
    cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    bad = client.get("/jobs", params={"cursor": cursor})
    assert (bad.status_code, bad.json()["detail"]) == (400, "cursor is not one this API returned")


def test_the_openapi_document_names_operations_the_key_scheme_and_the_webhooks(client):
    openapi = client.get("/openapi.json").json()
    ids = {
        (method.upper(), path): op["operationId"]
        for path, ops in openapi["paths"].items()
        for method, op in ops.items()
    }
    assert ids == {
        ("GET", "/healthz"): "get_health",
        ("GET", "/readyz"): "get_readiness",
        ("GET", "/metrics"): "get_metrics",
        ("GET", "/fl/status"): "get_fl_status",
        ("GET", "/nets"): "get_nets_page",
        ("GET", "/jobs"): "list_jobs",
        ("GET", "/jobs/by-key/{caller_key}"): "get_job_by_caller_key",
        ("GET", "/jobs/{job_id}"): "get_job",
        ("POST", "/jobs"): "enqueue_job",
        ("POST", "/jobs/{job_id}/abort"): "abort_job",
        ("POST", "/prewarms"): "prewarm_net",
        ("POST", "/prewarms/cancel"): "cancel_prewarm",
        ("GET", "/prewarms/{caller_key}"): "get_prewarm",
        ("GET", "/drain"): "get_drain",
        ("POST", "/drain"): "drain",
        ("POST", "/undrain"): "undrain",
    }
    assert openapi["components"]["securitySchemes"]["ApiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "equal to API_SECRET",
    }
    assert openapi["paths"]["/jobs"]["post"]["security"] == [{"ApiKey": []}]
    assert "security" not in openapi["paths"]["/jobs"]["get"]
    for path in ("/prewarms", "/prewarms/cancel", "/drain", "/undrain"):
        assert openapi["paths"][path]["post"]["security"] == [{"ApiKey": []}]
    assert "security" not in openapi["paths"]["/drain"]["get"]
    assert "security" not in openapi["paths"]["/prewarms/{caller_key}"]["get"]
    assert set(openapi["webhooks"]) == {"state_change", "rejected"}
    hook = openapi["webhooks"]["state_change"]["post"]
    ref = hook["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/StateChangeEvent")


# --- the size limit, against a real server ---------------------------------------------------


@pytest.fixture
def served(world) -> Iterator[int]:
    port = free_port("127.0.0.1")
    config = uvicorn.Config(create_app(world.rt), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(10)


def _answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_50_mb_body_is_refused_413_before_any_of_it_is_sent(served):
    """Only the headers go out: the server answers 413 on the declared length alone."""
    with socket.create_connection(("127.0.0.1", served)) as sock:
        sock.sendall(
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-API-Key: " + KEY.encode() + b"\r\nContent-Length: 52428800\r\n\r\n"
        )
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_chunked_body_is_cut_off_once_past_the_limit(served):
    """No Content-Length: the server counts what arrives and answers 413 once the limit is
    passed, while the client still has most of its 50 MB unsent."""
    chunk = b"x" * 65536
    sent = 0
    with socket.create_connection(("127.0.0.1", served)) as sock:
        sock.sendall(
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-API-Key: " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        sock.settimeout(0.2)
        answer = b""
        try:
            while sent < 50 * 1024 * 1024:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
                try:
                    answer = sock.recv(65536)
                except TimeoutError:
                    continue
                if answer:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        if not answer:
            answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 5 * 1024 * 1024  # refused long before the whole body


def test_a_queued_jobs_view_says_its_project_its_place_in_line_and_why_it_waits(client, world):
    """Issue 40: GET /jobs/{id} of a QUEUED job shows project_id, place_in_line and
    waiting_reason (one of the documented words), the schema declares them, and a job out of
    the queue shows null for both."""
    from app.usecases import claims

    for key, project in (("q-run", "p-1"), ("q-next", "p-1"), ("q-later", "p-1")):
        body = {**BODY, "caller_key": key, "metadata": {"project_id": project}}
        world.clock.advance(1)  # in this order (the same instant would order them by id)
        assert client.post("/jobs", json=body, headers=AUTH).status_code == 201
    with world.rt.sessions.begin() as session:
        assert claims.claim_next_job(session, world.rt.settings, world.clock()) is not None
    views = {
        key: client.get(f"/jobs/{job_id_for(key)}").json() for key in ("q-run", "q-next", "q-later")
    }
    assert [(v["project_id"], v["place_in_line"], v["waiting_reason"]) for v in views.values()] == [
        ("p-1", None, None),
        ("p-1", 1, "no free net"),
        ("p-1", 2, "no free net"),
    ]
    schema = client.get("/openapi.json").json()["components"]["schemas"]["JobDetail"]
    reason = schema["properties"]["waiting_reason"]["anyOf"][0]
    assert reason["enum"] == [
        "earlier run settling",
        "project at its cap",
        "net drained",
        "no free net",
        "claim pending",
        "no declared net fits it",
    ]
    assert "place_in_line" in schema["properties"] and "project_id" in schema["properties"]
