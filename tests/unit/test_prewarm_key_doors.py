"""A job's prewarm_key through every door (the Celery task, POST /jobs, the client, the
simulator's caller), and the migration that stores it (README "Prewarm")."""

from __future__ import annotations

import random

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect

from app import migrate, names
from app.client import DispatcherClient
from app.entrypoints.api import create_app
from app.schemas import EnqueueJob, job_id_for
from app.sim import savings
from app.sim.faults import CLEAN
from app.sim.simulation import Simulation
from app.sim.trace import Trace, TraceJob
from app.sim.workload import JobSpec, Workload
from tasks import base
from tasks.registered import TASKS
from tests.fixtures.db import net_decl
from tests.sim.prewarms import with_prewarms
from tests.sim.worlds import random_world
from tests.unit.conftest import World, world_of
from tests.unit.test_simulate import COLD  # the 10 s cold start of the replay tests

API_KEY = "prewarm-key-doors-0123"
AUTH = {"X-API-Key": API_KEY}


@pytest.fixture
def doors(tmp_path, job_root, sqlite_factory, clock) -> World:
    nets = [net_decl(tmp_path, "net-a", "ecs")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock, API_SECRET=API_KEY)
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


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


def test_the_simulated_caller_names_each_hinted_jobs_prewarm():
    trace = Trace((TraceJob(100.0, 30.0, hint_lead_s=60.0), TraceJob(300.0, 30.0)))
    workload = savings.workload_for(trace)
    assert [j.prewarm_key for j in workload.jobs] == [workload.prewarms[0].key, None]
    world = savings.world_for(trace, ["net-1"], 0.0, COLD)
    sim = Simulation(world, workload, CLEAN, 0, fast_forward=True)
    _, stored = sim.run_then(
        lambda sim: sorted(sim.conn.execute("SELECT caller_key, prewarm_key FROM jobs"))
    )
    assert stored == [("job-000000", "job-000000"), ("job-000001", None)]


def test_the_sweep_names_the_hints_sent_for_its_jobs():
    named = 0
    for seed in range(60):
        world = random_world(random.Random(f"{seed}/workload"))
        workload = Workload(jobs=tuple(JobSpec(f"job-{i}", 40.0 * i + 20) for i in range(3)))
        _, drawn = with_prewarms(seed, world, workload)
        # The hints drawn up front, and those a burst sends when its moment comes.
        keys = {h.key for h in drawn.prewarms if not h.cancel} | {b.key for b in drawn.bursts}
        for spec in drawn.jobs:
            if spec.prewarm_key is not None:
                named += 1
                assert spec.prewarm_key in keys
    assert named > 0
