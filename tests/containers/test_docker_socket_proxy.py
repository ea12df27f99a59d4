"""The shipped least-privilege proxy (app/policies/docker-socket-proxy.haproxy.cfg), run by
a real HAProxy in front of a real engine: the driver works through it, and nothing but
start, stop and inspect of fl-server-* containers, exactly as the driver sends them, gets
through."""

from __future__ import annotations

import json
import os
import socket
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


# What makes a start root on the host where the engine still reads a start's body (Docker
# Engine up to 24 does for API versions below 1.24).
HOST_TAKEOVER = json.dumps(
    {"Privileged": True, "Binds": ["/:/host"], "PidMode": "host", "NetworkMode": "host"}
).encode()


def _send(
    proxy: str, method: str, path: str, body: bytes | None = None, chunked: bool = False
) -> int:
    """One raw HTTP/1.1 request through the proxy, written at once (the proxy may answer
    and close before it reads a body); the status it answers."""
    head = [f"{method} {path} HTTP/1.1", "Host: docker", "Connection: close"]
    payload = b""
    if chunked:  # Transfer-Encoding, no Content-Length
        head += ["Content-Type: application/json", "Transfer-Encoding: chunked"]
        payload = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    elif body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        payload = body
    host, port = proxy.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall("\r\n".join([*head, "", ""]).encode() + payload)
        status_line = connection.makefile("rb").readline()
    return int(status_line.split()[1])


def _running(container: str) -> bool:
    return "true" in podman("inspect", "--format", "{{.State.Running}}", container).stdout


def test_a_start_that_carries_a_body_is_refused(proxy: str, fl_server: str):
    old = f"/v1.23/containers/{fl_server}/start"
    current = f"/v{DOCKER_API_VERSION}/containers/{fl_server}/start"
    starts = {
        "old API version, HostConfig": (old, HOST_TAKEOVER, False),
        "driver's API version, HostConfig": (current, HOST_TAKEOVER, False),
        "chunked HostConfig, old API version": (old, HOST_TAKEOVER, True),
        "chunked HostConfig, driver's API version": (current, HOST_TAKEOVER, True),
        "chunked, empty": (current, b"", True),
    }
    for what, (path, body, chunked) in starts.items():
        assert _send(proxy, "POST", path, body, chunked) == 403, what

    assert not _running(fl_server)


def test_a_start_over_http2_is_refused(proxy: str, fl_server: str):
    """HTTP/2 carries a body without Content-Length or Transfer-Encoding: the proxy speaks
    HTTP/1.1 only, so a body is always announced in a header it checks."""
    answered = subprocess.run(
        [
            "curl", "--silent", "--http2-prior-knowledge", "--output", "/dev/null",
            "--write-out", "%{http_version} %{http_code}", "--max-time", "10",
            "-X", "POST", "-H", "Content-Type: application/json", "--upload-file", "-",
            f"http://{proxy.removeprefix('tcp://')}/v{DOCKER_API_VERSION}/containers/{fl_server}/start",
        ],
        input=HOST_TAKEOVER, capture_output=True, check=False,
    )  # fmt: skip

    # No HTTP/2 exchange at all (curl reports version 0, no status).
    assert not answered.stdout.startswith(b"2 "), answered
    assert not _running(fl_server)


def test_api_versions_other_than_the_drivers_are_refused(proxy: str, fl_server: str):
    for path in (
        f"/v1.23/containers/{fl_server}/start",
        f"/v1.12/containers/{fl_server}/json",
        f"/containers/{fl_server}/start",  # unversioned: the engine's own default
        f"/v1.410/containers/{fl_server}/start",
        "/v1.23/_ping",
    ):
        method = "GET" if path.endswith(("/json", "/_ping")) else "POST"
        assert _send(proxy, method, path) == 403, path

    assert not _running(fl_server)


def test_queries_and_bodies_the_driver_never_sends_are_refused(proxy: str, fl_server: str):
    version = f"/v{DOCKER_API_VERSION}"
    podman("start", fl_server)
    refused = [
        ("POST", f"/containers/{fl_server}/stop?signal=SIGKILL", None),
        ("POST", f"/containers/{fl_server}/stop?t=5&signal=SIGKILL", None),
        ("POST", f"/containers/{fl_server}/stop", None),  # the driver always sends t
        ("POST", f"/containers/{fl_server}/stop?t=5", b'{"t": 0}'),
        ("POST", f"/containers/{fl_server}/start?detachKeys=ctrl-x", None),
        ("GET", f"/containers/{fl_server}/json?size=true", None),
        ("GET", f"/containers/{fl_server}/json", b"{}"),
        ("GET", "/_ping?x=1", None),
    ]
    for method, path, body in refused:
        assert _send(proxy, method, version + path, body) == 403, (method, path)

    assert _running(fl_server)
    # What the driver sends gets through.
    assert _send(proxy, "GET", f"{version}/containers/{fl_server}/json") == 200
    assert _send(proxy, "POST", f"{version}/containers/{fl_server}/stop?t=5") == 204
