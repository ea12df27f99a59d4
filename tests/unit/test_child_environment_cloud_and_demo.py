"""Break-it 22b: a server started on this host still reaches the dispatcher's secrets.

Promises: app/deploy/CHANGELOG.md 0.3.11 "Security (review 22)": "a server the local drivers
start (NVFLARE's server, Flower's SuperLink, and the demo's sites), which runs the code users
submit, gets none of the dispatcher's settings ..., nor the worker's AWS keys";
app/adapters/child_env.py: the worker's settings "and the cloud credentials it scales nets
with, and none of it is theirs to read"; app/adapters/README.md "What a server started on
this host inherits".

Each test starts (or builds the environment of) a process that runs submitted code and
looks for what it can still read. What happened is in each test's docstring.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from app.adapters.child_env import child_environment

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {
    "CALLBACK_SECRET": "callback-secret-5d2a9f10b3",
    "API_SECRET": "api-secret-0e6c4b1f",
    "DATABASE_URL": "postgresql+psycopg://fl:pg-pass-77aa@postgres:5432/fl",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-1f2e",
}


def _wait_for(path: Path, what: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{what} never started"
        time.sleep(0.05)
    time.sleep(0.1)  # written in one go, but let it finish
    return path.read_text()


def test_the_demos_flower_sites_get_none_of_the_operators_secrets(
    tmp_path: Path, monkeypatch
) -> None:
    """`fl-dispatcher demo --backend flower`: its two SuperNodes run the ClientApps of the
    submitted Flower app; the changelog names "the demo's sites" among the servers that get
    none of the dispatcher's settings nor the AWS keys.

    Scenario: an operator with DATABASE_URL, API_SECRET, CALLBACK_SECRET and AWS keys
    exported (the shell they run the CLI from) runs the demo; the SuperNodes are started by
    app.local.flower.LocalSuperNodes (here from a stand-in FLWR_VENV whose flower-supernode
    writes the environment it was given).

    What happened: `flower_env` starts from `dict(os.environ)` (not child_environment), so
    every one of them is in each SuperNode's environment, and its ClientApps'.
    """
    from app.local.flower import LocalSuperNodes

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    program = venv / "bin" / "flower-supernode"
    program.write_text("#!/bin/sh\nenv -0 > environment.bin\n")  # cwd: the site's folder
    program.chmod(0o755)
    nodes = LocalSuperNodes(
        venv, tmp_path / "flower", address="127.0.0.1:1", ca=tmp_path / "ca.pem", sites=["s1"]
    )
    try:
        nodes.start()
        nodes.processes["s1"].wait(timeout=15)
    finally:
        nodes.close()
    dumped = (tmp_path / "flower" / "s1" / "environment.bin").read_text()
    pairs = (item.partition("=") for item in dumped.split("\0") if item)
    environment = {name: value for name, _, value in pairs}

    leaked = sorted(name for name, value in SECRETS.items() if value in environment.values())
    assert not leaked, f"the demo's Flower site (and its ClientApps) was started with {leaked}"


class _CredentialEndpoint:
    """Stands in for the ECS/EKS credential endpoint botocore asks (no network): says which
    URI and token it was asked with, and answers as the endpoint does."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, str]]] = []

    def full_url(self, relative: str) -> str:
        return f"http://169.254.170.2{relative}"

    def retrieve_full_uri(self, uri: str, headers: dict[str, str] | None = None) -> Any:
        self.asked.append((uri, dict(headers or {})))
        return {
            "AccessKeyId": "ASIA-WORKER-ROLE",
            "SecretAccessKey": "worker-role-secret",
            "Token": "worker-role-session",
            "Expiration": "2099-01-01T00:00:00Z",
        }


def test_a_local_server_gets_no_way_to_the_workers_task_role(monkeypatch) -> None:
    """The worker's AWS credentials on ECS or EKS are not keys in its environment but a way
    to fetch them: app/settings.py "Credentials are never settings: boto3's default chain
    (task role, env, profile)". child_env.py strips AWS_ACCESS_KEY_ID, _SECRET_ACCESS_KEY and
    _SESSION_TOKEN only.

    Scenario: a worker on ECS (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, set by the ECS agent)
    or with EKS Pod Identity (AWS_CONTAINER_CREDENTIALS_FULL_URI and the bearer token
    AWS_CONTAINER_AUTHORIZATION_TOKEN) or IRSA (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE)
    starts a server on the local driver; boto3 in the job code resolves its credentials
    from the environment the server was given (botocore's container provider, read here
    with a stand-in for the endpoint).

    What happened: every one of those variables passes child_environment, so the job code's
    boto3 fetches the worker's task role (ECS scale-up and S3 bundle rights), with the
    worker's bearer token.
    """
    from botocore.credentials import ContainerProvider

    role = {
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/5e1f-worker-task",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN": "pod-identity-token-8c1d",
        "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/fl-dispatcher-worker",
        "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/token",
    }
    for name, value in role.items():
        monkeypatch.setenv(name, value)
    server_env = child_environment({"FL_DISPATCHER_LAUNCH_ID": "x"})

    endpoint = _CredentialEndpoint()
    credentials = ContainerProvider(environ=server_env, fetcher=endpoint).load()

    passed = sorted(name for name in role if name in server_env)
    assert credentials is None and not passed, (
        f"the server's environment holds {passed}: its boto3 fetched the worker's role "
        f"from {endpoint.asked}"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # libpq's own password variable: DATABASE_URL without a password (kept out of the
        # URL, its logs and `ps`) and the password here is how psycopg is often given it.
        ("PGPASSWORD", "pg-env-pass-3c9e"),
        # The traces' OTLP exporter's credentials (app/entrypoints/README.md "Traces":
        # OTEL_EXPORTER_OTLP_HEADERS is the dispatcher's to set, e.g. a vendor's API key).
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer otlp-token-77d1"),
    ],
)
def test_a_local_server_gets_no_secret_the_dispatcher_reads_through_its_libraries(
    monkeypatch, name: str, value: str
) -> None:
    """Settings are not all the dispatcher's configuration: psycopg (libpq) reads the
    database password from PGPASSWORD, OpenTelemetry's exporter its credentials from
    OTEL_EXPORTER_OTLP_HEADERS (documented as the traces' settings). child_environment
    strips Settings' names, FL_DISPATCHER_*, CELERY_* and a fixed list only.

    Scenario: a worker so configured starts a server on the local driver.

    What happened: the variable is in the server's environment: the job code gets the
    database password (the job store: forge any job's end) or the tracing backend's key.
    """
    monkeypatch.setenv(name, value)
    assert name not in child_environment({"FL_DISPATCHER_LAUNCH_ID": "x"})
