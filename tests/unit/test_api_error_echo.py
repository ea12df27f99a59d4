"""The status API's refusals quote what the caller sent at most as a short, escaped excerpt.

Promise (app/entrypoints/api_errors.py): a refusal's JSON `detail` quotes a caller's input
at most as an excerpt of 80 characters, no markup, quote or control character in it
(`app.errors.quoted`), never whole; a plain value (a mistyped net, a key) reads as it was
sent, so the caller still sees what was wrong.

Scenario: an unknown net in `/nets?net=` with markup in it, a 60 KB caller_key in
`/jobs/by-key/...` and `/prewarms/...`, a bad `?state=`, a drain naming a thousand long
unknown nets, a body with a made-up field name. Each was quoted whole (60 KB in, 60 KB
out; markup as sent): a reflected value is what a scanner or a log of answers picks up.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from tests.unit.conftest import one_net_world

KEY = "echo-test-api-key-0123456789"
MARKUP = "<img src=x onerror=alert(1)>"
LONG = "k" * 60_000


@pytest.fixture
def client(tmp_path, job_root, sqlite_factory, clock) -> TestClient:
    world = one_net_world(
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
        ("GET", f"/jobs?state={MARKUP}", None, MARKUP),
        ("POST", "/drain", {"nets": [MARKUP]}, MARKUP),
        ("POST", "/drain", {"nets": ["n" * 1000] * 1000}, "n" * 1000),
        ("POST", "/undrain", {"nets": [MARKUP]}, MARKUP),
        ("POST", "/jobs", {"caller_key": "k", "definition": "d", MARKUP: 1}, MARKUP),
    ],
    ids=[
        "nets-page-net",
        "job-by-key",
        "prewarm-by-key",
        "jobs-state",
        "drain-net",
        "drain-many-nets",
        "undrain-net",
        "extra-field",
    ],
)
def test_an_error_detail_does_not_echo_what_was_sent(client, method, path, body, sent):
    answer = client.request(method, path, json=body, headers={"X-API-Key": KEY})
    assert 400 <= answer.status_code < 500, answer.status_code
    assert sent not in answer.text, (
        f"{answer.status_code} echoes the {len(sent)} characters sent: {answer.text[:90]}..."
    )
    assert len(answer.text) < 2_000, len(answer.text)


@pytest.mark.parametrize(
    ("path", "quote"),
    [
        ("/nets?net=net-b", "unknown net 'net-b'"),
        ("/jobs/by-key/flip-run-9", "no job with caller_key 'flip-run-9'"),
        ("/prewarms/warm-9", "no prewarm with caller_key 'warm-9'"),
        (f"/jobs/by-key/{LONG}", f"no job with caller_key '{'k' * 80}'... (60000 characters)"),
        (f"/nets?net={MARKUP}", r"unknown net '\x3cimg src=x onerror=alert(1)\x3e'"),
    ],
)
def test_an_error_detail_quotes_a_short_excerpt_of_what_was_sent(client, path, quote):
    detail = client.get(path).json()["detail"]
    assert detail == quote or detail.startswith(quote), detail
