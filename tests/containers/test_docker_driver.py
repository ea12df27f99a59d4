"""DockerDriver against a real engine: podman's Docker-compatible API service on a private
socket (tests/fixtures/containers.py), real containers, no fake anywhere between the driver
and the engine. A plain Engine API client arranges and checks state independently."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.adapters.drivers import build_driver
from app.adapters.drivers.base import Observation
from app.adapters.drivers.docker import DockerDriver
from app.errors import DriverMisconfigured, DriverTransientError
from app.net_config import DockerDriverConfig
from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob, PrewarmNet
from app.settings import Settings
from app.usecases import declared_nets, dispatch, enqueue, prewarm, reconciler, records
from app.usecases.dispatch import Step
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.prewarm.warm_up import Warm
from models import NetState
from tests.fakes import FakeAdmin, FakeServer
from tests.fixtures.containers import (
    SERVES_UNTIL_STOPPED,
    Containers,
    PodmanService,
    wait_for,
)
from tests.fixtures.db import make_admin_kit


def _driver(engine_url: str, container: str) -> DockerDriver:
    config = DockerDriverConfig(
        kind="docker", container=container, engine_url=engine_url, stop_timeout_s=5
    )
    return DockerDriver("net-d", config)


def _running(engine: PodmanService, name: str) -> bool:
    with engine.client() as client:
        return bool(client.inspect_container(name)["State"]["Running"])


def _started_at(engine: PodmanService, name: str) -> str:
    with engine.client() as client:
        return str(client.inspect_container(name)["State"]["StartedAt"])


def test_start_then_stop_a_container(podman_service: PodmanService, containers: Containers):
    name = containers.create("server", SERVES_UNTIL_STOPPED)
    driver = _driver(podman_service.url, name)
    assert driver.observe() == Observation(desired=0, running=0, pending=0)  # created only

    driver.scale(1)

    assert _running(podman_service, name)
    assert driver.observe() == Observation(desired=1, running=1, pending=0)
    started = _started_at(podman_service, name)
    driver.scale(1)  # already running: the engine answers 304, nothing restarts
    assert _started_at(podman_service, name) == started

    driver.scale(0)

    assert not _running(podman_service, name)
    assert driver.observe() == Observation(desired=0, running=0, pending=0)
    driver.scale(0)  # already stopped: 304, no error
    driver.scale(1)  # and it starts again
    assert driver.observe().is_up


def test_a_stop_that_times_out_still_reads_as_stopped(
    podman_service: PodmanService, containers: Containers
):
    # A server that ignores SIGTERM is killed by the engine after stop_timeout_s (exit 137):
    # that is a stop, not a crash.
    name = containers.create("stubborn", "trap '' TERM; while :; do sleep 0.1; done")
    config = DockerDriverConfig(
        kind="docker", container=name, engine_url=podman_service.url, stop_timeout_s=1
    )
    driver = DockerDriver("net-d", config)
    driver.scale(1)

    driver.scale(0)

    with podman_service.client() as client:
        assert client.inspect_container(name)["State"]["ExitCode"] == 137
    assert driver.observe() == Observation(desired=0, running=0, pending=0)


@pytest.mark.parametrize("call", ["scale(1)", "scale(0)", "observe()"])
def test_a_missing_container_is_misconfigured_and_named(
    podman_service: PodmanService, containers: Containers, call: str
):
    missing = containers.name("never-created")
    driver = _driver(podman_service.url, missing)

    with pytest.raises(DriverMisconfigured) as raised:
        if call == "scale(1)":
            driver.scale(1)
        elif call == "scale(0)":
            driver.scale(0)
        else:
            driver.observe()

    assert missing in str(raised.value)
    assert podman_service.url in str(raised.value)
    assert "create it first" in str(raised.value)


def test_a_container_that_exits_on_its_own_is_not_running_and_says_why(
    podman_service: PodmanService, containers: Containers
):
    name = containers.create("crashing", "sleep 0.5; exit 3")
    driver = _driver(podman_service.url, name)
    driver.scale(1)

    wait_for("the container to exit", lambda: not _running(podman_service, name))
    observation = driver.observe()

    assert observation.running == 0
    assert not observation.is_up
    assert observation.desired == 0  # nothing will run it again until a start is asked for
    assert observation.failure is not None
    assert "exited on its own with code 3" in observation.failure


@pytest.mark.parametrize("call", ["scale(1)", "scale(0)", "observe()"])
def test_an_unreachable_engine_is_transient(tmp_path: Path, call: str):
    driver = _driver(f"unix://{tmp_path / 'nobody-serves-this.sock'}", "fl-server-net-d")

    with pytest.raises(DriverTransientError) as raised:
        if call == "scale(1)":
            driver.scale(1)
        elif call == "scale(0)":
            driver.scale(0)
        else:
            driver.observe()

    assert "engine unreachable" in str(raised.value)
    assert "fl-server-net-d" in str(raised.value)


# Crashes on its first run only: the container keeps its file system between starts.
CRASHES_ONCE = f"if [ -e /crashed ]; then {SERVES_UNTIL_STOPPED}; else touch /crashed; exit 1; fi"


def _docker_runtime(tmp_path, job_root, sqlite_factory, clock, engine_url: str, name: str):
    """A Runtime on the real driver for one docker net, net-d (the NVFLARE side faked)."""
    net = {
        "name": "net-d",
        "driver": {"kind": "docker", "container": name, "engine_url": engine_url},
        "admin": {"kit_dir": str(make_admin_kit(tmp_path / "admin")), "username": "admin"},
        "required_sites": ["site-1", "site-2"],
    }
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net]),
        PER_JOB_FL_SERVER="true",
    )
    server = FakeServer()  # the NVFLARE side answers; the driver's view is what is tested
    rt = Runtime(
        settings=settings,
        engine=sqlite_factory.kw["bind"],
        sessions=sqlite_factory,
        clock=clock,
        driver_factory=build_driver,
        admin_factory=lambda net, s: FakeAdmin(server),
        outbox=RecordingOutbox(),
    )
    with sqlite_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    return rt


def _net_state(rt: Runtime) -> NetState:
    with rt.sessions() as session:
        return records.get_net(session, "net-d").state


def test_a_prewarm_starts_a_server_that_crashed_before_instead_of_giving_up(
    podman_service: PodmanService, containers: Containers, tmp_path, job_root, sqlite_factory, clock
):
    name = containers.create("crashed", CRASHES_ONCE)
    with podman_service.client() as client:
        client.start(name)  # an earlier run of the server, which crashed
    wait_for("the earlier run to crash", lambda: not _running(podman_service, name))
    rt = _docker_runtime(tmp_path, job_root, sqlite_factory, clock, podman_service.url, name)
    crashed_at = _started_at(podman_service, name)
    # A stopped net with a crashed container is no drift: nothing runs, nothing to stop.
    clock.advance(rt.settings.stuck_after_s + 1)
    assert reconciler.reconcile(rt).repaired == ()
    prewarm.request_prewarm(rt, PrewarmNet(caller_key="p", net="net-d", within_s=300))

    first = prewarm_warm_up.warm_up(rt, "net-d")

    assert first.step == Warm.NOT_READY, first.detail
    assert _running(podman_service, name) and _started_at(podman_service, name) != crashed_at
    clock.advance(2)
    assert prewarm_warm_up.warm_up(rt, "net-d").step == Warm.READY
    assert _net_state(rt) == NetState.READY


def test_a_server_that_crashes_after_a_prewarm_started_it_fails_the_hold_at_once(
    podman_service: PodmanService, containers: Containers, tmp_path, job_root, sqlite_factory, clock
):
    name = containers.create("crashing", "sleep 0.5; exit 3")
    rt = _docker_runtime(tmp_path, job_root, sqlite_factory, clock, podman_service.url, name)
    prewarm.request_prewarm(rt, PrewarmNet(caller_key="p", net="net-d", within_s=300))
    assert prewarm_warm_up.warm_up(rt, "net-d").step == Warm.NOT_READY  # started it
    wait_for("the container to exit", lambda: not _running(podman_service, name))
    clock.advance(2)

    crashed = prewarm_warm_up.warm_up(rt, "net-d")

    assert crashed.step == Warm.GAVE_UP  # at once, not after ready_timeout_s
    assert "exited on its own with code 3" in crashed.detail
    assert _net_state(rt) == NetState.UNHEALTHY


@pytest.fixture
def own_engine(tmp_path: Path) -> Iterator[PodmanService]:
    """An API service this test alone uses, so it may stop and restart it."""
    service = PodmanService(tmp_path / "engine")
    service.start()
    try:
        yield service
    finally:
        service.stop()


def test_an_engine_restart_while_the_net_comes_up_is_waited_out(
    own_engine: PodmanService, containers: Containers, tmp_path, job_root, sqlite_factory, clock
):
    """The readiness step, on the real driver, while the engine's API restarts: the job
    keeps waiting (NOT_READY, net STARTING, nothing requeued or marked), then is ready once
    the engine answers again and says the container runs."""
    name = containers.create("server", SERVES_UNTIL_STOPPED)
    rt = _docker_runtime(tmp_path, job_root, sqlite_factory, clock, own_engine.url, name)
    settings = rt.settings
    with sqlite_factory.begin() as session:
        request = EnqueueJob(caller_key="k", definition="tiny-job", net="net-d")
        job_id = enqueue.enqueue_job(session, settings, request, clock()).job_id
    [assignment] = dispatch.claim_and_start(rt)
    assert dispatch.scale_up(rt, job_id, "net-d", assignment.attempt).step == Step.DONE
    assert _running(own_engine, name)

    own_engine.stop()
    clock.advance(5)
    down = dispatch.check_ready(rt, job_id, "net-d", assignment.attempt)

    assert down.step == Step.NOT_READY
    assert "engine unreachable" in down.detail
    with sqlite_factory() as session:
        assert records.get_net(session, "net-d").state == NetState.STARTING
        assert records.get_job(session, job_id).net_name == "net-d"

    own_engine.start()
    clock.advance(5)
    back = dispatch.check_ready(rt, job_id, "net-d", assignment.attempt)

    assert back.step == Step.DONE, back.detail
    with sqlite_factory() as session:
        assert records.get_net(session, "net-d").state == NetState.READY
    assert _running(own_engine, name)  # the container outlived the engine's API service
