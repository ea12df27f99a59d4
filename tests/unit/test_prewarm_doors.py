"""Prewarm through its doors: the Celery tasks (as functions), the HTTP routes and the
client, each answering what the use case decided; and a job's prewarm_key through the
enqueue task, POST /jobs and the client, with the migration that stores it (tasks/README.md
"Prewarm")."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect, select

from app import migrate, names
from app.client import DispatcherClient
from app.entrypoints.api import create_app
from app.schemas import EnqueueJob, PrewarmNet, job_id_for
from app.usecases import declared_nets, prewarm
from models import NetState, Prewarm
from tasks import base
from tasks.registered import TASKS
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of

API_KEY = "prewarm-doors-key-0123"
AUTH = {"X-API-Key": API_KEY}


@pytest.fixture
def pw(tmp_path, job_root, sqlite_factory, clock) -> World:
    nets = [net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120)]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, API_SECRET=API_KEY)
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


@pytest.fixture
def doors(tmp_path, job_root, sqlite_factory, clock) -> World:
    nets = [net_decl(tmp_path, "net-a", "ecs")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, API_SECRET=API_KEY)
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


def test_the_prewarm_task_holds_the_net_and_sends_the_warm_up(pw):
    answer = TASKS[names.PREWARM].run(payload={"caller_key": "p1", "net": "net-a", "within_s": 120})
    assert answer["created"] is True and answer["status"] == "warming"
    assert pw.outbox.sent[-1] == (names.WARM_UP, {"net_name": "net-a"})
    assert (
        TASKS[names.PREWARM].run(payload={"caller_key": "p1", "net": "net-a", "within_s": 120})[
            "created"
        ]
        is False
    )


def test_the_prewarm_task_refuses_bad_payloads_and_records_them(pw):
    refused = TASKS[names.PREWARM].run(payload={"caller_key": "p1", "net": "net-a"})
    assert refused["reason_code"] == "rejected" and "within_s" in refused["refused"]
    conflict_first = {"caller_key": "p2", "net": "net-a", "within_s": 60}
    TASKS[names.PREWARM].run(payload=conflict_first)
    conflict = TASKS[names.PREWARM].run(payload={**conflict_first, "within_s": 61})
    assert conflict["reason_code"] == "caller_key_conflict"
    with pw.rt.sessions() as session:
        outcomes = session.scalars(
            select(Prewarm.outcome).where(Prewarm.refused).order_by(Prewarm.id)
        ).all()
    assert outcomes == ["rejected", "caller_key_conflict"]


def test_a_refused_prewarm_key_over_200_characters_is_recorded_as_its_own_not_its_prefixs(pw):
    """A key cut to 200 characters may be another prewarm's: its lookup must answer 410 for
    the key sent and leave the other prewarm's alone."""
    taken = "p" * 200
    TASKS[names.PREWARM].run(payload={"caller_key": taken, "net": "net-a", "within_s": 60})
    sent = taken + "-again"
    refused = TASKS[names.PREWARM].run(payload={"caller_key": sent, "net": "net-a", "within_s": 60})
    assert refused["reason_code"] == "rejected"
    with pw.rt.sessions() as session:
        keys = session.scalars(select(Prewarm.caller_key).where(Prewarm.refused)).all()
    assert len(keys) == 1 and keys[0] != taken and len(keys[0]) <= 200
    with TestClient(create_app(pw.rt)) as client:
        assert client.get(f"/prewarms/{sent}").status_code == 410
        assert client.get(f"/prewarms/{taken}").json()["status"] == "warming"


@pytest.mark.parametrize("key", ["proj/../p1", "./p1", "a//b"])
def test_a_prewarm_key_an_http_client_would_rewrite_is_refused_at_both_doors(pw, key):
    """GET /prewarms/proj/../p1 would reach the prewarm p1: such keys are refused, saying
    why, as a caller_key or as a job's prewarm_key."""
    body = {"caller_key": key, "net": "net-a", "within_s": 60}
    refused = TASKS[names.PREWARM].run(payload=body)
    assert refused["reason_code"] == "rejected" and "segment" in refused["refused"], refused
    job = {"caller_key": "j-1", "definition": "tiny-job", "net": "net-a", "prewarm_key": key}
    with TestClient(create_app(pw.rt)) as client:
        answer = client.post("/prewarms", json=body, headers=AUTH)
        assert answer.status_code == 422 and "segment" in answer.text, answer.text
        answer = client.post("/jobs", json=job, headers=AUTH)
        assert answer.status_code == 422 and "prewarm_key" in answer.text, answer.text
    assert pw.outbox.sent == []


def test_the_warm_up_task_polls_until_ready_and_the_cancel_task_ends_the_hold(pw):
    from celery.exceptions import Retry

    TASKS[names.PREWARM].run(payload={"caller_key": "p1", "net": "net-a", "within_s": 120})
    with pytest.raises(Retry):
        TASKS[names.WARM_UP].run(net_name="net-a")  # the driver was asked: poll again
    assert TASKS[names.WARM_UP].run(net_name="net-a") == "ready"
    assert pw.net("net-a").state == NetState.READY
    assert TASKS[names.CANCEL_PREWARM].run(payload={"caller_key": "p1"})["status"] == "cancelled"
    assert "no prewarm" in TASKS[names.CANCEL_PREWARM].run(payload={"caller_key": "x"})["rejected"]


def test_the_http_routes(pw):
    body = {"caller_key": "flip/p1", "net": "net-a", "within_s": 120}
    with TestClient(create_app(pw.rt)) as client:
        assert client.post("/prewarms", json=body).status_code == 401
        created = client.post("/prewarms", json=body, headers=AUTH)
        assert created.status_code == 201, created.text
        assert created.json()["status"] == "warming" and created.json()["notified"] is True
        assert client.post("/prewarms", json=body, headers=AUTH).status_code == 200
        conflict = client.post("/prewarms", json={**body, "within_s": 1}, headers=AUTH)
        assert conflict.status_code == 409
        assert conflict.json()["reason_code"] == "caller_key_conflict"
        bad = client.post("/prewarms", json={**body, "caller_key": "x", "net": "z"}, headers=AUTH)
        assert bad.status_code == 400 and "unknown net" in bad.json()["detail"]
        assert client.get("/prewarms/x").status_code == 410
        assert client.get("/prewarms/nope").status_code == 404
        assert client.get("/prewarms/flip/p1").json()["net"] == "net-a"
        status = client.get("/fl/status").json()
        assert status["nets"][0]["prewarm"]["caller_key"] == "flip/p1"

        cancel = client.post("/prewarms/cancel", json={"caller_key": "flip/p1"}, headers=AUTH)
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
        missing = client.post("/prewarms/cancel", json={"caller_key": "nope"}, headers=AUTH)
        assert missing.status_code == 404

        with pw.rt.sessions.begin() as session:
            declared_nets.mark_misconfigured(session, "net-a", "wrong kit", pw.clock())
        other = {**body, "caller_key": "p2"}
        refused = client.post("/prewarms", json=other, headers=AUTH)
        assert refused.status_code == 409 and refused.json()["reason_code"] == "net_misconfigured"
        assert "MISCONFIGURED: wrong kit" in refused.json()["detail"]
        assert client.get("/prewarms/p2").json()["reason_code"] == "net_misconfigured"


def test_the_client_sends_both_tasks_by_name_on_the_requests_queue():
    sent = []

    class App:
        conf = type("Conf", (), {"update": lambda self, **kw: None})()

        def send_task(self, name, kwargs, queue, headers=None):
            assert headers is None  # no current span: no trace context sent
            sent.append((name, kwargs, queue))

    client = DispatcherClient("memory://", app=App())
    client.prewarm(PrewarmNet(caller_key="p1", required_sites=["site-1"], within_s=90))
    client.cancel_prewarm("p1")
    assert sent == [
        (
            names.PREWARM,
            {"payload": {"caller_key": "p1", "net": None, "required_sites": ["site-1"],
                         "within_s": 90.0}},
            names.QUEUE,
        ),
        (names.CANCEL_PREWARM, {"payload": {"caller_key": "p1"}}, names.QUEUE),
    ]  # fmt: skip


def test_the_task_answer_is_the_use_cases_view(pw):
    answer = TASKS[names.PREWARM].run(payload={"caller_key": "p1", "net": "net-a", "within_s": 30})
    with pw.rt.sessions() as session:
        shown = prewarm.get_prewarm(session, "p1", pw.clock()).model_dump(mode="json")
    assert answer == {**shown, "created": True}


# --- a job's prewarm_key -------------------------------------------------------------------


def test_the_enqueue_task_and_post_jobs_store_the_prewarm_key(doors: World):
    body = {"caller_key": "t-1", "definition": "tiny-job", "net": "net-a", "prewarm_key": "pw/1"}
    answer = TASKS[names.ENQUEUE_JOB].run(payload=body)
    assert answer["created"] is True
    assert doors.job(job_id_for("t-1")).prewarm_key == "pw/1"
    conflict = TASKS[names.ENQUEUE_JOB].run(payload={**body, "prewarm_key": "pw/2"})
    assert conflict["reason_code"] == "caller_key_conflict"
    with TestClient(create_app(doors.rt)) as client:
        created = client.post("/jobs", json={**body, "caller_key": "h-1"}, headers=AUTH)
        assert created.status_code == 201, created.text
        again = client.post("/jobs", json={**body, "caller_key": "h-1"}, headers=AUTH)
        assert again.status_code == 200
        other = {**body, "caller_key": "h-1", "prewarm_key": "pw-3"}
        assert client.post("/jobs", json=other, headers=AUTH).status_code == 409
        shown = client.get(f"/jobs/{job_id_for('h-1')}").json()
        assert shown["prewarm_key"] == "pw/1"


def test_the_client_sends_the_prewarm_key_when_set():
    client = DispatcherClient("memory://")
    request = EnqueueJob(caller_key="k-1", definition="fedavg", prewarm_key="pw-1")
    client.enqueue_job(request)
    with client.app.connection_for_read() as conn:
        queue = conn.SimpleQueue(names.QUEUE)
        message = queue.get(timeout=1)
        message.ack()
        queue.close()
    client.close()
    assert message.payload[1]["payload"]["prewarm_key"] == "pw-1"


def test_migration_0014_adds_and_drops_the_column(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"

    def columns() -> set[str]:
        engine = create_engine(url)
        try:
            return {c["name"] for c in inspect(engine).get_columns("jobs")}
        finally:
            engine.dispose()

    migrate.upgrade(url, "0013")
    assert "prewarm_key" not in columns()
    migrate.upgrade(url, "0014")
    assert "prewarm_key" in columns()
    migrate.downgrade(url, "0013")
    assert "prewarm_key" not in columns()
