"""A net's backend is its own setting (issue 38): a Flower net declares its SuperLink's
Control API (`[flower]`) and, with the local driver, the SuperLink's folder and TLS files;
the runtime builds each net's client and driver by backend; `config check` checks a Flower
net's files as it checks an NVFLARE kit."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.adapters.drivers import build_driver
from app.adapters.drivers.local import LocalDriver
from app.adapters.drivers.local_superlink import SuperLinkDriver
from app.adapters.flower.client import FlowerControlClient
from app.adapters.nvflare.client import NvflareAdminClient
from app.entrypoints.cli import main
from app.errors import SettingsError
from app.net_config import parse_nets
from app.runtime import _build_admin
from app.settings import Settings
from tests.fixtures.db import net_decl
from tests.fixtures.flower import make_tls

SETTINGS_ALIASES = [f.alias for f in Settings.model_fields.values() if f.alias]


def fake_venv(folder: Path) -> Path:
    """A folder that looks like FLWR_VENV to the checks (its flower-superlink never runs)."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "flower-superlink").write_text("#!/bin/sh\n")
    return folder


def flower_decl(tmp_path: Path, name: str = "fl-1", port: int = 9093, **extra: Any) -> dict:
    """A local Flower net with TLS files from a test CA (made once per folder)."""
    tls = make_tls(tmp_path / "tls")
    return {
        "name": name,
        "backend": "flower",
        "required_sites": ["site-1", "site-2"],
        "driver": {
            "kind": "local",
            "superlink_dir": str(tmp_path / name / "superlink"),
            "ssl_certfile": str(tls.cert),
            "ssl_keyfile": str(tls.key),
        },
        "flower": {"address": f"127.0.0.1:{port}", "root_certificates": str(tls.ca)},
        **extra,
    }


def test_a_flower_net_loads_beside_an_nvflare_one(tmp_path):
    nvflare, flower = parse_nets(
        [net_decl(tmp_path, "nv-1", "local"), flower_decl(tmp_path)], "NETS"
    )
    assert (nvflare.backend, flower.backend) == ("nvflare", "flower")
    assert flower.flower is not None and flower.flower.address == "127.0.0.1:9093"
    assert flower.admin is None and flower.required_sites == ("site-1", "site-2")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("flower"), "'flower' is missing: a Flower net's SuperLink"),
        (
            lambda d: d.update(admin=net_decl(Path(d["driver"]["superlink_dir"]), "a")["admin"]),
            "a Flower net has [flower]",
        ),
        (lambda d: d.update(server_endpoint="h:1"), "a Flower net's is flower.address"),
        (lambda d: d["flower"].update(insecure=True), "insecure (no TLS) and a CA file"),
        (lambda d: d["flower"].pop("root_certificates"), "a local SuperLink runs with TLS"),
        (lambda d: d["flower"].update(address="h:70000"), "port from 1 to 65535"),
        (lambda d: d["driver"].update(ssl_keyfile="/nowhere/key"), "/nowhere/key is no file"),
    ],
)
def test_a_flower_net_missing_or_mixing_settings_is_refused_naming_the_field(
    tmp_path, change, message
):
    decl = flower_decl(tmp_path)
    change(decl)
    with pytest.raises(SettingsError, match="net 'fl-1'") as caught:
        parse_nets([decl], "NETS")
    assert message in str(caught.value)


def test_an_nvflare_net_with_a_superlink_folder_or_flower_settings_is_refused(tmp_path):
    decl = net_decl(tmp_path, "nv-1", "local")
    decl["driver"] = flower_decl(tmp_path)["driver"]
    with pytest.raises(SettingsError, match="superlink_dir is for a Flower net"):
        parse_nets([decl], "NETS")
    decl = net_decl(tmp_path, "nv-2", flower={"address": "h:1"})
    with pytest.raises(SettingsError, match=r"\[flower\] is for a Flower net"):
        parse_nets([decl], "NETS")
    decl = flower_decl(tmp_path, "fl-2")
    decl["driver"] = net_decl(tmp_path, "nv-3", "local")["driver"]
    with pytest.raises(SettingsError, match="local driver takes superlink_dir"):
        parse_nets([decl], "NETS")


@pytest.mark.parametrize("shared", ["superlink_dir", "address"])
def test_two_flower_nets_naming_one_superlink_are_refused(tmp_path, shared):
    first, second = flower_decl(tmp_path, "fl-1"), flower_decl(tmp_path, "fl-2", port=9094)
    if shared == "address":
        second["flower"]["address"] = first["flower"]["address"]
    else:
        second["driver"]["superlink_dir"] = first["driver"]["superlink_dir"]
    with pytest.raises(SettingsError, match="name the same server"):
        parse_nets([first, second], "NETS")


def test_each_net_gets_the_client_and_driver_of_its_backend(tmp_path):
    settings = Settings(
        NETS=json.dumps([net_decl(tmp_path, "nv-1", "local"), flower_decl(tmp_path)]),
        FLWR_VENV=str(fake_venv(tmp_path / "venv")),
        FL_DISPATCHER_DATA_DIR=str(tmp_path / "data"),
    )
    flower_client = _build_admin(settings.net("fl-1"), settings)
    assert isinstance(flower_client, FlowerControlClient)
    assert flower_client.address == "127.0.0.1:9093" and not flower_client.insecure
    assert isinstance(_build_admin(settings.net("nv-1"), settings), NvflareAdminClient)
    driver = build_driver(settings.net("fl-1"), settings)
    assert isinstance(driver, SuperLinkDriver)
    command = driver.command()
    assert command[0] == str(tmp_path / "venv" / "bin" / "flower-superlink")
    assert "--enable-supernode-auth" in command and "--insecure" not in command
    assert command[command.index("--database") + 1].endswith("fl-1/superlink/state.db")
    assert command[command.index("--port") + 1] == "9093"
    nvflare_driver = build_driver(settings.net("nv-1"), settings)
    assert type(nvflare_driver) is LocalDriver


@pytest.fixture
def flower_env(monkeypatch, tmp_path):
    """The CLI's settings from the environment: one local Flower net."""
    for alias in SETTINGS_ALIASES:
        monkeypatch.delenv(alias, raising=False)
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FLWR_VENV", str(fake_venv(tmp_path / "venv")))
    decl = flower_decl(tmp_path)
    monkeypatch.setenv("NETS", json.dumps([decl]))
    yield decl
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "fl-dispatcher"]:
        root.removeHandler(handler)


def config_check(capsys) -> tuple[int, dict, str]:
    code = main(["config", "check", "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_config_check_passes_a_flower_net_whose_files_fit(capsys, flower_env):
    code, data, err = config_check(capsys)
    assert code == 0, err
    (net,) = data["nets"]
    assert net["backend"] == "flower" and net["kit_problem"] is None
    assert data["warnings"] == []


def test_config_check_fails_a_superlink_certificate_of_another_ca(
    capsys, flower_env, monkeypatch, tmp_path
):
    other = make_tls(tmp_path / "other-ca")
    flower_env["driver"].update(ssl_certfile=str(other.cert), ssl_keyfile=str(other.key))
    monkeypatch.setenv("NETS", json.dumps([flower_env]))
    code, data, _ = config_check(capsys)
    assert code == 2
    assert "is not signed by the CA" in data["nets"][0]["kit_problem"]


def test_config_check_fails_a_superlink_certificate_for_another_host(
    capsys, flower_env, monkeypatch
):
    flower_env["flower"]["address"] = "superlink.example:9093"
    monkeypatch.setenv("NETS", json.dumps([flower_env]))
    code, data, _ = config_check(capsys)
    assert code == 2
    assert "is not for superlink.example" in data["nets"][0]["kit_problem"]


def test_config_check_warns_when_flwr_or_a_file_is_not_usable(
    capsys, flower_env, monkeypatch, tmp_path
):
    monkeypatch.delenv("FLWR_VENV")
    code, data, _ = config_check(capsys)
    assert code == 0
    (warning,) = data["warnings"]
    assert "FLWR_VENV=None holds no bin/flower-superlink" in warning
    monkeypatch.setenv("FLWR_VENV", str(tmp_path / "venv"))
    Path(flower_env["driver"]["ssl_keyfile"]).write_text("not a key")
    _, data, _ = config_check(capsys)
    (warning,) = data["warnings"]
    assert "is no unencrypted PEM key" in warning and "BEGIN" not in warning


def test_a_flower_app_bundle_is_submitted_as_it_is_while_an_nvflare_job_is_prepared(tmp_path):
    from app.adapters.flower.fab import app_files, build_fab
    from app.adapters.jobdefs import prepare
    from tests.fixtures.flower import APP

    settings = Settings(FL_DISPATCHER_DATA_DIR=str(tmp_path / "data"))
    job_id = uuid.uuid4()
    folder = prepare(settings, APP, job_id, ["site-1", "site-2"], None)
    # A checked copy, file for file as it is (what is packed is what was checked).
    assert folder != APP and not (folder / "meta.json").exists()
    assert app_files(folder) == app_files(APP)
    assert all((folder / f).read_bytes() == (APP / f).read_bytes() for f in app_files(APP))
    assert build_fab(folder)  # what the Flower client sends
    nvflare_job = tmp_path / "nv-job"
    (nvflare_job / "app" / "config").mkdir(parents=True)
    prepared = prepare(settings, nvflare_job, job_id, ["site-1"], None)
    assert json.loads((prepared / "meta.json").read_text())["deploy_map"] == {
        "app": ["server", "site-1"]
    }
