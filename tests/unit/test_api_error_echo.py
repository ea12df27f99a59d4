"""Review b: the status API's errors echo what the caller sent.

Promise (app/entrypoints/api_errors.py): each refusal is "answered with its status and a
JSON `detail` that never echoes the input or quotes the database's words"; and
`validation_response`: "the input is not echoed back".

What happens: a 400 or 404 quotes the caller's value whole, however long and whatever it
holds: an unknown net in `/nets?net=` (markup included), a caller_key in
`/jobs/by-key/...` and `/prewarms/...` (60 KB in, 60 KB out).
Low severity (JSON, not HTML), but it is the promise, and a reflected value is what a
scanner or a log of answers picks up.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of

KEY = "echo-test-api-key-0123456789"
MARKUP = "<img src=x onerror=alert(1)>"
LONG = "k" * 60_000


@pytest.fixture
def client(tmp_path, job_root, sqlite_factory, clock) -> TestClient:
    world = world_of(
        [net_decl(tmp_path, "net-a", "ecs")],
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        API_SECRET=KEY,
    )
    return TestClient(create_app(world.rt))


@pytest.mark.parametrize(
    ("method", "path", "body", "sent"),
    [
        ("GET", f"/nets?net={MARKUP}", None, MARKUP),
        ("GET", f"/jobs/by-key/{LONG}", None, LONG),
        ("GET", f"/prewarms/{LONG}", None, LONG),
    ],
    ids=["nets-page-net", "job-by-key", "prewarm-by-key"],
)
def test_an_error_detail_does_not_echo_what_was_sent(client, method, path, body, sent):
    answer = client.request(method, path, json=body, headers={"X-API-Key": KEY})
    assert 400 <= answer.status_code < 500, answer.status_code
    detail = answer.json()["detail"]
    assert sent not in detail, (
        f"{answer.status_code} echoes the {len(sent)} characters sent: {detail[:90]}..."
    )
