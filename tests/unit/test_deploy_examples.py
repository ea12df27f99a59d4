"""The deployment guide's example files are tested as written (issue 41: the README's nets
file named kits at /kits/... where compose mounts them at /etc/fl-dispatcher/kits, and a net
copied from it was MISCONFIGURED). Each nets file loads, field for field as at start; every
path it names is one compose.yml mounts; the env files name only what compose.yml reads and
`Settings` takes; the FLIP override keeps each service's networks; the ECS container
definitions are what ECS takes and match the nets entry."""

from __future__ import annotations

import json
import re
import string
import tomllib
from pathlib import Path
from typing import Any

import botocore.session
import pytest
import yaml
from botocore.validate import ParamValidator

from app.entrypoints.cli import build_parser
from app.local.local_net import net_entry
from app.local.settings_folder import nets_toml
from app.net_config import parse_nets
from app.settings import Settings
from tests.fixtures.db import make_admin_kit, make_server_kit
from tests.fixtures.flower import make_tls

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "app" / "deploy"
EXAMPLES = DEPLOY / "examples"
COMPOSE_NETS = ["nets.ecs.toml", "nets.docker.toml", "nets.static.toml"]
ALIASES = {f.alias for f in Settings.model_fields.values() if f.alias}
VOLUME = re.compile(r"^\$\{(?P<var>\w+)[^}]*\}:(?P<target>.+?)(?::(?:ro|rw))?$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yml").read_text())


@pytest.fixture(scope="module")
def dispatcher(compose) -> dict[str, dict[str, Any]]:
    """The services that read the nets: every one whose environment names NETS_FILE."""
    return {n: s for n, s in compose["services"].items() if "NETS_FILE" in s.get("environment", {})}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's bind mounts from a variable's host path: variable -> path inside."""
    found = {}
    for volume in service.get("volumes", []):
        match = VOLUME.match(volume)
        if match:
            found[match["var"]] = match["target"]
    return found


def dotenv_values(path: Path) -> dict[str, str]:
    """NAME=value lines (the examples quote nothing), comments and blank lines skipped."""
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def default_of(expression: str) -> str:
    """`${NAME:-default}` parts of a compose value, each replaced by its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", expression)


def paths_in(value: object) -> list[str]:
    """Every absolute path a nets entry names, wherever it is."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in paths_in(v)]
    if isinstance(value, list):
        return [p for v in value for p in paths_in(v)]
    return [value] if isinstance(value, str) and value.startswith("/") else []


def test_every_dispatcher_service_mounts_the_nets_file_and_kits_where_the_examples_say(
    dispatcher,
):
    assert set(dispatcher) == {"migrate", "worker", "housekeeper", "beat", "api"}
    for name, service in dispatcher.items():
        inside = mounts(service)
        nets_file = default_of(service["environment"]["NETS_FILE"])
        assert nets_file == "/etc/fl-dispatcher/nets.toml", name
        assert default_of(inside["NETS_FILE"]) == nets_file, name
        assert inside["NVFLARE_KITS_DIR"] == "/etc/fl-dispatcher/kits", name
        assert default_of(service["environment"]["JOB_ROOT"]) == inside["JOBS_DIR"], name


@pytest.mark.parametrize("example", COMPOSE_NETS)
def test_each_compose_nets_example_loads_with_every_path_where_compose_mounts_it(
    example, dispatcher, tmp_path
):
    raw = tomllib.loads((EXAMPLES / example).read_text())
    targets = {t for s in dispatcher.values() for t in mounts(s).values()}
    kits = "/etc/fl-dispatcher/kits"
    for net in raw["nets"]:
        for path in paths_in(net):
            assert any(path.startswith(t.rstrip("/") + "/") for t in targets), (example, path)
        # Loaded as the containers would: the kit mount is tmp_path/kits here.
        if net.get("backend") == "flower":  # its SuperLink's CA, where the kits are
            ca = net["flower"]["root_certificates"]
            assert ca.startswith(kits + "/"), ca
            here = tmp_path / "kits" / ca.removeprefix(kits + "/")
            net["flower"]["root_certificates"] = str(make_tls(here.parent).ca)
            continue
        kit = net["admin"]["kit_dir"]
        assert kit.startswith(kits + "/"), kit
        here = tmp_path / "kits" / kit.removeprefix(kits + "/")
        net["admin"]["kit_dir"] = str(make_admin_kit(here))
    nets = parse_nets(raw, example)  # every field validated, as at start
    assert nets and all(n.required_sites for n in nets)


def test_the_docker_example_names_compose_s_fl_server_container_and_proxy(compose):
    net, flower = tomllib.loads((EXAMPLES / "nets.docker.toml").read_text())["nets"]
    services = compose["services"]
    # The Flower net beside it: compose's SuperLink, its port, through the same proxy.
    superlink = services["superlink"]
    assert flower["backend"] == "flower"
    assert flower["driver"]["container"] == default_of(superlink["container_name"])
    assert flower["driver"]["container"].startswith("fl-server-")  # what the proxy lets by
    assert flower["driver"]["engine_url"] == net["driver"]["engine_url"]
    host, port = flower["flower"]["address"].split(":")
    assert (host, f"--port={port}") == ("superlink", superlink["command"][-1])
    for name in ("supernode-1", "supernode-2"):
        assert f"--superlink={host}:{port}" in services[name]["command"]
    assert set(superlink["networks"]) <= set(services["worker"]["networks"])
    assert net["driver"]["container"] == default_of(services["fl-server"]["container_name"])
    proxy_port = services["docker-proxy"]["environment"]["PROXY_BIND"].rsplit(":", 1)[1]
    assert net["driver"]["engine_url"] == f"tcp://docker-proxy:{proxy_port}"
    host = net["server_endpoint"].split(":")[0]
    assert host == "fl-server"  # the service name the sites and the admin clients dial
    for name in ("worker", "housekeeper", "api"):  # the clients: on the server's network
        assert set(services["fl-server"]["networks"]) <= set(services[name]["networks"])
        assert "docker-engine" in services[name]["networks"]


def test_the_local_example_is_what_local_net_writes():
    text = (EXAMPLES / "nets.local.toml").read_text()
    entry = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    folder = Path("/srv/fl-local")
    sites = ["site-1", "site-2"]
    assert entry == nets_toml(
        [net_entry(folder, name="local-net", sites=sites, admin="admin@nvidia.com")]
    )


def test_the_local_example_loads(tmp_path):
    raw = tomllib.loads((EXAMPLES / "nets.local.toml").read_text())
    (net,) = raw["nets"]
    net["driver"]["server_kit_dir"] = str(make_server_kit(tmp_path / "server"))
    net["admin"]["kit_dir"] = str(make_admin_kit(tmp_path / "admin"))
    assert parse_nets(raw, "nets.local.toml")[0].driver.kind == "local"


def test_the_flower_example_loads_with_a_superlink_s_files(tmp_path):
    raw = tomllib.loads((EXAMPLES / "nets.flower.toml").read_text())
    (net,) = raw["nets"]
    tls = make_tls(tmp_path / "tls")
    net["driver"].update(ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    net["flower"]["root_certificates"] = str(tls.ca)
    (loaded,) = parse_nets(raw, "nets.flower.toml")
    assert (loaded.backend, loaded.driver.kind) == ("flower", "local")
    assert loaded.flower is not None and loaded.flower.address.startswith("127.0.0.1:")
    assert loaded.required_sites == ("site-1", "site-2")


def compose_variables(*texts: str) -> set[str]:
    return {name for text in texts for name in re.findall(r"\$\{(\w+)", text)}


def test_compose_env_names_only_what_compose_reads_and_every_variable_it_requires(compose):
    base = (ROOT / "compose.yml").read_text()
    override = (EXAMPLES / "compose.flip.yml").read_text()
    env = dotenv_values(EXAMPLES / "compose.env")
    passed_through = {k for k, v in compose["x-app-environment"].items() if v is None}
    read = compose_variables(base, override) | passed_through
    assert set(env) - read == set(), "names compose.yml does not read"
    required = set(re.findall(r"\$\{(\w+):\?", base))
    assert required <= set(env), "compose refuses to start without these"
    assert all(env[name] for name in required)
    assert env["NETS_FILE"].endswith(".toml")  # NETS_FILE_FORMAT's default
    # What it gives the dispatcher is valid once its public placeholders are replaced (as
    # they are, they are refused at start: test_example_placeholder_secrets_refused.py).
    settings = {
        k: "an-operators-own-secret-0123456789" if str(v).startswith("change-me") else v
        for k, v in env.items()
        if k in ALIASES and k != "NETS_FILE"
    }
    loaded = Settings(**settings)
    assert loaded.callbacks_enabled and loaded.release_after == "reported"


def test_fl_dispatcher_env_names_settings_compose_does_not_set_at_their_defaults(compose):
    env = dotenv_values(EXAMPLES / "fl-dispatcher.env")
    assert env and set(env) <= ALIASES
    assert set(env) & set(compose["x-app-environment"]) == set(), "compose's environment wins"
    loaded = Settings(**env)
    defaults = Settings()
    for name, field in Settings.model_fields.items():
        if field.alias in env:
            assert getattr(loaded, name) == getattr(defaults, name), field.alias


def test_the_flip_override_keeps_each_service_s_networks_and_joins_flip_s(compose):
    override = yaml.safe_load((EXAMPLES / "compose.flip.yml").read_text())
    services = compose["services"]
    uses_the_broker = {
        name
        for name, s in services.items()
        if {"BROKER_URL", "CELERY_BROKER_URL"} & set(s.get("environment", {}))
        and name != "migrate"  # migrate only needs PostgreSQL
    }
    assert set(override["services"]) == uses_the_broker
    for name, service in override["services"].items():
        base = services[name].get("networks", ["default"])
        assert set(base) <= set(service["networks"]), name  # merged or replaced: the same
        assert "flip" in service["networks"], name
    api = override["services"]["api"]
    assert api["networks"]["flip"]["aliases"] == ["fl-dispatcher-api"]
    # The api listens on the addresses its command names only: compose.yml's (the default
    # network's alias, kept in the override as it is there) and FLIP's, never all of them.
    assert api["networks"]["default"] == services["api"]["networks"]["default"]
    base = [str(part) for part in services["api"]["command"]]
    assert [str(part) for part in api["command"]] == [
        *base[:4],
        "--host-of",
        "fl-dispatcher-api",
        *base[4:],
    ]
    assert override["networks"] == {"flip": {"external": True, "name": "${FLIP_NETWORK:-flip}"}}


def test_the_inline_nets_form_in_the_guide_is_the_ecs_example():
    guide = (DEPLOY / "README.md").read_text()
    inline = re.search(r"^export NETS='(.*)'$", guide, re.MULTILINE)
    assert inline is not None
    ecs = tomllib.loads((EXAMPLES / "nets.ecs.toml").read_text())["nets"]
    assert json.loads(inline.group(1)) == ecs


def test_the_readme_s_nets_examples_name_kits_where_compose_mounts_them():
    readme = (ROOT / "README.md").read_text() + (ROOT / "app" / "README.md").read_text()
    kit_dirs = re.findall(r'^kit_dir = "([^"]+)"', readme, re.MULTILINE)
    assert kit_dirs and all(k.startswith("/etc/fl-dispatcher/kits/") for k in kit_dirs)


# --- the ECS fl-server service -----------------------------------------------------------

TERRAFORM = (DEPLOY / "ecs" / "fl-server.tf").read_text()


def tf_default(variable: str) -> str:
    block = re.search(rf'variable "{variable}" \{{(.*?)\n\}}', TERRAFORM, re.DOTALL)
    assert block is not None, variable
    default = re.search(r"default\s*=\s*(\S+)", block.group(1))
    assert default is not None, variable
    return default.group(1)


def containers(**values: object) -> list[dict[str, Any]]:
    """The container definitions as Terraform's templatefile renders them."""
    template = (DEPLOY / "ecs" / "fl-server-containers.json.tftpl").read_text()
    rendered = string.Template(template).substitute(
        {"image": "fl-dispatcher:0.2.0", "server_port": tf_default("server_port")}
        | {"log_group": "/flip/fl-server", "region": "eu-west-2", "net": "net-1"}
        | values
    )
    parsed: list[dict[str, Any]] = json.loads(rendered)
    return parsed


def test_the_ecs_container_definitions_are_what_ecs_takes():
    model = botocore.session.get_session().get_service_model("ecs")
    shape = model.operation_model("RegisterTaskDefinition").input_shape
    request = {
        "family": "fl-server-net-1",
        "requiresCompatibilities": ["FARGATE"],
        "networkMode": "awsvpc",
        "cpu": "1024",
        "memory": "4096",
        "containerDefinitions": containers(),
    }
    report = ParamValidator().validate(request, shape)
    assert not report.has_errors(), report.generate_report()


def test_the_ecs_module_serves_the_nets_example_s_service_and_endpoint(compose):
    (net,) = tomllib.loads((EXAMPLES / "nets.ecs.toml").read_text())["nets"]
    name = net["name"]
    (container,) = containers()
    # The service the driver scales, and the name and port the kits dial.
    assert re.search(r'name\s+= "fl-server-\$\{var\.net\}"', TERRAFORM)
    assert net["driver"]["service"] == f"fl-server-{name}"
    assert re.search(r'name = "fl-server\.\$\{var\.net\}"', TERRAFORM)  # Cloud Map
    host, port = net["server_endpoint"].rsplit(":", 1)
    assert host.startswith(f"fl-server.{name}.")
    assert [p["containerPort"] for p in container["portMappings"]] == [int(port)]
    # The image's own command and user, the kit where the command looks for it.
    args = container["command"]
    assert build_parser().parse_args(args[1:]).command == "participant"
    assert [m["containerPath"] for m in container["mountPoints"]] == [args[-1]]
    assert f"--uid {container['user']} " in compose["x-image"]["build"]["dockerfile_inline"]
    # Created at zero; the dispatcher owns the count afterwards.
    service = re.search(r'resource "aws_ecs_service" "fl_server" \{(.*?)\n\}', TERRAFORM, re.DOTALL)
    assert service is not None
    assert re.search(r"^\s*desired_count\s*=\s*0$", service.group(1), re.MULTILINE)
    assert re.search(r"ignore_changes\s*=\s*\[desired_count\]", service.group(1))
    assert re.search(r"deployment_maximum_percent\s*=\s*100$", service.group(1), re.MULTILINE)
