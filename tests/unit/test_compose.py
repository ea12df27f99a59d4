"""compose.yml runs what the code can run: real subcommands, authenticated Celery Flower, one
beat."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from app import names
from app.entrypoints.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yml"
APP_IMAGE = "fl-dispatcher:local"
ONE_SHOT = {"migrate"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def argv(command: object) -> list[str]:
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list), command
    return [str(part) for part in command]


def assert_cli_accepts(args: list[str]) -> None:
    """argparse exits (SystemExit) on an unknown subcommand or option."""
    assert args[0] == "fl-dispatcher", args
    try:
        build_parser().parse_args(args[1:])
    except SystemExit as exc:
        pytest.fail(f"`{shlex.join(args)}` is not a valid fl-dispatcher command ({exc})")


def test_parses_and_has_the_stack(services):
    assert set(services) == {
        "redis",
        "postgres",
        "migrate",
        "worker",
        "housekeeper",
        "beat",
        "flower",
        "api",
    }


def consumed_queues(service: dict) -> list[str]:
    """The queues a `fl-dispatcher worker` service consumes (no -Q: all of them)."""
    args = build_parser().parse_args(argv(service["command"])[1:])
    return list(args.queues) or list(names.QUEUES)


def test_every_queue_has_a_worker_and_beat_s_has_one_of_its_own(services):
    workers = {
        name: consumed_queues(s)
        for name, s in services.items()
        if "command" in s and argv(s["command"])[:2] == ["fl-dispatcher", "worker"]
    }
    assert {q for queues in workers.values() for q in queues} == set(names.QUEUES), workers
    # No backlog of requests or chains can delay housekeeping (README "Queues").
    assert workers["housekeeper"] == [names.HOUSEKEEPING_QUEUE], workers
    assert all(
        names.HOUSEKEEPING_QUEUE not in queues
        for name, queues in workers.items()
        if name != "housekeeper"
    ), workers


def test_every_app_command_is_a_real_subcommand_or_flower(services):
    for name, service in services.items():
        if service.get("image") != APP_IMAGE:
            continue
        args = argv(service["command"])
        if args[0] == "celery":
            assert "flower" in args, f"{name}: the only celery command is Celery Flower"
        else:
            assert_cli_accepts(args)


def test_healthcheck_commands_are_real_too(services):
    checked = []
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test") or []
        if test and test[0] == "CMD" and test[1] == "fl-dispatcher":
            assert_cli_accepts(test[1:])
            checked.append(name)
    assert checked, "no service's healthcheck runs an fl-dispatcher command any more"


def test_the_expected_subcommands_run(services):
    commands = {name: argv(s["command"])[:3] for name, s in services.items() if "command" in s}
    assert commands["migrate"] == ["fl-dispatcher", "db", "upgrade"]
    assert commands["worker"][:2] == ["fl-dispatcher", "worker"]
    assert commands["beat"][:2] == ["fl-dispatcher", "beat"]
    assert argv(services["api"]["command"])[:4] == ["fl-dispatcher", "api", "--host", "0.0.0.0"]


def test_a_bad_subcommand_would_be_caught():
    with pytest.raises(pytest.fail.Exception):
        assert_cli_accepts(["fl-dispatcher", "wroker"])


def test_flower_requires_basic_auth_from_the_environment(services):
    flower = argv(services["flower"]["command"])
    assert flower[0] == "celery"
    auth = [a for a in flower if a.startswith("--basic-auth=")]
    # `${VAR:?msg}`: compose refuses to run when VAR is unset or empty.
    assert len(auth) == 1
    assert re.fullmatch(r"--basic-auth=\$\{FLOWER_BASIC_AUTH:\?[^}]+\}", auth[0]), auth
    text = COMPOSE.read_text()
    # No default that would let it start without a password, no unauthenticated switches.
    assert not re.search(r"\$\{FLOWER_BASIC_AUTH(:?-|-)", text)
    assert not any("unauthenticated" in a for a in flower)
    assert "FLOWER_UNAUTHENTICATED_API" not in text
    assert "environment" not in services["flower"]  # nothing there could override the flag


def test_every_long_running_service_has_a_healthcheck_and_restart_policy(services):
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service["restart"] == "no"
            continue
        health = service.get("healthcheck")
        assert health and not health.get("disable") and health.get("test"), name
        assert service.get("restart") in {"unless-stopped", "always", "on-failure"}, name


def test_app_services_wait_for_migrations_and_dependencies(services):
    for name in ("worker", "housekeeper", "beat", "api"):
        deps = services[name]["depends_on"]
        assert deps["migrate"] == {"condition": "service_completed_successfully"}, name
        assert deps["redis"] == {"condition": "service_healthy"}, name
    assert services["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert services["flower"]["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_exactly_one_beat(services):
    beats = [
        name
        for name, s in services.items()
        if "command" in s
        and (argv(s["command"])[:2] == ["fl-dispatcher", "beat"] or "--beat" in argv(s["command"]))
    ]
    assert beats == ["beat"]
    assert services["beat"]["deploy"]["replicas"] == 1


def test_nets_come_from_a_mounted_nets_file(services):
    for name in ("migrate", "worker", "housekeeper", "beat", "api"):
        env = services[name]["environment"]
        mounts = services[name]["volumes"]
        target = env["NETS_FILE"]
        assert any(m.endswith(f":{target}:ro") for m in mounts), name
        assert any("${NETS_FILE:?" in m for m in mounts), name


def test_image_is_built_inline_from_existing_paths(compose, services):
    build = services["api"]["build"]
    assert build["context"] == "."
    dockerfile = build["dockerfile_inline"]
    assert dockerfile.startswith("FROM python:3.11-slim")
    # The image installs the versions the tests ran with.
    assert "pip install -c .ci/constraints.txt ." in dockerfile
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"COPY source {source} is missing"
    assert not (ROOT / "Dockerfile").exists()


def test_secrets_have_no_defaults_in_the_file():
    text = COMPOSE.read_text()
    assert re.search(r"\$\{POSTGRES_PASSWORD:\?", text)
    assert not re.search(r"\$\{POSTGRES_PASSWORD:?-", text)
