"""Prewarm on PostgreSQL: racing requests on real concurrent connections (the unit tier's
SQLite takes its write lock at BEGIN, so it never races), and the HTTP answers as
/openapi.json documents them."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app import names
from app.entrypoints.api import create_app
from app.errors import CallerKeyConflict
from app.schemas import PrewarmNet
from app.settings import Settings
from app.usecases import dispatch, prewarm
from app.usecases.prewarm import warm_up as prewarm_warm_up
from models import JobState, NetEvent, NetState, Prewarm
from tests.fixtures.db import net_decl
from tests.unit.conftest import World

pytestmark = pytest.mark.integration

KEY = "prewarm-pg-key-0123456"
AUTH = {"X-API-Key": KEY}
RACERS = 8


@pytest.fixture
def world(tmp_path, job_root, pg_factory, clock) -> World:
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60)]),
        PER_JOB_FL_SERVER="true",
        API_SECRET=KEY,
    )
    return World(settings, pg_factory, clock)


def race(calls: list[Callable[[], Any]]) -> list[Any]:
    """The calls started together on threads of their own; each one's result or error."""
    barrier = threading.Barrier(len(calls), timeout=10)
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = calls[index]()
        except Exception as exc:  # the test reads what each racer got
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def starts(world: World) -> int:
    with world.rt.sessions() as session:
        return len(
            session.scalars(select(NetEvent).where(NetEvent.to_state == NetState.STARTING)).all()
        )


def test_racing_repeats_of_one_key_make_one_prewarm_and_one_start(world, monkeypatch):
    """Every racer has read the key as new before any inserts it: one wins, the others lose
    on the key and leave the warm-up to the winner. (A repeat that arrives after the winner's
    commit, on a net still STARTING, sends it again by design: its first send may have been
    lost. Threads merely started together on a loaded machine did arrive that late, once.)"""
    request = PrewarmNet(caller_key="p1", net="net-a", within_s=120)
    all_read = threading.Barrier(RACERS, timeout=10)
    first_read = threading.local()
    accepted = prewarm._accepted

    def read_then_wait(*args: Any, **kwargs: Any) -> Any:
        found = accepted(*args, **kwargs)
        if not getattr(first_read, "done", False):
            first_read.done = True
            assert found is None
            all_read.wait()
        return found

    monkeypatch.setattr(prewarm, "_accepted", read_then_wait)
    results = race([lambda: prewarm.request_prewarm(world.rt, request)] * RACERS)
    assert [r.created for r in results].count(True) == 1, results
    assert starts(world) == 1
    assert [t for t, _ in world.outbox.sent].count(names.WARM_UP) == 1
    with world.rt.sessions() as session:
        assert len(session.scalars(select(Prewarm)).all()) == 1


def test_racing_keys_with_another_payload_are_refused_and_one_wins(world):
    results = race(
        [
            lambda n=n: prewarm.request_prewarm(
                world.rt, PrewarmNet(caller_key="p1", net="net-a", within_s=60 + n)
            )
            for n in range(RACERS)
        ]
    )
    assert sum(isinstance(r, prewarm.Requested) for r in results) == 1
    assert sum(isinstance(r, CallerKeyConflict) for r in results) == RACERS - 1
    assert starts(world) == 1


def test_prewarms_racing_a_claim_start_the_net_once(world):
    job_id = world.enqueue("job", net="net-a")
    calls: list[Callable[[], Any]] = [
        lambda n=n: prewarm.request_prewarm(
            world.rt, PrewarmNet(caller_key=f"p{n}", net="net-a", within_s=120)
        )
        for n in range(RACERS - 1)
    ]
    calls.append(lambda: dispatch.claim_and_start(world.rt))
    race(calls)
    # A claim that found the net's row locked by a prewarm skips it (SKIP LOCKED): the next
    # assign round (its kick, or beat's) claims the net, STARTING now, without a start.
    dispatch.claim_and_start(world.rt)
    assert world.job(job_id).state == JobState.ASSIGNED
    assert world.net("net-a").state == NetState.STARTING
    assert starts(world) == 1
    # Whoever started it, its job's chain or one warm-up asks the driver: one replica.
    dispatch.scale_up(world.rt, job_id, "net-a", 0)
    prewarm_warm_up.warm_up(world.rt, "net-a")
    assert world.driver("net-a").replicas == 1


def documented(openapi: dict, method: str, path: str, status: int) -> dict:
    answer = openapi["paths"][path][method.lower()]["responses"][str(status)]
    schema = answer["content"]["application/json"]["schema"]
    return {**schema, "components": openapi["components"]}


def test_every_prewarm_answer_is_the_one_openapi_documents(world):
    body = {"caller_key": "flip/p1", "net": "net-a", "within_s": 120}
    with TestClient(create_app(world.rt)) as client:
        openapi = client.get("/openapi.json").json()
        calls = [
            ("POST", "/prewarms", client.post("/prewarms", json=body, headers=AUTH)),
            ("POST", "/prewarms", client.post("/prewarms", json=body, headers=AUTH)),
            (
                "POST",
                "/prewarms",
                client.post("/prewarms", json={**body, "within_s": 5}, headers=AUTH),
            ),
            (
                "POST",
                "/prewarms",
                client.post(
                    "/prewarms", json={**body, "caller_key": "x", "net": "z"}, headers=AUTH
                ),
            ),
            ("POST", "/prewarms", client.post("/prewarms", json={"net": "net-a"}, headers=AUTH)),
            ("POST", "/prewarms", client.post("/prewarms", json=body)),
            ("GET", "/prewarms/{caller_key}", client.get("/prewarms/flip/p1")),
            ("GET", "/prewarms/{caller_key}", client.get("/prewarms/x")),
            ("GET", "/prewarms/{caller_key}", client.get("/prewarms/nope")),
            ("GET", "/fl/status", client.get("/fl/status")),
            (
                "POST",
                "/prewarms/cancel",
                client.post("/prewarms/cancel", json={"caller_key": "flip/p1"}, headers=AUTH),
            ),
            (
                "POST",
                "/prewarms/cancel",
                client.post("/prewarms/cancel", json={"caller_key": "x"}, headers=AUTH),
            ),
        ]
    assert [r.status_code for _, _, r in calls] == [
        201, 200, 409, 400, 422, 401, 200, 410, 404, 200, 200, 410,
    ]  # fmt: skip
    for method, path, response in calls:
        schema = documented(openapi, method, path, response.status_code)
        jsonschema.validate(response.json(), schema, cls=jsonschema.Draft202012Validator)
    assert calls[9][2].json()["nets"][0]["prewarm"]["caller_key"] == "flip/p1"
