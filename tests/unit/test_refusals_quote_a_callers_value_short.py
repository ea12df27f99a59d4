"""Every refusal of the status API quotes a caller's value at most as an 80-character escaped
excerpt, never whole: POST /jobs and POST /prewarms refusing a definition, a net or a list
of sites, and the 410 that repeats a refused key's stored reason."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app import names
from app.entrypoints.api import create_app
from tasks import base
from tasks.registered import TASKS
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of

KEY = "echo-test-api-key-0123456789"
MARKUP = "<img src=x onerror=alert(1)>"
LONG_MARKUP = (MARKUP * 40)[:1000]


@pytest.fixture
def client(tmp_path, job_root, sqlite_factory, clock):
    # net-a declares its sites, so a job asking for others is refused for them.
    net = net_decl(tmp_path, "net-a", "ecs", sites=["site-1", "site-2"])
    world = world_of([net], tmp_path, job_root, sqlite_factory, clock, API_SECRET=KEY)
    base.set_runtime(world.rt)
    yield TestClient(create_app(world.rt))
    base.set_runtime(None)


def _assert_not_echoed(answer, sent: str) -> None:
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text[:200])
    assert MARKUP not in answer.text, f"markup echoed as sent: {answer.text[:160]}..."
    assert sent not in answer.text, f"{len(sent)} characters echoed whole: {answer.text[:160]}"


def test_post_jobs_refusing_a_definition_quotes_it_short_and_escaped(client):
    body = {"caller_key": "k-def", "definition": LONG_MARKUP, "net": "net-a"}
    answer = client.post("/jobs", json=body, headers={"X-API-Key": KEY})
    _assert_not_echoed(answer, LONG_MARKUP)


def test_post_jobs_refusing_unknown_sites_quotes_them_short_and_escaped(client):
    sites = [LONG_MARKUP]
    body = {"caller_key": "k-sites", "definition": "tiny-job", "required_sites": sites}
    body["net"] = "net-a"
    answer = client.post("/jobs", json=body, headers={"X-API-Key": KEY})
    _assert_not_echoed(answer, LONG_MARKUP)


def test_a_refused_enqueues_410_quotes_its_definition_short_and_escaped(client):
    """flip-api's enqueue task refused (recorded); the status API's 410 repeats its reason."""
    body = {"caller_key": "k-410", "definition": LONG_MARKUP, "net": "net-a"}
    refused = TASKS[names.ENQUEUE_JOB].run(payload=body)
    assert refused["reason_code"] == "rejected", refused
    answer = client.get("/jobs/by-key/k-410")
    assert answer.status_code == 410, answer.text[:200]
    _assert_not_echoed(answer, LONG_MARKUP)
