"""compose.yml brought up for real by podman-compose, for test_compose_stack.py: the stack,
its files (an NVFLARE project, a Flower CA and SuperNode keys, the nets file, the jobs), how
it is brought up and taken down, and what the tests ask of it.

Nothing is overridden: the registry images compose.yml names are stand-ins built from Debian
packages and imported under those names (tests/fixtures/images.py, cached in podman's
store), which is what a registry-less site would do too. Every address is loopback or the
project's own container network.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.local.flower import build_flower_app, make_supernode_key, make_tls
from app.local.nvflare import build_tiny_job, provision
from tests.fixtures import images, testrun
from tests.fixtures.containers import PodmanService
from tests.fixtures.services import free_port

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("--profile", "docker", "--profile", "net", "--profile", "flower-net")
SERVER_PORT = 8002
ADMIN = "admin@nvidia.com"
IMAGE_UID = 10001  # the user of both images (compose.yml)
GRACE_S = 5
SUPERLINK_UP_S = 300  # its container answering on a loaded 2-core machine (register_supernodes)
# Every service compose.yml declares (the profiles' above included), read from the file
# itself so that a service added there is started here too.
SERVICES = tuple(
    name
    for name, service in yaml.safe_load((ROOT / "compose.yml").read_text())["services"].items()
    if set(service.get("profiles", [])) <= set(PROFILES[1::2])
)
# The two the docker driver starts for a job: compose only creates them.
SCALED = ("fl-server", "superlink")
FLOWER_NET = "flower-net-1"
FLOWER_APP = "flower-app"
SITES = ("site-1", "site-2")
SUPERLINK = "superlink:9093"  # how the SuperNodes and the dispatcher dial it (compose.yml)
KITS = "/etc/fl-dispatcher/kits"  # NVFLARE_KITS_DIR inside the dispatcher's containers


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    server_container: str
    superlink_container: str
    api_url: str
    flower_url: str
    flower_auth: tuple[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        result = _compose(self.project, self.env, *args, timeout_s=timeout_s)
        assert result.returncode == 0, (
            f"compose {args}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
        return result

    def container(self, service: str) -> str:
        if service == "fl-server":
            return self.server_container
        if service == "superlink":
            return self.superlink_container
        return f"{self.project}_{service}_1"

    def state(self, container: str) -> dict[str, Any]:
        inspected = json.loads(podman("inspect", container).stdout)[0]
        return dict(inspected["State"])

    def running(self, service: str) -> bool:
        return bool(self.state(self.container(service))["Running"])

    def address(self, service: str) -> str:
        networks = json.loads(podman("inspect", self.container(service)).stdout)[0][
            "NetworkSettings"
        ]["Networks"]
        return str(next(iter(networks.values()))["IPAddress"])

    def logs(self, *services: str) -> str:
        """Each service's warnings and errors, then its last 40 lines."""
        parts = []
        for service in services:
            out = podman("logs", self.container(service), check=False)
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


def _compose(
    project: str, env: dict[str, str], *args: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    podman_compose = Path(sys.executable).with_name("podman-compose")
    argv = [str(podman_compose), "-f", str(ROOT / "compose.yml"), "-p", project, *PROFILES]
    return subprocess.run(
        [*argv, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _chown(path: Path) -> None:
    for item in [path, *path.rglob("*")]:
        os.chown(item, IMAGE_UID, IMAGE_UID, follow_symlinks=False)


def _nets_file(path: Path, container: str, superlink_container: str) -> None:
    """net-1, the NVFLARE net; flower-net-1 beside it, as app/deploy/examples/nets.docker.toml
    shows them, each with its server container started by the docker driver."""
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
kit_dir = "{KITS}/{ADMIN}"
username = "{ADMIN}"

[[nets]]
name = "{FLOWER_NET}"
backend = "flower"
idle_timeout_s = {GRACE_S}
ready_timeout_s = 240
required_sites = ["site-1", "site-2"]
[nets.driver]
kind = "docker"
container = "{superlink_container}"
engine_url = "tcp://docker-proxy:2375"
stop_timeout_s = 20
[nets.flower]
address = "{SUPERLINK}"
root_certificates = "{KITS}/{FLOWER_NET}/ca.pem"
"""
    )


@dataclass(frozen=True)
class FlowerFiles:
    """What the `flower-net` profile mounts: FLOWER_TLS_DIR, FLOWER_KEYS_DIR."""

    tls_dir: Path
    keys_dir: Path


def _flower_files(folder: Path, kits: Path) -> FlowerFiles:
    """A CA and the SuperLink's certificate for the names it is dialled by (`superlink`; and
    127.0.0.1, by its own SuperExec), under the names compose.yml mounts (the CA copied under
    the kits, for the dispatcher); a key pair per SuperNode, as `ssh-keygen` writes one."""
    tls = make_tls(folder / "tls", "fl-compose Flower CA", hosts=("superlink", "127.0.0.1"))
    tls.cert.rename(tls.cert.with_name("superlink.pem"))
    tls.key.rename(tls.key.with_name("superlink.key"))
    tls.ca.rename(tls.ca.with_name("ca.pem"))
    (kits / FLOWER_NET).mkdir(parents=True)
    shutil.copy(tls.ca.with_name("ca.pem"), kits / FLOWER_NET / "ca.pem")
    for site in SITES:
        make_supernode_key(folder / "keys", site)
    return FlowerFiles(folder / "tls", folder / "keys")


def register_supernodes(stack: Stack) -> float:
    """What an operator does once (compose.yml's header), with the SuperLink started: each
    SuperNode registered by its site name with `flwr supernode register` (its public key
    beside its private one), then the SuperLink stopped (its state volume keeps them). The
    SuperNodes connect whenever the docker driver starts it again; the Flower job's test
    sees both by name."""
    started = time.monotonic()
    logs = ("superlink", "supernode-1")
    # Its own healthcheck (podman runs none by itself here): the port answers. A bound for a
    # loaded CI machine: 120 s once passed without it (the container's Python importing flwr
    # beside four other test files at 2.5 times the quiet CPU cost).
    stack.wait(
        "the SuperLink's port answers",
        lambda: (
            podman("healthcheck", "run", stack.superlink_container, check=False).returncode == 0
        ),
        SUPERLINK_UP_S,
        *logs,
    )
    # In a one-off container of a SuperNode's service (its files, its network), not an exec
    # in the SuperNode's own: an unregistered SuperNode is refused, exits and is restarted,
    # and an exec in it dies with it (seen: exit 137, no output). One container for both
    # (the keys share a folder): each one costs seconds.
    register = " && ".join(
        f"flwr supernode register /etc/flower/keys/{site}.pub --name {site}" for site in SITES
    )
    stack.compose("run", "--rm", "--no-deps", "-T", "supernode-1", "sh", "-c", register)
    podman("stop", "-t", "20", stack.superlink_container)
    return time.monotonic() - started


@contextlib.contextmanager
def compose_stack(work: Path) -> Iterator[Stack]:
    """The whole of compose.yml up (all but the two servers the docker driver starts, the
    SuperLink stopped again once the SuperNodes are registered); down with its volumes at
    the end."""
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
    build_flower_app(jobs / FLOWER_APP)
    flower = _flower_files(work / "flower", kits)
    for folder in (kits, jobs, work / "flower"):
        _chown(folder)
    server_container = f"fl-server-e2e-{suffix}"
    superlink_container = f"fl-server-flower-{suffix}"
    nets = work / "nets.toml"
    _nets_file(nets, server_container, superlink_container)
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
        "FLOWER_TLS_DIR": str(flower.tls_dir),
        "FLOWER_KEYS_DIR": str(flower.keys_dir),
        "FL_SUPERLINK_CONTAINER": superlink_container,
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
        superlink_container=superlink_container,
        api_url=f"http://127.0.0.1:{api_port}",
        flower_url=f"http://127.0.0.1:{flower_port}",
        flower_auth=(user, password),
        timings=timings,
    )
    try:
        started = time.monotonic()
        # One build per image: every app service shares the dispatcher's, the SuperLink and
        # SuperNodes the Flower one (podman-compose would run one build per service naming
        # an image, in parallel). Each is cached in podman's store by its layers.
        stack.compose("build", "api", "superlink")
        stack.timings["image builds"] = time.monotonic() - started
        started = time.monotonic()
        # Everything is created; all but the two servers started: the docker driver starts
        # them for a job (as an operator's `docker compose --profile net create fl-server`).
        stack.compose("up", "-d", "--no-start")
        # Started by podman itself, all at once: podman-compose 1.6's `start` weighs the
        # depends_on conditions, and with podman 4.3 running no healthcheck by itself a
        # `service_healthy` one may never hold, so the services behind it were left created
        # and never started (seen when the image was just built). Every service retries its
        # dependencies on start (app/entrypoints/README.md "Running the stack with Docker or
        # podman"), which is what this exercises.
        # The SuperLink too, for the SuperNodes' registration while the rest comes up.
        podman("start", *(stack.container(s) for s in SERVICES if s not in SCALED))
        podman("start", stack.superlink_container)
        stack.timings["SuperNodes registered"] = register_supernodes(stack)
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
        _compose(project, env, "down", "-v", "-t", "5", timeout_s=300)
        for container in (server_container, superlink_container):
            podman("rm", "-f", "-t", "0", container, check=False)
        engine.stop()
        shutil.rmtree(work, ignore_errors=True)
