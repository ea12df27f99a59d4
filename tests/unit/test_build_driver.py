"""build_driver picks the driver from the net's validated config."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from app.adapters.drivers import build_driver
from app.adapters.drivers.ecs import EcsDriver
from app.adapters.drivers.static import StaticDriver
from app.errors import SettingsError
from app.net_config import NetConfig
from app.settings import Settings, load_settings


@pytest.fixture
def kits(tmp_path: Path) -> Path:
    (tmp_path / "admin" / "startup").mkdir(parents=True)
    (tmp_path / "admin" / "startup" / "fed_admin.json").write_text("{}")
    (tmp_path / "server" / "startup").mkdir(parents=True)
    return tmp_path


def _settings(kits: Path, per_job: str, *drivers: dict[str, Any]) -> Settings:
    nets = [
        {
            "name": f"net-{i}",
            "driver": driver,
            "admin": {"kit_dir": str(kits / "admin"), "username": "admin"},
        }
        for i, driver in enumerate(drivers)
    ]
    return load_settings(
        FL_DISPATCHER_DATA_DIR=str(kits / "data"),
        PER_JOB_FL_SERVER=per_job,
        NETS=json.dumps(nets),
    )


ECS = {"kind": "ecs", "region": "eu-west-2", "cluster": "flip", "service": "fl-server-1"}


def test_ecs_net_gets_an_ecs_driver_for_its_service(kits: Path) -> None:
    settings = _settings(kits, "true", ECS)

    driver = build_driver(settings.nets[0], settings)

    assert isinstance(driver, EcsDriver)
    assert driver.kind == "ecs"
    assert driver.config == settings.nets[0].driver
    assert driver.client.meta.region_name == "eu-west-2"


def test_always_on_ecs_net_still_gets_the_real_driver(kits: Path) -> None:
    settings = _settings(kits, "false", ECS)
    net = settings.nets[0]
    assert net.always_on

    assert isinstance(build_driver(net, settings), EcsDriver)


def test_static_net_gets_a_static_driver(kits: Path) -> None:
    settings = _settings(kits, "true", {"kind": "static"})

    driver = build_driver(settings.nets[0], settings)

    assert isinstance(driver, StaticDriver)
    assert driver.kind == "static"


class _RecordingLocalDriver:
    kind = "local"

    def __init__(self, net_name: str, server_kit_dir: Path, state_dir: Path) -> None:
        self.args = (net_name, server_kit_dir, state_dir)


def test_local_net_gets_its_kit_and_a_state_dir_under_data_dir(
    kits: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stands in for app.adapters.drivers.local so this pins only build_driver's wiring; the real
    # driver is exercised by its own tests against a real NVFLARE server.
    fake_module = types.ModuleType("app.adapters.drivers.local")
    fake_module.LocalDriver = _RecordingLocalDriver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "app.adapters.drivers.local", fake_module)
    settings = _settings(kits, "true", {"kind": "local", "server_kit_dir": str(kits / "server")})
    net: NetConfig = settings.nets[0]

    driver = build_driver(net, settings)

    assert isinstance(driver, _RecordingLocalDriver)
    assert driver.args == ("net-0", kits / "server", kits / "data" / "local-driver")


def test_local_net_builds_the_real_local_driver(kits: Path) -> None:
    from app.adapters.drivers import local

    settings = _settings(kits, "true", {"kind": "local", "server_kit_dir": str(kits / "server")})

    driver = build_driver(settings.nets[0], settings)

    assert isinstance(driver, local.LocalDriver)
    assert driver.kind == "local"


DOCKER = {"kind": "docker", "container": "fl-server-net-1"}


def test_docker_net_gets_a_docker_driver_for_its_container(kits: Path) -> None:
    from app.adapters.drivers.docker import DOCKER_API_VERSION, DockerDriver

    engine = "unix:///run/podman/podman.sock"
    settings = _settings(kits, "true", {**DOCKER, "engine_url": engine, "stop_timeout_s": 5})

    # Building it calls no engine (this socket need not exist): the API version is pinned.
    driver = build_driver(settings.nets[0], settings)

    assert isinstance(driver, DockerDriver)
    assert driver.kind == "docker"
    assert driver.config == settings.nets[0].driver
    assert driver.client.api_version == DOCKER_API_VERSION
    assert driver.target == f"container fl-server-net-1 on {engine}"


def test_docker_driver_defaults_to_the_docker_socket_and_a_30s_stop(kits: Path) -> None:
    settings = _settings(kits, "true", DOCKER)

    config = settings.nets[0].driver

    assert config.model_dump() == {
        "kind": "docker",
        "container": "fl-server-net-1",
        "engine_url": "unix:///var/run/docker.sock",
        "stop_timeout_s": 30,
        "api_timeout_s": 10,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("container", ""),
        ("container", "-leading-dash"),
        ("container", "has/slash"),
        ("engine_url", "/var/run/docker.sock"),
        ("engine_url", "ssh://host"),
        ("stop_timeout_s", -1),
        ("stop_timeout_s", 601),
        ("api_timeout_s", 0),
    ],
)
def test_a_bad_docker_field_stops_the_process_naming_net_and_field(
    kits: Path, field: str, value: object
) -> None:
    with pytest.raises(SettingsError) as raised:
        _settings(kits, "true", {**DOCKER, field: value})

    assert "net 'net-0'" in str(raised.value)
    assert f"driver.docker.{field}" in str(raised.value)


def test_a_docker_net_without_a_container_is_refused(kits: Path) -> None:
    with pytest.raises(SettingsError, match=r"driver\.docker\.container.*Field required"):
        _settings(kits, "true", {"kind": "docker"})
