"""Review b: in compose, the code flip-api's users submit reads every job of every project
from the status API, past any proxy an operator puts in front of it.

Promise (app/entrypoints/README.md "Nets page"): the read routes are open; "put it behind
the same proxy auth as the rest of the API". "Who reaches what": the `net` profile's
fl-server and sites (and the Flower SuperLink and SuperNodes) "run the NVFLARE jobs
flip-api's users submit ... so they are on a network of their own (`federated-learning`,
internal)", with only the fl-server's admin clients.

What compose.yml does: `api` joins `federated-learning` (for /fl/status's admin probes,
outbound) and listens on 0.0.0.0:8080, so it listens on that network too. A proxy in front
of the published port (127.0.0.1:8080 on the host) is never on that path. Job code on the
fl-server or any site asks http://api:8080/jobs?limit=1000 and /jobs/{id} with no key and
reads every project's caller keys, `metadata` (FLIP's model_id and project_id), job
definitions (S3 URIs), the nets' `last_error` and /metrics: one project's training code
reads the others' (FLIP runs many projects' jobs on the same nets: fair share, issue 40).

Fixed: the api listens only on its default-network address (`--host-of api-listener`, an
alias given on the default network alone; app/entrypoints/listen_address.py), and joins
federated-learning for its outbound calls only. What compose says is checked here; that a
site's container gets no answer from http://api:8080 is checked against the real engine
(tests/containers/test_compose_stack.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from tests.unit.conftest import one_net_world

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yml"
RUNS_JOB_CODE = {"fl-server", "site-1", "site-2", "superlink", "supernode-1", "supernode-2"}


def _networks(service: dict) -> set[str]:
    found = service.get("networks") or ["default"]
    return set(found if isinstance(found, list) else found.keys())


def _aliases(service: dict) -> dict[str, set[str]]:
    """Each network of the service, with the aliases it has there."""
    found = service.get("networks") or ["default"]
    if isinstance(found, list):
        return {network: set() for network in found}
    return {net: set((options or {}).get("aliases") or []) for net, options in found.items()}


def _options(command: list[str], option: str) -> list[str]:
    return [command[i + 1] for i, part in enumerate(command[:-1]) if part == option]


def _listens_on(services: dict, name: str) -> set[str]:
    """The networks on which the service's `fl-dispatcher api` answers, as compose says."""
    service = services[name]
    command = [str(part) for part in service["command"]]
    aliases = _aliases(service)
    if command[:2] != ["fl-dispatcher", "api"]:  # a shell, or anything else: assume everywhere
        return set(aliases)
    names = _options(command, "--host-of")
    if not names:
        host = (_options(command, "--host") or ["127.0.0.1"])[-1]
        return set() if host.startswith("127.") or host in ("localhost", "::1") else set(aliases)
    listened: set[str] = set()
    for host_name in names:
        aliased = {network for network, given in aliases.items() if host_name in given}
        # A service's (or container's) own name resolves on each of its networks.
        if host_name in services or host_name == service.get("container_name") or not aliased:
            return set(aliases)
        listened |= aliased
    return listened


def test_job_code_cannot_read_other_projects_jobs_from_the_status_api(
    tmp_path, job_root, sqlite_factory, clock
):
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    job_networks = set().union(*(_networks(services[name]) for name in RUNS_JOB_CODE))
    api = services["api"]
    reachable_on = _listens_on(services, "api") & job_networks

    # What a caller without the key reads there (API_SECRET set, as compose asks).
    world = one_net_world(
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        API_SECRET="a-strong-api-secret-0123456789",
    )
    world.enqueue("project-b/model-7/run-3", net="net-a", metadata={"project_id": "project-b"})
    answer = TestClient(create_app(world.rt)).get("/jobs", params={"limit": 1000})
    other_projects_readable = answer.status_code == 200 and any(
        job.get("metadata", {}).get("project_id") == "project-b" for job in answer.json()["jobs"]
    )

    assert other_projects_readable  # by design: reads are open, so where it listens matters
    assert not reachable_on, (
        f"api listens on {sorted(reachable_on)} with the submitted job code, and answers "
        "GET /jobs without a key with every project's jobs"
    )
    # It still joins them for its outbound calls, and listens where its published port
    # arrives: the default network, the only one with a gateway.
    assert _networks(api) & job_networks
    assert _listens_on(services, "api") == {"default"}
