"""compose.yml runs what the code can run: real subcommands, authenticated Celery Flower, one
beat, real setting names. (tests/containers/test_compose_stack.py runs it for real.)"""

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
# Started and stopped by the docker scale driver, never by the engine's restart policy.
SCALED = {"fl-server", "superlink"}
CORE = {"redis", "postgres", "migrate", "worker", "housekeeper", "beat", "flower", "api"}
# The dispatcher's services that use the scale driver: the only ones that may reach the
# Engine API proxy (the `net` profile's containers run submitted job code).
DRIVES_THE_ENGINE = {"worker", "housekeeper", "api"}


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
    core = {name for name, service in services.items() if not service.get("profiles")}
    assert core == CORE
    profiled = {name: s["profiles"] for name, s in services.items() if s.get("profiles")}
    assert profiled == {
        "docker-proxy": ["docker"],
        "fl-server": ["net"],
        "site-1": ["net"],
        "site-2": ["net"],
        "superlink": ["flower-net"],
        "supernode-1": ["flower-net"],
        "supernode-2": ["flower-net"],
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
    # No backlog of requests or chains can delay housekeeping (app/usecases/README.md "Queues").
    assert workers["housekeeper"] == [names.HOUSEKEEPING_QUEUE], workers
    assert all(
        names.HOUSEKEEPING_QUEUE not in queues
        for name, queues in workers.items()
        if name != "housekeeper"
    ), workers


def test_every_app_command_is_a_real_subcommand_or_flower(services):
    for name, service in services.items():
        if APP_IMAGE not in str(service.get("image")):
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
    # Its default-network address only (review b: test_compose_job_code_reads_the_api.py).
    api = argv(services["api"]["command"])
    assert api[:4] == ["fl-dispatcher", "api", "--host-of", "api-listener"]


def test_the_api_s_healthcheck_asks_the_address_it_listens_on(services):
    """It listens on its `api-listener` address only: nothing answers on its 127.0.0.1."""
    api = services["api"]
    assert api["networks"]["default"]["aliases"] == ["api-listener"]
    check = " ".join(api["healthcheck"]["test"])
    assert "http://api-listener:8080/healthz" in check and "127.0.0.1" not in check


def test_a_bad_subcommand_would_be_caught():
    with pytest.raises(pytest.fail.Exception):
        assert_cli_accepts(["fl-dispatcher", "wroker"])


def test_flower_requires_basic_auth_from_the_environment(services):
    flower = services["flower"]
    assert argv(flower["command"]) == ["celery", "flower", "--port=5555"]
    # `${VAR:?msg}`: compose refuses to run when VAR is unset or empty. Flower reads
    # FLOWER_BASIC_AUTH itself; on the command line `ps` would show it to anyone.
    auth = flower["environment"]["FLOWER_BASIC_AUTH"]
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]+\}", auth), auth
    assert flower["environment"]["CELERY_BROKER_URL"].startswith("${BROKER_URL")
    assert set(flower["environment"]) == {"FLOWER_BASIC_AUTH", "CELERY_BROKER_URL"}
    text = COMPOSE.read_text()
    # No default that would let it start without a password, no unauthenticated switches.
    assert not re.search(r"\$\{FLOWER_BASIC_AUTH(:?-|-)", text)
    assert "FLOWER_UNAUTHENTICATED_API" not in text
    assert not any("unauthenticated" in a for a in argv(flower["command"]))


def test_no_secret_on_a_command_line(services):
    for name, service in services.items():
        command = " ".join(argv(service.get("command", [])))
        for secret in ("FLOWER_BASIC_AUTH", "POSTGRES_PASSWORD", "BROKER_URL", "API_SECRET"):
            assert secret not in command, (name, secret)


def test_every_long_running_service_has_a_healthcheck_and_restart_policy(services):
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service["restart"] == "no"
            continue
        health = service.get("healthcheck")
        assert health and not health.get("disable") and health.get("test"), name
        if name in SCALED:
            assert service["restart"] == "no", name
            continue
        health = service.get("healthcheck")
        assert health and not health.get("disable") and health.get("test"), name
        assert service.get("restart") in {"unless-stopped", "always", "on-failure"}, name


def test_app_services_wait_for_migrations_and_dependencies(services):
    # podman ignores the conditions: every process also retries its dependencies itself.
    assert argv(services["migrate"]["command"])[-2:] == ["--wait", "300"]
    for name in ("worker", "housekeeper", "beat", "api"):
        args = argv(services[name]["command"])
        assert args[args.index("--wait") + 1] == "300", name
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


def test_beats_health_is_its_heartbeat(services):
    test = services["beat"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "fl-dispatcher", "ready"]
    assert "--beat-ticked-within" in test
    # Its data folder (where the heartbeat is) is the beat's own volume.
    assert any(m.endswith(":/var/lib/fl-dispatcher") for m in services["beat"]["volumes"])


def test_every_passed_through_variable_is_a_real_setting(compose):
    from app.settings import Settings

    aliases = {field.alias for field in Settings.model_fields.values()}
    environment = compose["x-app-environment"]
    unknown = [name for name in environment if name not in aliases and not name.startswith("AWS_")]
    assert not unknown, unknown
    flip = {
        "CALLBACK_URL", "CALLBACK_SECRET", "RELEASE_AFTER", "REPORT_TIMEOUT_S", "MAX_ATTEMPTS",
        "S3_ENDPOINT_URL", "S3_EXCLUDED_PREFIXES", "S3_MAX_BUNDLE_BYTES", "S3_MAX_BUNDLE_FILES",
    }  # fmt: skip
    # Passed through (a bare name): unset in the environment, unset in the container.
    assert {name: environment[name] for name in flip} == dict.fromkeys(flip)


def test_other_settings_come_from_an_optional_env_file(services):
    for name in ("migrate", "worker", "beat", "api"):
        [env_file] = services[name]["env_file"]
        assert env_file["required"] is False
        assert env_file["path"].startswith("${DISPATCHER_ENV_FILE:-")


def test_compose_s_host_path_of_the_settings_file_is_not_the_one_every_process_reads():
    """FL_DISPATCHER_ENV_FILE names the settings file of every fl-dispatcher process: had
    compose read it as its env_file's host path, exporting it for compose would have made
    every command run on the host read that file (a relative path: from another directory,
    no file at all)."""
    from app.settings import ENV_FILE_VARIABLE

    assert f"${{{ENV_FILE_VARIABLE}" not in COMPOSE.read_text()


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
    # The image installs the versions the tests ran with: the dependencies, then the project.
    assert "pip install -c .ci/constraints.txt uv" in dockerfile  # uv at its pinned version
    assert "-c .ci/constraints.txt -r /tmp/dependencies.txt" in dockerfile
    # By path: asked for `python3` by name, uv takes only a virtual environment's interpreter
    # and refuses the official image's system python (the stand-in's is a venv's). `$$` is
    # compose's escape: the shell sees `$(command -v python3)`.
    assert 'uv pip install --no-cache --python "$$(command -v python3)"' in dockerfile
    assert "pip install --no-deps -c .ci/constraints.txt ." in dockerfile
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"COPY source {source} is missing"
    assert not (ROOT / "Dockerfile").exists()


def test_the_flower_image_installs_the_hash_locked_flwr_and_nothing_at_run_time(services):
    dockerfile = services["superlink"]["build"]["dockerfile_inline"]
    # by uv, pinned as the service image's, with every file checked against its hash
    assert 'uv pip install --no-cache --python "$$(command -v python3)"' in dockerfile
    assert "--no-deps --require-hashes -r /tmp/flower.lock" in dockerfile
    assert "pip install -c /tmp/constraints.txt uv" in dockerfile
    assert "COPY .ci/flower.lock /tmp/flower.lock" in dockerfile
    assert (ROOT / ".ci" / "flower.lock").is_file()
    assert "USER fl" in dockerfile  # as the app image's: not root
    for name in ("superlink", "supernode-1", "supernode-2"):
        assert services[name]["image"] != APP_IMAGE, name  # flwr clashes with its pins
    assert "--disable-runtime-dependency-installation" in services["superlink"]["command"]
    assert "--enable-supernode-auth" in services["superlink"]["command"]


def test_secrets_have_no_defaults_in_the_file():
    text = COMPOSE.read_text()
    assert re.search(r"\$\{POSTGRES_PASSWORD:\?", text)
    assert not re.search(r"\$\{POSTGRES_PASSWORD:?-", text)


def networks_of(service: dict) -> set[str]:
    """The networks a service joins (none named: the project's default one); compose takes a
    list of names or a mapping keyed by them."""
    return set(service.get("networks") or ["default"])


def test_only_the_dispatchers_driving_services_share_the_docker_proxys_network(compose, services):
    proxy_networks = networks_of(services["docker-proxy"])
    assert "default" not in proxy_networks, proxy_networks
    for network in proxy_networks:
        # podman routes between non-internal bridge networks: only internal keeps others out.
        assert (compose.get("networks") or {}).get(network, {}).get("internal") is True, network
        on_it = {name for name, s in services.items() if network in networks_of(s)}
        assert on_it == DRIVES_THE_ENGINE | {"docker-proxy"}, (network, on_it)
    # The driving services still reach the rest of the stack.
    assert all("default" in networks_of(services[name]) for name in DRIVES_THE_ENGINE)


# The `net` profile's containers: they run the NVFLARE jobs flip-api's users submit; the
# `flower-net` profile's run the Flower ones (ServerApps, ClientApps).
RUNS_JOB_CODE = {"fl-server", "site-1", "site-2", "superlink", "supernode-1", "supernode-2"}
# The dispatcher's services that talk to the fl-server's admin port: the worker (submit,
# abort), the housekeeper (monitor) and the api (/fl/status asks the server for its sites).
ADMINISTERS_THE_SERVER = {"worker", "housekeeper", "api"}


def test_job_code_shares_a_network_only_with_the_fl_server_s_admin_clients(compose, services):
    for name in RUNS_JOB_CODE:
        networks = networks_of(services[name])
        # The default network is where Redis (no password) and PostgreSQL are.
        assert "default" not in networks, (name, networks)
        for network in networks:
            # podman routes between non-internal bridge networks: only internal keeps the
            # default network's addresses out of reach.
            assert (compose.get("networks") or {}).get(network, {}).get("internal") is True, (
                name,
                network,
            )
            on_it = {other for other, s in services.items() if network in networks_of(s)}
            assert on_it <= RUNS_JOB_CODE | ADMINISTERS_THE_SERVER, (network, on_it)
    # The sites dial the fl-server, and its admin clients reach it too.
    [server_network] = networks_of(services["fl-server"])
    for name in RUNS_JOB_CODE | ADMINISTERS_THE_SERVER:
        assert server_network in networks_of(services[name]), name
    # Nothing that holds the job store, the broker, their dashboards or the Engine API.
    for name in ("redis", "postgres", "flower", "docker-proxy", "beat", "migrate"):
        assert not networks_of(services[name]) & {
            n for job in RUNS_JOB_CODE for n in networks_of(services[job])
        }, name
