"""The status API on a PostgreSQL database built by migrations.

Drivers and admin clients are fakes here on purpose: what is under test is the API's own
behaviour (per-net isolation, deadlines, auth, validation, after-commit sends, metrics from
SQL); the real admin client and drivers are pinned against real servers elsewhere.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from app.adapters.backend import ServerState
from app.adapters.drivers import Observation
from app.celery_app import CeleryOutbox
from app.entrypoints.api import create_app, iter_routes
from app.errors import AdminMisconfigured
from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob, job_id_for
from app.settings import Settings
from app.usecases import claims, declared_nets, enqueue, records
from models import Job, JobEvent, JobState, Net, NetState, ScaleEvent
from tests.fixtures.db import net_decl

pytestmark = pytest.mark.integration

KEY = "api-test-key-3e9d"
AUTH = {"X-API-Key": KEY}
REDIS_URL = "redis://127.0.0.1:6379/15"


@dataclass
class Fake:
    """What one net's fakes do when probed."""

    observation: Observation = field(default_factory=lambda: Observation(0, 0, 0))
    state: ServerState = ServerState.STARTED
    sites: tuple[str, ...] = ("site-1", "site-2")
    driver_error: Exception | None = None
    admin_error: Exception | None = None
    hang: threading.Event | None = None  # probes block until it is set


class FakeDriver:
    kind = "fake"

    def __init__(self, fake: Fake) -> None:
        self.fake = fake

    def scale(self, replicas: int) -> None:
        raise AssertionError("the status API never scales")

    def observe(self) -> Observation:
        if self.fake.hang is not None:
            self.fake.hang.wait(30)
        if self.fake.driver_error is not None:
            raise self.fake.driver_error
        return self.fake.observation


class FakeAdmin:
    def __init__(self, fake: Fake) -> None:
        self.fake = fake

    def server_state(self) -> ServerState:
        if self.fake.hang is not None:
            self.fake.hang.wait(30)
        if self.fake.admin_error is not None:
            raise self.fake.admin_error
        return self.fake.state

    def connected_sites(self) -> list[str]:
        return list(self.fake.sites)

    def close(self) -> None:
        pass


class Recorder(RecordingOutbox):
    """The API's outbox: records what was sent and what the database said at send time."""

    def __init__(self, sessions) -> None:
        super().__init__()
        self.sessions = sessions
        self.seen_state: list[str | None] = []

    def send(self, task: str, **kwargs) -> bool:
        job_id = kwargs.get("job_id")
        with self.sessions() as session:  # another connection: sees only committed rows
            if job_id:
                self.seen_state.append(session.get(Job, uuid.UUID(job_id)).state.value)
            else:
                queued = session.scalar(
                    select(func.count()).select_from(Job).where(Job.state == JobState.QUEUED)
                )
                self.seen_state.append(f"queued={queued}")
        return super().send(task, **kwargs)


class Harness:
    def __init__(self, settings, pg_engine, pg_factory, clock, fakes: dict[str, Fake]):
        self.fakes = fakes
        self.admins_built: list[str] = []
        self.clock = clock
        self.sessions = pg_factory
        self.send = Recorder(pg_factory)
        self.runtime = Runtime(
            settings=settings,
            engine=pg_engine,
            sessions=pg_factory,
            clock=clock,
            driver_factory=lambda net, s: FakeDriver(self.fakes[net.name]),
            admin_factory=self._admin,
            outbox=self.send,
        )

    def _admin(self, net, settings):
        self.admins_built.append(net.name)
        return FakeAdmin(self.fakes[net.name])

    def client(self, **kw) -> TestClient:
        app = create_app(self.runtime, **kw)
        return TestClient(app)

    def sync(self) -> None:
        with self.sessions.begin() as session:
            declared_nets.sync_nets(session, self.runtime.settings, self.clock())

    def count(self, model) -> int:
        with self.sessions() as session:
            return session.scalar(select(func.count()).select_from(model))


def make_settings(tmp_path, job_root, nets, **env) -> Settings:
    base = {"API_SECRET": KEY, "BROKER_URL": REDIS_URL}
    return Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps(nets),
        **(base | env),
    )


@pytest.fixture
def three_nets(tmp_path, job_root, pg_engine, pg_factory, clock):
    """net-a scales to zero and is STOPPED; net-b scales too and is BUSY with a job;
    net-c is always on (static) and its admin kit is rejected."""
    nets = [
        net_decl(tmp_path, "net-a", "ecs", per_job_fl_server=True),
        net_decl(tmp_path, "net-b", "ecs", per_job_fl_server=True),
        net_decl(tmp_path, "net-c", "static"),
    ]
    fakes = {
        "net-a": Fake(observation=Observation(0, 0, 0), admin_error=AssertionError("probed")),
        "net-b": Fake(observation=Observation(1, 1, 0), sites=("site-2", "site-1")),
        "net-c": Fake(
            observation=Observation(1, 1, 0),
            admin_error=AdminMisconfigured("login rejected: wrong admin kit for this server"),
        ),
    }
    h = Harness(make_settings(tmp_path, job_root, nets), pg_engine, pg_factory, clock, fakes)
    h.sync()
    settings = h.runtime.settings
    with h.sessions.begin() as session:
        job_id = enqueue.enqueue_job(
            session,
            settings,
            EnqueueJob(caller_key="run-1", definition="tiny-job", net="net-b"),
            clock(),
        ).job_id
        clock.advance(2)
        assert claims.claim_next_job(session, settings, clock()).net_name == "net-b"
        session.add(
            ScaleEvent(
                net_name="net-b",
                action="scale_up",
                replicas=1,
                reason="job",
                outcome="ok",
                at=clock(),
            )
        )
        clock.advance(60)
        records.get_net(session, "net-b").transition(NetState.READY, clock(), "ready")
        records.get_job(session, job_id).start_dispatch(clock())
        clock.advance(3)
        records.mark_dispatched(session, job_id, "nvf-123", 1000.0, clock())
        records.get_net(session, "net-c").transition(NetState.READY, clock(), "always on")
    h.job_id = job_id
    return h


def test_status_with_one_net_stopped_one_running_and_one_broken(three_nets):
    h = three_nets
    with h.client() as client:
        response = client.get("/fl/status")
    assert response.status_code == 200
    body = response.json()
    print(json.dumps(body, indent=2))  # shown with -s; the report quotes it
    nets = {n["name"]: n for n in body["nets"]}
    assert list(nets) == ["net-a", "net-b", "net-c"]

    stopped = nets["net-a"]
    assert stopped["state"] == "STOPPED" and stopped["always_on"] is False
    assert stopped["driver"] == {"desired": 0, "running": 0, "pending": 0, "failure": None}
    assert stopped["server_state"] == "not_probed" and stopped["connected_sites"] is None
    assert stopped["error"] is None and stopped["active_job"] is None
    assert "net-a" not in h.admins_built  # a scaled-to-zero server is never contacted

    running = nets["net-b"]
    assert running["state"] == "BUSY" and running["server_state"] == "started"
    assert running["connected_sites"] == ["site-1", "site-2"]
    assert running["driver"]["running"] == 1
    assert running["active_job"]["id"] == str(h.job_id)
    assert running["active_job"]["state"] == "RUNNING"
    assert running["active_job"]["nvflare_job_id"] == "nvf-123"
    assert running["last_scale_event"]["action"] == "scale_up"
    assert running["error"] is None

    broken = nets["net-c"]
    assert broken["always_on"] is True and broken["state"] == "READY"
    assert broken["server_state"] == "unknown"
    assert (
        broken["error"] == "admin: misconfigured: login rejected: wrong admin kit for this server"
    )
    assert broken["driver"]["running"] == 1


def test_a_driver_error_is_that_nets_error_only(three_nets):
    h = three_nets
    h.fakes["net-a"].driver_error = ConnectionError("ECS endpoint unreachable")
    with h.client() as client:
        body = client.get("/fl/status").json()
    nets = {n["name"]: n for n in body["nets"]}
    assert nets["net-a"]["error"] == "driver: ConnectionError: ECS endpoint unreachable"
    assert nets["net-a"]["driver"] is None
    assert nets["net-b"]["error"] is None


def test_hung_probes_do_not_stall_the_response(tmp_path, job_root, pg_engine, pg_factory, clock):
    names = [f"net-{i}" for i in range(8)]
    nets = [net_decl(tmp_path, n, "static") for n in names]  # always on: admin is probed
    release = threading.Event()
    fakes = {n: Fake(hang=release) for n in names}
    fakes["net-0"] = Fake(observation=Observation(1, 1, 0))  # one healthy net among them
    h = Harness(make_settings(tmp_path, job_root, nets), pg_engine, pg_factory, clock, fakes)
    h.sync()
    try:
        with h.client(probe_timeout_s=0.5) as client:
            for attempt in ("first", "second"):
                started = time.monotonic()
                response = client.get("/fl/status")
                elapsed = time.monotonic() - started
                assert response.status_code == 200
                # Eight hung nets cost one deadline, not eight.
                assert elapsed < 2.0, f"{attempt} request took {elapsed:.2f}s"
                nets = {n["name"]: n for n in response.json()["nets"]}
                assert nets["net-0"]["server_state"] == "started"
                assert nets["net-0"]["error"] is None
                for name in names[1:]:
                    assert nets[name]["server_state"] == "unknown"
                    assert "probe timed out" in nets[name]["error"]
            # The second request did not pile new threads onto the hung probes.
            assert "previous probe still running" in nets["net-1"]["error"]
    finally:
        release.set()


def test_mutating_routes_need_the_key_and_write_nothing_without_it(three_nets):
    h = three_nets
    jobs_before = h.count(Job)
    body = {"caller_key": "k-auth", "definition": "tiny-job", "net": "net-a"}
    with h.client() as client:
        for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": ""}):
            response = client.post("/jobs", json=body, headers=headers)
            assert response.status_code == 401, headers
            assert response.json()["detail"] == "missing or wrong X-API-Key header"
            assert client.post(f"/jobs/{h.job_id}/abort", headers=headers).status_code == 401
        # Even malformed JSON gets a 401 first: nothing about the payload rules leaks.
        assert client.post("/jobs", content=b"{nope", headers={"X-API-Key": "x"}).status_code == 401
    assert h.count(Job) == jobs_before
    with h.sessions() as session:
        assert session.get(Job, h.job_id).state == JobState.RUNNING
    assert h.send.sent == []


def test_mutating_routes_are_disabled_without_api_secret(
    tmp_path, job_root, pg_engine, pg_factory, clock
):
    nets = [net_decl(tmp_path, "net-a")]
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=job_root, NETS=json.dumps(nets)
    )
    h = Harness(settings, pg_engine, pg_factory, clock, {"net-a": Fake()})
    with h.client() as client:
        response = client.post("/jobs", json={"caller_key": "k", "definition": "tiny-job"})
        assert response.status_code == 403
        assert "API_SECRET is unset" in response.json()["detail"]
        assert client.post("/jobs", json={}, headers={"X-API-Key": ""}).status_code == 403
        assert client.get("/jobs").status_code == 200  # reads stay open
    assert h.count(Job) == 0


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"caller_key": "bad key!", "definition": "tiny-job"}, 422, "body.caller_key"),
        ({"caller_key": "k", "definition": "tiny-job", "colour": "red"}, 422, "body.colour"),
        ({"caller_key": "k", "definition": "tiny-job", "priority": 5000}, 422, "body.priority"),
        ({"definition": "tiny-job"}, 422, "body.caller_key: Field required"),
        ([1, 2], 422, "body"),
        ({"caller_key": "k", "definition": "../x", "net": "net-a"}, 400, "without '..'"),
        ({"caller_key": "k", "definition": "tiny-job", "net": "net-z"}, 400, "unknown net 'net-z'"),
        ({"caller_key": "k", "definition": "missing", "net": "net-a"}, 400, "not a folder"),
    ],
)
def test_bad_enqueue_input_is_a_4xx_with_a_message_and_writes_nothing(
    three_nets, body, status, needle
):
    h = three_nets
    jobs, events = h.count(Job), h.count(JobEvent)
    with h.client() as client:
        response = client.post("/jobs", json=body, headers=AUTH)
    assert response.status_code == status
    assert needle in response.json()["detail"]
    assert (h.count(Job), h.count(JobEvent)) == (jobs, events)
    assert h.send.sent == []


@pytest.mark.parametrize(
    ("field", "raw_value", "needle"),
    [
        ("priority", "1" + "0" * 4400, "body: Value error, priority is a number of 4401 digits"),
        ("metadata", '{"n": ' + "9" * 4400 + "}", "metadata has a value that is a number"),
        ("metadata", '{"m": ' + "[" * 1000 + "]" * 1000 + "}", "nested deeper than 64 levels"),
        ("metadata", "{" + '"a": {' * 299 + "}" * 300, "metadata nests deeper than 32 levels"),
    ],
)
def test_valid_json_python_cannot_read_is_a_422_naming_the_field(
    three_nets, field, raw_value, needle
):
    """A few KB of valid JSON that Python's decoder or the payload's digest cannot handle
    (a number past the digit limit, deep nesting) is the caller's mistake, not a 500."""
    h = three_nets
    jobs, events = h.count(Job), h.count(JobEvent)
    body = (
        '{"caller_key": "k-unreadable", "definition": "tiny-job", "net": "net-a", '
        f'"{field}": {raw_value}}}'
    )
    assert len(body) < 5000
    with h.client() as client:
        response = client.post("/jobs", content=body.encode(), headers=AUTH)
    assert response.status_code == 422, response.text
    assert needle in response.json()["detail"]
    assert (h.count(Job), h.count(JobEvent)) == (jobs, events)
    assert h.send.sent == []


def test_text_postgresql_cannot_hold_is_a_4xx_without_a_traceback(three_nets, caplog):
    """A NUL in a lookup key, a caller_key filter, an abort reason or a prewarm key (or a
    lone surrogate, which only a JSON body can carry) is the caller's mistake: once a 503
    "database unavailable" with an ERROR traceback per request, which anyone could use to
    fill the log."""
    h = three_nets
    with h.client() as client:
        answers = {
            "by key": client.get("/jobs/by-key/a%00b"),
            "filter": client.get("/jobs?caller_key=a%00b"),
            "prewarm": client.get("/prewarms/a%00b"),
        }
        for bad in ("a\x00b", "a\ud800b"):
            # json.dumps escapes both (\\u0000, \\ud800): valid JSON, as a caller sends it.
            answers[f"abort {bad!r}"] = client.post(
                f"/jobs/{h.job_id}/abort", content=json.dumps({"reason": bad}), headers=AUTH
            )
            answers[f"cancel {bad!r}"] = client.post(
                "/prewarms/cancel", content=json.dumps({"caller_key": bad}), headers=AUTH
            )
    for what, response in answers.items():
        assert response.status_code in (400, 422), (what, response.text)
        assert "database" not in response.json()["detail"], what
        if what.startswith(("by key", "filter", "prewarm")):
            assert "NUL" in response.json()["detail"], what
        if what.startswith("abort"):
            assert "body.reason" in response.json()["detail"], what
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []
    with h.sessions() as session:
        assert session.get(Job, h.job_id).state == JobState.RUNNING
    assert h.send.sent == []


def test_other_bad_requests(three_nets):
    h = three_nets
    with h.client() as client:
        malformed = client.post("/jobs", content=b"{nope", headers=AUTH)
        assert malformed.status_code == 422 and "not valid JSON" in malformed.json()["detail"]
        empty = client.post("/jobs", content=b"", headers=AUTH)
        assert empty.status_code == 422 and "a JSON body is required" in empty.json()["detail"]
        bad_state = client.get("/jobs", params={"state": "SLEEPING"})
        assert bad_state.status_code == 400
        assert "unknown job state 'SLEEPING'" in bad_state.json()["detail"]
        assert client.get("/jobs", params={"limit": 0}).status_code == 422
        assert client.get("/jobs/not-a-uuid").status_code == 422
        missing = uuid.uuid4()
        assert client.get(f"/jobs/{missing}").json() == {"detail": f"job {missing} not found"}
        assert client.get(f"/jobs/{missing}").status_code == 404
        assert client.post(f"/jobs/{missing}/abort", headers=AUTH).status_code == 404
        with h.sessions.begin() as session:
            enqueue.record_rejection(session, "flip-bad", "unknown net 'x'", h.clock(), 3600)
        rejected = client.get(f"/jobs/{job_id_for('flip-bad')}")
        assert rejected.status_code == 410
        assert (
            "rejected" in rejected.json()["detail"]
            and "unknown net 'x'" in rejected.json()["detail"]
        )
        long_reason = {"reason": "x" * 501}
        too_long = client.post(f"/jobs/{h.job_id}/abort", json=long_reason, headers=AUTH)
        assert too_long.status_code == 422 and "body.reason" in too_long.json()["detail"]
    with h.sessions() as session:
        assert session.get(Job, h.job_id).state == JobState.RUNNING
    assert h.send.sent == []


def test_enqueue_is_idempotent_and_sends_assign_after_commit(three_nets):
    h = three_nets
    body = {"caller_key": "flip-42", "definition": "tiny-job", "required_sites": ["site-1"]}
    with h.client() as client:
        first = client.post("/jobs", json=body, headers=AUTH)
        second = client.post("/jobs", json=body, headers=AUTH)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["job_id"] == second.json()["job_id"]
    assert first.json()["created"] is True and second.json()["created"] is False
    assert first.headers["location"] == f"/jobs/{first.json()['job_id']}"
    with h.sessions() as session:
        assert session.scalar(select(func.count()).where(Job.caller_key == "flip-42")) == 1
    assert [name for name, _ in h.send.sent] == ["fl_dispatcher.assign_next_job"] * 2
    # The task went out after commit: another connection already saw the queued job.
    assert h.send.seen_state == ["queued=1", "queued=1"]


def test_enqueue_survives_a_broker_failure(three_nets):
    h = three_nets
    # A real Celery outbox whose broker refuses connections (port 1), as in production.
    dead = Celery("api-test-dead-broker", broker="redis://127.0.0.1:1/0")
    dead.conf.broker_connection_timeout = 1
    h.runtime.outbox = CeleryOutbox(dead)
    try:
        with h.client() as client:
            response = client.post(
                "/jobs",
                json={"caller_key": "k-b", "definition": "tiny-job", "net": "net-a"},
                headers=AUTH,
            )
    finally:
        dead.close()
    assert response.status_code == 201
    assert response.json()["notified"] is False  # the reconciler will find the row
    assert h.count(Job) == 2


def test_job_detail_with_history(three_nets):
    h = three_nets
    with h.client() as client:
        job = client.get(f"/jobs/{h.job_id}").json()
        listed = client.get("/jobs", params={"state": "running"}).json()["jobs"]
    assert job["state"] == "RUNNING" and job["net"] == "net-b"
    assert job["nvflare_job_id"] == "nvf-123"
    assert [(e["from_state"], e["to_state"]) for e in job["history"]] == [
        (None, "QUEUED"),
        ("QUEUED", "ASSIGNED"),
        ("ASSIGNED", "DISPATCHING"),
        ("DISPATCHING", "RUNNING"),
    ]
    assert [j["id"] for j in listed] == [str(h.job_id)]


def test_abort_a_queued_job_is_immediate(three_nets):
    h = three_nets
    with h.sessions.begin() as session:
        queued = enqueue.enqueue_job(
            session,
            h.runtime.settings,
            EnqueueJob(caller_key="q1", definition="tiny-job", net="net-a"),
            h.clock(),
        ).job_id
    with h.client() as client:
        response = client.post(
            f"/jobs/{queued}/abort", json={"reason": "changed my mind"}, headers=AUTH
        )
        again = client.post(f"/jobs/{queued}/abort", headers=AUTH)
        job = client.get(f"/jobs/{queued}").json()
    assert response.status_code == 200
    assert response.json() == {
        "job_id": str(queued),
        "state": "ABORTED",
        "needs_server_abort": False,
        "notified": True,
    }
    assert again.json()["state"] == "ABORTED"  # a repeat is not an error
    assert job["history"][-1] == {
        "from_state": "QUEUED",
        "to_state": "ABORTED",
        "at": job["history"][-1]["at"],
        "reason": "changed my mind",
        "reason_code": "aborted",
        "attempt": 1,
    }
    # Nothing to tell a server; each abort only nudges the assigner, after its commit.
    assert h.send.sent == [("fl_dispatcher.assign_next_job", {})] * 2
    assert h.send.seen_state == ["queued=0", "queued=0"]


def test_abort_a_running_job_sends_the_abort_task_after_commit(three_nets):
    h = three_nets
    with h.client() as client:
        response = client.post(f"/jobs/{h.job_id}/abort", headers=AUTH)
    assert response.json()["state"] == "ABORTING"
    assert response.json()["needs_server_abort"] is True and response.json()["notified"] is True
    # Straight to the worker's server-side abort: the SQL part is done and not run again.
    assert h.send.sent == [("fl_dispatcher.abort_on_server", {"job_id": str(h.job_id)})]
    assert h.send.seen_state == ["ABORTING"]
    with h.sessions() as session:
        aborting = [
            e.to_state
            for e in session.scalars(select(JobEvent).where(JobEvent.job_id == h.job_id))
            if e.to_state == JobState.ABORTING
        ]
    assert aborting == [JobState.ABORTING]


def test_readyz_names_the_failed_dependency(
    three_nets, tmp_path, job_root, pg_engine, pg_factory, clock
):
    h = three_nets
    with h.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}

    nets = [net_decl(tmp_path, "net-a")]
    down = Harness(
        make_settings(tmp_path, job_root, nets, BROKER_URL="redis://127.0.0.1:1/0"),
        pg_engine,
        pg_factory,
        clock,
        {"net-a": Fake()},
    )
    with down.client(ready_timeout_s=2.0) as client:
        started = time.monotonic()
        response = client.get("/readyz")
    assert time.monotonic() - started < 5
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]
    assert response.json()["checks"]["database"] == "ok"


def metric_value(text: str, sample_name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError((sample_name, labels))


def test_metrics_match_the_database(three_nets):
    h = three_nets
    settings = h.runtime.settings
    clock = h.clock
    with h.sessions.begin() as session:
        # net-a: a cold start of 90 s, up for 200 s in total, then stopped.
        net_a = records.get_net(session, "net-a")
        net_a.transition(NetState.STARTING, clock(), "job")
        clock.advance(90)
        net_a.transition(NetState.READY, clock(), "ready")
        clock.advance(110)
        net_a.transition(NetState.STOPPED, clock(), "idle")
        session.add(
            ScaleEvent(
                net_name="net-a",
                action="scale_down",
                replicas=0,
                reason="idle",
                outcome="ok",
                at=clock(),
            )
        )
        session.add(
            ScaleEvent(
                net_name="net-a",
                action="scale_up",
                replicas=1,
                reason="job",
                outcome="error: throttled",
                at=clock(),
            )
        )
        # A job requeued once, with two transient retries counted.
        requeued = enqueue.enqueue_job(
            session,
            settings,
            EnqueueJob(caller_key="rq", definition="tiny-job", net="net-a"),
            clock(),
        ).job_id
        clock.advance(30)
        job = records.get_job(session, requeued)
        job.assign("net-a", clock())
        session.flush()
        records.requeue_job(session, requeued, "server lost", clock())
        job.retries = 2
    with h.client() as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text

    with h.sessions() as session:
        by_state = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
        net_states = dict(session.execute(select(Net.name, Net.state)).all())
        retries = session.scalar(select(func.sum(Job.retries)))
    for state in JobState:
        assert metric_value(text, "fl_dispatcher_jobs", state=state.value) == by_state.get(state, 0)
    for net, state in net_states.items():
        assert metric_value(text, "fl_dispatcher_nets", net=net, state=state.value) == 1
        others = [s for s in NetState if s != state]
        assert all(
            metric_value(text, "fl_dispatcher_nets", net=net, state=o.value) == 0 for o in others
        )
    assert metric_value(text, "fl_dispatcher_job_retries_total") == retries == 2
    assert metric_value(text, "fl_dispatcher_job_requeues_total") == 1
    # Cold starts: net-b took 60 s in the fixture, net-a 90 s here.
    assert metric_value(text, "fl_dispatcher_cold_start_seconds_count") == 2
    assert metric_value(text, "fl_dispatcher_cold_start_seconds_sum") == 150
    assert metric_value(text, "fl_dispatcher_cold_start_seconds_bucket", le="60.0") == 1
    assert metric_value(text, "fl_dispatcher_cold_start_seconds_bucket", le="90.0") == 2
    # Dispatch latency: net-b's job went ASSIGNED -> RUNNING in 60 + 3 s.
    assert metric_value(text, "fl_dispatcher_dispatch_latency_seconds_count") == 1
    assert metric_value(text, "fl_dispatcher_dispatch_latency_seconds_sum") == 63
    # Queue wait: 2 s for run-1, 30 s for the requeued job (its latest assignment).
    assert metric_value(text, "fl_dispatcher_queue_wait_seconds_count") == 2
    assert metric_value(text, "fl_dispatcher_queue_wait_seconds_sum") == 32
    assert metric_value(text, "fl_dispatcher_queue_wait_seconds_bucket", le="5.0") == 1
    assert (
        metric_value(
            text,
            "fl_dispatcher_scale_events_total",
            net="net-a",
            action="scale_up",
            outcome="error",
        )
        == 1
    )
    assert (
        metric_value(
            text, "fl_dispatcher_scale_events_total", net="net-b", action="scale_up", outcome="ok"
        )
        == 1
    )
    # Uptime out of STOPPED: net-a 200 s and stopped; net-b up since its STARTING move
    # (63 s in the fixture + 230 s here) and still up; net-c READY since the fixture's end.
    assert metric_value(text, "fl_dispatcher_server_uptime_seconds_total", net="net-a") == 200
    assert metric_value(text, "fl_dispatcher_server_uptime_seconds_total", net="net-b") == 293
    assert metric_value(text, "fl_dispatcher_server_uptime_seconds_total", net="net-c") == 230
    # The requeued job was enqueued 30 s ago and is the only QUEUED one.
    assert metric_value(text, "fl_dispatcher_oldest_queued_job_age_seconds") == 30


def test_route_list(three_nets):
    routes = set(iter_routes(create_app(three_nets.runtime)))
    assert {
        ("GET", "/fl/status"),
        ("GET", "/jobs"),
        ("GET", "/jobs/{job_id}"),
        ("POST", "/jobs"),
        ("POST", "/jobs/{job_id}/abort"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/nets"),
    } <= routes


def test_database_down_is_a_503_not_a_crash(tmp_path, job_root, clock):
    from app.db import make_engine, session_factory

    engine = make_engine("postgresql+psycopg://fl:db-pw-31@127.0.0.1:1/nowhere")
    settings = make_settings(tmp_path, job_root, [net_decl(tmp_path, "net-a")])
    runtime = Runtime(settings=settings, engine=engine, sessions=session_factory(engine))
    with TestClient(create_app(runtime)) as client:
        for path in ("/fl/status", "/jobs", "/metrics"):
            response = client.get(path)
            assert response.status_code == 503, path
            assert "database unavailable" in response.json()["detail"]
        ready = client.get("/readyz").json()
        assert ready["failed"] == ["database"]
        assert "db-pw-31" not in json.dumps(ready)
        assert client.get("/healthz").status_code == 200
    engine.dispose()


# FastAPI's own routes (the documentation itself), not ours.
DOC_ROUTES = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def documented_schema(openapi: dict, method: str, path: str, status: int) -> dict:
    """The JSON schema /openapi.json declares for one answer, resolvable on its own."""
    answer = openapi["paths"][path][method.lower()]["responses"][str(status)]
    schema = answer["content"]["application/json"]["schema"]
    return {**schema, "components": openapi["components"]}


def test_openapi_declares_a_response_model_for_every_json_route(three_nets):
    import jsonschema

    h = three_nets
    with h.client() as client:
        openapi = client.get("/openapi.json").json()
        routes = sorted(r for r in iter_routes(client.app) if r[1] not in DOC_ROUTES)
        # Every route that answers JSON names a model with its fields, for its successes
        # and for each error it documents; /metrics says it is text.
        for method, path in routes:
            answers = openapi["paths"][path][method.lower()]["responses"]
            if path == "/metrics":
                assert list(answers["200"]["content"]) == ["text/plain"]
                continue
            if path == "/nets":  # the nets page is HTML; its errors are JSON as everywhere
                assert list(answers["200"]["content"]) == ["text/html"]
                answers = {code: a for code, a in answers.items() if code != "200"}
            else:
                successes = [code for code in answers if code.startswith("2")]
                assert successes, (method, path)
            for code, answer in answers.items():
                ref = answer["content"]["application/json"]["schema"].get("$ref", "")
                assert ref.startswith("#/components/schemas/"), (method, path, code)
                model = openapi["components"]["schemas"][ref.rsplit("/", 1)[1]]
                assert model["properties"], (method, path, code)

        # And each route's real answer matches what it declares (models forbid extra keys).
        job = str(h.job_id)
        body = {"caller_key": "doc-1", "definition": "tiny-job", "net": "net-a"}
        calls = [
            ("GET", "/healthz", client.get("/healthz")),
            ("GET", "/readyz", client.get("/readyz")),
            ("GET", "/fl/status", client.get("/fl/status")),
            ("GET", "/jobs", client.get("/jobs")),
            ("GET", "/jobs", client.get("/jobs", params={"state": "nope"})),
            ("GET", "/jobs/{job_id}", client.get(f"/jobs/{job}")),
            ("GET", "/jobs/{job_id}", client.get(f"/jobs/{uuid.uuid4()}")),
            ("POST", "/jobs", client.post("/jobs", json=body, headers=AUTH)),
            ("POST", "/jobs", client.post("/jobs", json=body, headers=AUTH)),
            ("POST", "/jobs", client.post("/jobs", json={"definition": "x"}, headers=AUTH)),
            ("POST", "/jobs", client.post("/jobs", json=body)),
            ("POST", "/jobs/{job_id}/abort", client.post(f"/jobs/{job}/abort", headers=AUTH)),
            ("GET", "/nets", client.get("/nets", params={"net": "nope"})),
            ("GET", "/nets", client.get("/nets", params={"page": 0})),
        ]
    statuses = [response.status_code for _, _, response in calls]
    assert statuses == [200, 200, 200, 200, 400, 200, 404, 201, 200, 422, 401, 200, 400, 422]
    for method, path, response in calls:
        schema = documented_schema(openapi, method, path, response.status_code)
        jsonschema.validate(response.json(), schema, cls=jsonschema.Draft202012Validator)


def test_the_documented_server_states_are_the_ones_the_view_reports():
    from typing import get_args

    from app.read_models import ServerStateView
    from app.usecases.views import NOT_PROBED, UNKNOWN

    assert set(get_args(ServerStateView)) == {s.value for s in ServerState} | {NOT_PROBED, UNKNOWN}
