"""The unit tier's world: a runtime on an embedded database whose adapters are fakes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.errors import ServerUnavailable
from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import abort, declared_nets, dispatch, intake, records
from app.usecases import enqueue as enqueue_uc
from app.usecases.dispatch import Step
from models import Job, JobState, Net, ReasonCode
from tests.fakes import FakeAdmin, FakeDriver, FakeServer
from tests.fixtures.db import net_decl

UNIT_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder is the unit tier, so `pytest -m unit` selects exactly it.
    (This hook sees the whole session's items, hence the path check.)"""
    for item in items:
        if item.path.resolve().is_relative_to(UNIT_DIR):
            item.add_marker(pytest.mark.unit)


# How long a database test's teardown waits for the threads it started.
OUTLIVING_THREAD_WAIT_S = 10.0


@pytest.fixture(autouse=True)
def _no_thread_outlives_a_database_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A thread a test started that still runs after it would use the next test's database
    (one engine connects to the running test's file, tests/fixtures/db.py): as the hung
    probes of test_parallel_housekeeping did, until it waited for them. Such a test waits
    for its threads (app.parallel.Prober's outlive a round by design), and fails if one
    never ends. Set up before the test's database, so checked after its teardown."""
    if "sqlite_factory" not in request.fixturenames:
        yield
        return
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + OUTLIVING_THREAD_WAIT_S
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = sorted(t.name for t in set(threading.enumerate()) - before if t.is_alive())
    if left:
        pytest.fail(f"threads outlived the test and could reach the next test's database: {left}")


class World:
    """A runtime whose adapters are fakes the test can reach."""

    def __init__(self, settings: Settings, sessions, clock) -> None:
        self.drivers: dict[str, FakeDriver] = {}
        self.servers: dict[str, FakeServer] = {}
        self.admins_built: list[tuple[str, FakeAdmin]] = []
        self.outbox = RecordingOutbox()
        self.clock = clock
        self.rt = Runtime(
            settings=settings,
            engine=sessions.kw["bind"],
            sessions=sessions,
            clock=clock,
            driver_factory=lambda net, s: self.drivers.setdefault(net.name, FakeDriver()),
            admin_factory=self._admin,
            outbox=self.outbox,
        )
        with sessions.begin() as session:
            declared_nets.sync_nets(session, settings, clock())

    def _admin(self, net, settings):
        admin = FakeAdmin(self.server(net.name))
        self.admins_built.append((net.name, admin))
        return admin

    def server(self, name: str) -> FakeServer:
        if name not in self.servers:
            always_on = self.rt.settings.net(name).always_on
            driver = None if always_on else self.drivers.setdefault(name, FakeDriver())
            self.servers[name] = FakeServer(driver=driver)
        return self.servers[name]

    def driver(self, name: str) -> FakeDriver:
        return self.rt.driver(name)  # type: ignore[return-value]

    def admin(self, name: str) -> FakeAdmin:
        return self.rt.admin(name)  # type: ignore[return-value]

    def enqueue(self, key: str, **kw) -> str:
        self.clock.advance(1)  # distinct ages, so queue order is by age as in life
        with self.rt.sessions.begin() as session:
            return enqueue_uc.enqueue_job(
                session,
                self.rt.settings,
                EnqueueJob(caller_key=key, definition="tiny-job", **kw),
                self.clock(),
            ).job_id

    def add_stray(
        self, job_id, net: str, nvflare_job_id: str | None, token: str | None = None
    ) -> None:
        """Record a run the net's server may hold that no job counts (a stray run)."""
        with self.rt.sessions.begin() as session:
            records.add_stray_run(
                session,
                net_name=net,
                job_id=job_id,
                nvflare_job_id=nvflare_job_id,
                submit_token=token,
                reason="test",
                now=self.clock(),
            )

    def job(self, job_id) -> Job:
        with self.rt.sessions() as session:
            return session.get(Job, job_id)

    def net(self, name: str) -> Net:
        with self.rt.sessions() as session:
            return session.get(Net, name)

    def abort(self, job_id, reason: str = "user"):
        """flip-api's abort, then what the worker does with the abort_on_server it sends."""
        requested = intake.request_abort(self.rt, job_id, reason)
        if requested.decision.needs_server_abort:
            return abort.abort_on_server(self.rt, job_id)
        return requested.decision.state

    def run_pipeline(self, job_id) -> None:
        """What the chain does, step by step."""
        net, attempt = self.run_until_ready(job_id)
        assert dispatch.dispatch(self.rt, job_id, net, attempt).step == Step.DONE

    def run_to_completion(self, job_id) -> None:
        """The chain runs the job, and its run completes (the monitor's verdict)."""
        self.run_pipeline(job_id)
        self.complete(job_id)

    def complete(self, job_id) -> None:
        """The job's run completed (the monitor's verdict): COMPLETED, its net released."""
        with self.rt.sessions.begin() as session:
            records.finish_job(
                session,
                job_id,
                JobState.COMPLETED,
                "done",
                self.clock(),
                code=ReasonCode.RUN_COMPLETED,
            )

    def run_until_ready(self, job_id) -> tuple[str, int]:
        """The chain's steps before the submit: claimed, scaled up, seen ready. Its net and
        attempt."""
        assignment = next(a for a in dispatch.claim_and_start(self.rt) if a.job_id == job_id)
        net, attempt = assignment.net_name, assignment.attempt
        assert dispatch.scale_up(self.rt, job_id, net, attempt).step == Step.DONE
        assert dispatch.check_ready(self.rt, job_id, net, attempt).step == Step.DONE
        return net, attempt

    def submit_reply_lost(self, job_id, net: str, attempt: int, *, landed: bool = True) -> None:
        """The chain's submit step meets a connection lost: after the server created the run
        (`landed`: its reply lost) or before the request was sent. The step raises for its
        retry, as the task's countdown would run it again; the admin answers again after."""
        admin = self.admin(net)
        real = admin.submit

        def lost(*args, **kwargs):
            if landed:
                real(*args, **kwargs)  # the run is created on the server
            raise ServerUnavailable("submit: reply lost" if landed else "submit: reset")

        admin.submit = lost  # type: ignore[method-assign]
        try:
            with pytest.raises(ServerUnavailable):
                dispatch.dispatch(self.rt, job_id, net, attempt)
        finally:
            admin.submit = real  # type: ignore[method-assign]

    def stuck_in_dispatching(self, key: str, net: str = "net-a") -> str:
        """A job whose submit began (DISPATCHING) and was never heard of again: its id."""
        job_id = self.enqueue(key, net=net)
        self.run_until_ready(job_id)
        with self.rt.sessions.begin() as session:
            records.get_job(session, job_id).start_dispatch(self.clock())
        return job_id


def world_of(nets, tmp_path, job_root, sqlite_factory, clock, **extra) -> World:
    """A world with these net declarations (scale-to-zero by default, 30 s lost grace) and
    any further settings."""
    settings = Settings(
        **{
            "FL_DISPATCHER_DATA_DIR": tmp_path / "data",
            "JOB_ROOT": job_root,
            "NETS": json.dumps(nets),
            "PER_JOB_FL_SERVER": "true",
            "SERVER_LOST_GRACE_S": 30,
        }
        | extra
    )
    return World(settings, sqlite_factory, clock)


def one_net_world(tmp_path, job_root, sqlite_factory, clock, **extra) -> World:
    """A world of one scale-to-zero ECS net, `net-a`, and any further settings."""
    nets = [net_decl(tmp_path, "net-a", "ecs")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, **extra)


@pytest.fixture
def world(tmp_path, job_root, sqlite_factory, clock, monkeypatch):
    nets = [
        net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120),
        net_decl(tmp_path, "fixed", "static"),
    ]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


@pytest.fixture
def held_for_report(tmp_path, job_root, sqlite_factory, clock) -> World:
    """One scale-to-zero net whose server a completed run holds until flip-api reports its
    results (RELEASE_AFTER=reported)."""
    nets = [net_decl(tmp_path, "net-a", "ecs")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, RELEASE_AFTER="reported")


@pytest.fixture
def always_on(tmp_path, job_root, sqlite_factory, clock) -> World:
    """net-a (ECS) and a static net, with PER_JOB_FL_SERVER=false: both servers always on."""
    nets = [net_decl(tmp_path, "net-a", "ecs"), net_decl(tmp_path, "fixed")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, PER_JOB_FL_SERVER="false")


def dispatch_through_a_start_time_blip(world: World, job_id: str, net: str = "net-a") -> None:
    """Dispatch a job whose server is ready, while the server's start time cannot be read
    (one ServerUnavailable), then let the admin read it again."""
    admin = world.admin(net)
    real = admin.server_start_time

    def flaky() -> float:
        raise ServerUnavailable("blip")

    admin.server_start_time = flaky  # type: ignore[method-assign]
    dispatch.dispatch(world.rt, job_id, net, 0)
    admin.server_start_time = real  # type: ignore[method-assign]


@pytest.fixture
def sited(tmp_path, job_root, sqlite_factory, clock) -> World:
    """net-a declares its sites (site-1..3); net-b declares none."""
    nets = [
        net_decl(
            tmp_path, "net-a", "ecs", sites=["site-1", "site-2", "site-3"], ready_timeout_s=120
        ),
        net_decl(tmp_path, "net-b", "ecs", ready_timeout_s=120),
    ]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


@pytest.fixture
def tasks_world(world: World) -> Iterator[World]:
    """`world`, as the runtime the Celery tasks (tasks/) run with."""
    from tasks import base

    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


@contextmanager
def database_unreachable(world: World) -> Iterator[None]:
    """The world's database refuses every connection (a real driver error, as when
    PostgreSQL restarts or fails over), until the block ends."""
    from sqlalchemy import create_engine

    from app.db import session_factory

    working = world.rt.sessions
    world.rt.sessions = session_factory(create_engine("sqlite:////no/such/folder/fl.db"))
    try:
        yield
    finally:
        world.rt.sessions = working
