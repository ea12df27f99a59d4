"""The shipped least-privilege proxy (app/policies/docker-socket-proxy.haproxy.cfg), run by
a real HAProxy in front of a real engine: the driver works through it, and nothing but
start, stop and inspect of fl-server-* containers gets through."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from app.adapters.drivers.docker import DOCKER_API_VERSION, DockerDriver
from app.errors import DriverMisconfigured
from app.net_config import DockerDriverConfig
from tests.fixtures.containers import SERVES_UNTIL_STOPPED, Containers, PodmanService, podman
from tests.fixtures.services import _wait, free_port

POLICY = (
    Path(__file__).resolve().parents[2] / "app" / "policies" / "docker-socket-proxy.haproxy.cfg"
)


@pytest.fixture
def proxy(podman_service: PodmanService, tmp_path: Path) -> Iterator[str]:
    """The proxy on a free loopback port; its URL."""
    port = free_port()
    env = os.environ | {
        "ENGINE_SOCKET": str(podman_service.socket),
        "PROXY_BIND": f"127.0.0.1:{port}",
    }
    log = (tmp_path / "haproxy.log").open("wb")
    process = subprocess.Popen(
        ["haproxy", "-db", "-f", str(POLICY)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"tcp://127.0.0.1:{port}"
    client = docker.APIClient(base_url=url, version=DOCKER_API_VERSION, timeout=2)

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"haproxy exited: {(tmp_path / 'haproxy.log').read_text()}")
        try:
            return bool(client.ping())
        except Exception:
            return False

    try:
        _wait("haproxy", answers, 20)
        yield url
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


def _driver(url: str, container: str) -> DockerDriver:
    config = DockerDriverConfig(kind="docker", container=container, engine_url=url)
    return DockerDriver("net-p", config)


@pytest.fixture
def fl_server(containers: Containers) -> str:
    return containers.create("", SERVES_UNTIL_STOPPED, name=f"fl-server-{uuid.uuid4().hex[:8]}")


def test_the_driver_starts_observes_and_stops_through_the_proxy(proxy: str, fl_server: str):
    driver = _driver(proxy, fl_server)

    driver.scale(1)
    assert driver.observe().is_up
    driver.scale(0)

    assert driver.observe().running == 0


def test_another_container_is_refused_and_reported_misconfigured(
    proxy: str, containers: Containers
):
    other = containers.create("other", SERVES_UNTIL_STOPPED)  # not named fl-server-*
    driver = _driver(proxy, other)

    with pytest.raises(DriverMisconfigured, match="HTTP 403"):
        driver.scale(1)

    assert "false" in podman("inspect", "--format", "{{.State.Running}}", other).stdout


def test_create_exec_and_listing_are_refused(proxy: str, fl_server: str, busybox_image: str):
    client = docker.APIClient(base_url=proxy, version=DOCKER_API_VERSION, timeout=10)
    refused = {
        "create": lambda: client.create_container(busybox_image, "true", name="fl-server-evil"),
        "exec": lambda: client.exec_create(fl_server, "true"),
        "remove": lambda: client.remove_container(fl_server, force=True),
        "list containers": lambda: client.containers(all=True),
        "list images": client.images,
        "kill": lambda: client.kill(fl_server),
    }
    for what, call in refused.items():
        with pytest.raises(docker.errors.APIError) as raised:
            call()
        assert raised.value.status_code == 403, what
    client.close()

    assert podman("container", "exists", "fl-server-evil", check=False).returncode == 1
    assert podman("container", "exists", fl_server, check=False).returncode == 0
