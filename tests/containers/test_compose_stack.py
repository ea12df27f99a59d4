"""compose.yml for real, in a real container engine: podman-compose builds the image from
compose.yml's own Dockerfile and brings up PostgreSQL, Redis, migrate, worker, beat, Celery
Flower, the API, the least-privilege docker-proxy and a containerized NVFLARE net (an
fl-server container the docker driver scales, two site containers, all from one provisioned
project). flip-api's side is played from outside: a plain Celery `send_task` to the stack's
Redis (reached on its container network address) and the published API.

Nothing is overridden: the registry images compose.yml names are stand-ins built from Debian
packages and imported under those names (tests/fixtures/images.py, cached in podman's
store), which is what a registry-less site would do too. Every address is loopback or the
project's own container network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from celery import Celery

from app import names
from app.local.nvflare import build_tiny_job, provision
from app.schemas import job_id_for
from tests.fixtures import images, testrun
from tests.fixtures.containers import PodmanService
from tests.fixtures.flower import make_tls
from tests.fixtures.services import free_port

pytestmark = pytest.mark.timeout(1200)

EXPECTED_S = 150  # seconds with its images built (tests/tools/schedule.py)

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("--profile", "docker", "--profile", "net")
SERVER_PORT = 8002
ADMIN = "admin@nvidia.com"
IMAGE_UID = 10001  # the image's user (compose.yml)
GRACE_S = 5
# Every service compose.yml declares (the profiles' above included), read from the file
# itself so that a service added there is started here too. The `flower-net` profile's
# (a SuperLink and SuperNodes) are not run here: its net's configuration is checked.
SERVICES = tuple(
    name
    for name, service in yaml.safe_load((ROOT / "compose.yml").read_text())["services"].items()
    if set(service.get("profiles", [])) <= set(PROFILES[1::2])
)
FLOWER_NET = "flower-net-1"


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    server_container: str
    api_url: str
    flower_url: str
    flower_auth: tuple[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        podman_compose = Path(sys.executable).with_name("podman-compose")
        argv = [str(podman_compose), "-f", str(ROOT / "compose.yml"), "-p", self.project]
        result = subprocess.run(
            [*argv, *PROFILES, *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        assert result.returncode == 0, (
            f"compose {args}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
        return result

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def state(self, container: str) -> dict[str, Any]:
        inspected = json.loads(_podman("inspect", container).stdout)[0]
        return dict(inspected["State"])

    def address(self, service: str) -> str:
        networks = json.loads(_podman("inspect", self.container(service)).stdout)[0][
            "NetworkSettings"
        ]["Networks"]
        return str(next(iter(networks.values()))["IPAddress"])

    def logs(self, *services: str) -> str:
        """Each service's warnings and errors, then its last 40 lines."""
        parts = []
        for service in services:
            name = self.server_container if service == "fl-server" else self.container(service)
            out = _podman("logs", name, check=False)
            lines = (out.stdout + out.stderr).splitlines()
            loud = [line for line in lines if " WARNING " in line or " ERROR " in line]
            parts.append(
                f"--- {service}: {len(loud)} warnings and errors (last 20)\n"
                + "\n".join(loud[-20:])
                + f"\n--- {service}: last 40 lines\n"
                + "\n".join(lines[-40:])
            )
        return "\n".join(parts)

    def get(self, path: str) -> Any:
        response = httpx.get(self.api_url + path, timeout=10)
        response.raise_for_status()
        return response.json()

    def wait(
        self,
        what: str,
        condition: Callable[[], bool],
        timeout_s: float,
        *logs: str,
        facts: Callable[[], Any] | None = None,
    ) -> float:
        """Seconds it took; fails with `facts` (what the API says) first, then the logs."""
        started = time.monotonic()
        while True:
            try:
                if condition():
                    return time.monotonic() - started
            except (httpx.HTTPError, OSError, KeyError, IndexError):
                pass  # not up yet
            if time.monotonic() - started > timeout_s:
                summary = ""
                if facts is not None:
                    try:
                        summary = json.dumps(facts(), indent=1, default=str)
                    except Exception as exc:  # the summary must not hide the failure
                        summary = f"(no facts: {exc!r})"
                pytest.fail(f"{what}: not within {timeout_s:.0f}s\n{summary}\n{self.logs(*logs)}")
            time.sleep(0.5)


def _chown(path: Path) -> None:
    for item in [path, *path.rglob("*")]:
        os.chown(item, IMAGE_UID, IMAGE_UID, follow_symlinks=False)


def _nets_file(path: Path, container: str, kits: str, flower_container: str) -> None:
    """net-1, the NVFLARE net that runs here; a Flower net beside it, as
    app/deploy/examples/nets.docker.toml shows one (its SuperLink never created here)."""
    path.write_text(
        f"""[[nets]]
name = "net-1"
idle_timeout_s = {GRACE_S}
ready_timeout_s = 240
required_sites = ["site-1", "site-2"]
server_endpoint = "fl-server:{SERVER_PORT}"
per_job_fl_server = true
[nets.driver]
kind = "docker"
container = "{container}"
engine_url = "tcp://docker-proxy:2375"
stop_timeout_s = 20
[nets.admin]
kit_dir = "{kits}/{ADMIN}"
username = "{ADMIN}"

[[nets]]
name = "{FLOWER_NET}"
backend = "flower"
idle_timeout_s = {GRACE_S}
required_sites = ["site-1", "site-2"]
[nets.driver]
kind = "docker"
container = "{flower_container}"
engine_url = "tcp://docker-proxy:2375"
[nets.flower]
address = "superlink:9093"
root_certificates = "{kits}/{FLOWER_NET}/ca.pem"
"""
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("compose")
    suffix = uuid.uuid4().hex[:6]
    project = f"fle2e{suffix}"
    # podman-compose labels all it makes with its project (the pod: by name), by which the
    # next run finds what a killed one left.
    testrun.record("compose", project)
    started = time.monotonic()
    stand_ins = images.build_all()
    timings = {"stand-in images": time.monotonic() - started}

    # The engine the docker driver talks to (through docker-proxy): an API service of this
    # test's own on the machine's podman.
    engine = PodmanService(work / "engine")
    engine.start()
    deployment = provision(
        work / "nvflare",
        project="fl-compose",
        port=SERVER_PORT,
        server_name="fl-server",
        store_dir=Path("/workspace/store"),
    )
    kits = deployment.server_kit.parent
    jobs = work / "jobs"
    build_tiny_job(jobs / "tiny-fedavg", num_rounds=2)
    make_tls(kits / FLOWER_NET).ca.rename(kits / FLOWER_NET / "ca.pem")
    _chown(kits)
    _chown(jobs)
    server_container = f"fl-server-e2e-{suffix}"
    nets = work / "nets.toml"
    _nets_file(nets, server_container, "/etc/fl-dispatcher/kits", f"fl-server-flower-{suffix}")
    api_port, flower_port = free_port(), free_port()
    env = os.environ | {
        "POSTGRES_PASSWORD": uuid.uuid4().hex,
        "FLOWER_BASIC_AUTH": f"ops:{uuid.uuid4().hex}",
        "NETS_FILE": str(nets),
        "NVFLARE_KITS_DIR": str(kits),
        "JOBS_DIR": str(jobs),
        "DOCKER_SOCKET": str(engine.socket),
        "FL_SERVER_KIT_DIR": str(deployment.server_kit),
        "FL_SITE_1_KIT_DIR": str(deployment.site_kits["site-1"]),
        "FL_SITE_2_KIT_DIR": str(deployment.site_kits["site-2"]),
        "FL_SERVER_CONTAINER": server_container,
        "API_PORT": str(api_port),
        "FLOWER_PORT": str(flower_port),
        "LOG_JSON": "false",
        # FLIP's and the other settings reach the containers from here, unedited file.
        "PER_JOB_FL_SERVER": "true",
        "HOUSEKEEPING_INTERVAL_S": "2",
        "MAX_ATTEMPTS": "2",
    }
    user, password = env["FLOWER_BASIC_AUTH"].split(":")
    stack = Stack(
        project=project,
        env=env,
        server_container=server_container,
        api_url=f"http://127.0.0.1:{api_port}",
        flower_url=f"http://127.0.0.1:{flower_port}",
        flower_auth=(user, password),
        timings=timings,
    )
    try:
        started = time.monotonic()
        # One build: every app service shares this image (podman-compose would run one
        # build per service, in parallel).
        stack.compose("build", "api")
        stack.timings["image build"] = time.monotonic() - started
        started = time.monotonic()
        # Everything is created; all but the fl-server started: the docker driver starts it
        # for a job (as an operator's `docker compose --profile net create fl-server`).
        stack.compose("up", "-d", "--no-start")
        # Started by podman itself, all at once: podman-compose 1.6's `start` weighs the
        # depends_on conditions, and with podman 4.3 running no healthcheck by itself a
        # `service_healthy` one may never hold, so the services behind it were left created
        # and never started (seen when the image was just built). Every service retries its
        # dependencies on start (app/entrypoints/README.md "Running the stack with Docker or
        # podman"), which is what this exercises.
        _podman("start", *(stack.container(s) for s in SERVICES if s != "fl-server"))
        stack.wait(
            "the API ready (database at head, broker up)",
            lambda: httpx.get(stack.api_url + "/readyz", timeout=5).status_code == 200,
            240,
            "migrate",
            "api",
            "postgres",
        )
        stack.timings["stack up"] = time.monotonic() - started
        print(f"\nstand-ins: {stand_ins}\ntimings: {stack.timings}")
        yield stack
    finally:
        subprocess.run(
            [str(Path(sys.executable).with_name("podman-compose")), "-f", str(ROOT / "compose.yml"),
             "-p", stack.project, *PROFILES, "down", "-v", "-t", "5"],
            env=env, cwd=ROOT, capture_output=True, check=False, timeout=300,
        )  # fmt: skip
        _podman("rm", "-f", "-t", "0", server_container, check=False)
        engine.stop()
        shutil.rmtree(work, ignore_errors=True)


def _send_job(stack: Stack, key: str) -> str:
    app = Celery(broker=f"redis://{stack.address('redis')}:6379/0")
    app.conf.update(task_serializer="json", accept_content=["json"])
    payload = {"caller_key": key, "definition": "tiny-fedavg", "net": "net-1"}
    app.send_task(names.ENQUEUE_JOB, kwargs={"payload": payload}, queue=names.QUEUE)
    app.close()
    return str(job_id_for(key))


def _history(stack: Stack, job_id: str) -> dict[str, datetime]:
    job = stack.get(f"/jobs/{job_id}")
    return {event["to_state"]: datetime.fromisoformat(event["at"]) for event in job["history"]}


def _server_running(stack: Stack) -> bool:
    return bool(stack.state(stack.server_container)["Running"])


def _net(stack: Stack) -> dict[str, Any]:
    return next(n for n in stack.get("/fl/status")["nets"] if n["name"] == "net-1")


def _run_job(stack: Stack, key: str) -> dict[str, float]:
    """Send one job from outside; follow it to COMPLETED and the server back to zero."""
    assert not _server_running(stack)
    before = stack.state(stack.server_container)["StartedAt"]
    job_id = _send_job(stack, key)
    logs = ("worker", "housekeeper", "fl-server", "site-1", "docker-proxy")

    stack.wait("the fl-server container started", lambda: _server_running(stack), 120, *logs)
    assert stack.state(stack.server_container)["StartedAt"] != before
    sites_seen: set[str] = set()

    def completed() -> bool:
        # The status page's view of the server while the job runs: both sites connected.
        sites_seen.update(_net(stack)["connected_sites"] or [])
        return bool(stack.get(f"/jobs/{job_id}")["state"] == "COMPLETED")

    def facts() -> dict[str, Any]:
        return {"job": stack.get(f"/jobs/{job_id}"), "net": _net(stack)}

    stack.wait("the job COMPLETED", completed, 240, *logs, facts=facts)
    assert sites_seen == {"site-1", "site-2"}
    history = _history(stack, job_id)
    assert "RUNNING" in history, history
    stopped_in = stack.wait(
        "the fl-server container stopped after the idle grace",
        lambda: not _server_running(stack) and _net(stack)["state"] == "STOPPED",
        GRACE_S + 90,
        *logs,
        facts=facts,
    )
    return {
        "assigned to running (cold start and submit) s": (
            history["RUNNING"] - history["ASSIGNED"]
        ).total_seconds(),
        "completed to stopped s": stopped_in,
    }


def test_jobs_from_outside_start_the_server_container_and_it_goes_back_to_zero(stack: Stack):
    first = _run_job(stack, f"compose-1-{uuid.uuid4().hex[:6]}")
    second = _run_job(stack, f"compose-2-{uuid.uuid4().hex[:6]}")

    metrics = httpx.get(stack.api_url + "/metrics", timeout=10).text
    cold = [line for line in metrics.splitlines() if "cold_start_seconds" in line]
    print(f"\nfirst job: {first}\nsecond job: {second}\n" + "\n".join(cold))
    assert any(
        line.startswith("fl_dispatcher_cold_start_seconds_count") and line.endswith(" 2.0")
        for line in cold
    ), cold


def test_config_check_in_the_stack_passes_the_flower_net_beside_the_nvflare_one(stack: Stack):
    # What the dispatcher's containers read: the mounted nets file, its CA under the kits.
    done = _podman(
        "exec", stack.container("api"), "fl-dispatcher", "config", "check", "--json", check=False
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    nets = {net["name"]: net for net in json.loads(done.stdout)["nets"]}
    assert set(nets) == {"net-1", FLOWER_NET}
    flower = nets[FLOWER_NET]
    assert (flower["backend"], flower["driver"]["kind"]) == ("flower", "docker")
    assert flower["kit_problem"] is None
    assert nets["net-1"]["kit_problem"] is None


def test_flower_needs_its_credentials_and_beat_is_ticking(stack: Stack):
    stack.wait(
        "Celery Flower up",
        lambda: httpx.get(stack.flower_url + "/healthcheck", timeout=5).status_code == 200,
        120,
        "flower",
    )
    assert httpx.get(stack.flower_url + "/", timeout=10).status_code == 401
    assert httpx.get(stack.flower_url + "/", auth=stack.flower_auth, timeout=10).status_code == 200
    # The credentials are not on any process's command line.
    command = " ".join(json.loads(_podman("inspect", stack.container("flower")).stdout)[0]["Args"])
    assert stack.flower_auth[1] not in command

    # podman runs no healthcheck by itself here; run beat's by hand: it reads the heartbeat.
    health = _podman("healthcheck", "run", stack.container("beat"), check=False)
    assert health.returncode == 0, health.stdout + health.stderr


# Connects to host:port from inside a container; prints "connected" or why not.
PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except OSError as exc:
    print(type(exc).__name__, exc)
"""


def _probe(stack: Stack, service: str, host: str, port: int, timeout_s: float = 3) -> str:
    """What a connection from `service`'s container to host:port comes to."""
    result = _podman(
        "exec", stack.container(service), "python3", "-c", PROBE, host, str(port), str(timeout_s)
    )
    return result.stdout.strip()


def test_a_site_container_cannot_reach_the_docker_proxy(stack: Stack):
    """The sites and the fl-server run submitted job code; the proxy starts containers. Only
    the dispatcher's own services that drive the engine share the proxy's network."""
    proxy = json.loads(_podman("inspect", stack.container("docker-proxy")).stdout)[0]
    addresses = [n["IPAddress"] for n in proxy["NetworkSettings"]["Networks"].values()]
    assert addresses, proxy["NetworkSettings"]

    for service in ("worker", "housekeeper", "api"):
        assert _probe(stack, service, "docker-proxy", 2375) == "connected", service
    # Neither its name nor any of its addresses: no answer at all within the probe's 3 s
    # (a dropped connection attempt gives no earlier event to wait on).
    for host in ("docker-proxy", *addresses):
        answer = _probe(stack, "site-1", host, 2375)
        assert answer != "connected", (host, answer)


def _addresses(container: str) -> list[str]:
    networks = json.loads(_podman("inspect", container).stdout)[0]["NetworkSettings"]["Networks"]
    return [str(n["IPAddress"]) for n in networks.values() if n.get("IPAddress")]


def _network_names(container: str) -> set[str]:
    inspected = json.loads(_podman("inspect", container).stdout)[0]
    return set(inspected["NetworkSettings"]["Networks"])


def test_a_site_container_cannot_reach_the_broker_or_the_database(stack: Stack):
    """Job code runs in the sites and the fl-server: Redis (no password) would let it send
    or revoke any task, PostgreSQL holds the job store. Only the fl-server and its admin
    clients share the sites' network."""
    targets = {"redis": 6379, "postgres": 5432}
    for service, port in targets.items():
        addresses = _addresses(stack.container(service))
        assert addresses, service
        # The probe can connect: the dispatcher's own services do.
        assert _probe(stack, "worker", service, port) == "connected", service
        # Neither its name nor any of its addresses (no answer within the probe's 3 s).
        for host in (service, *addresses):
            answer = _probe(stack, "site-1", host, port)
            assert answer != "connected", (service, host, answer)
    # The fl-server container the driver starts (created by compose) is on the sites'
    # network and on no network of Redis or PostgreSQL.
    server_networks = _network_names(stack.server_container)
    assert server_networks == _network_names(stack.container("site-1")), server_networks
    for service in targets:
        assert not server_networks & _network_names(stack.container(service)), service


def test_compose_down_leaves_nothing(stack: Stack):
    stack.compose("down", "-v", "-t", "5")
    label = f"label=io.podman.compose.project={stack.project}"

    assert _podman("ps", "-a", "-q", "--filter", label).stdout.strip() == ""
    assert _podman("volume", "ls", "-q", "--filter", label).stdout.strip() == ""
    assert stack.project not in _podman("network", "ls", "--format", "{{.Name}}").stdout
    assert _podman("container", "exists", stack.server_container, check=False).returncode == 1
