"""One Settings: the PER_JOB_FL_SERVER matrix, nets validated in full, redaction."""

from __future__ import annotations

import json

import pytest

from app.errors import SettingsError
from app.flags import parse_flag
from app.settings import Settings, load_settings
from tests.fixtures.db import make_server_kit, net_decl

TRUE_VALUES = ["true", "TRUE", "True", " true ", "1", "yes", "YES", "on", "On", "\ttrue\n"]
FALSE_VALUES = ["false", "FALSE", "0", "no", "No", "off", "OFF", "  off  "]
INVALID_VALUES = ["maybe", "2", "y", "n", "t", "truee", "enabled", "-1", "true false"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for var in ("PER_JOB_FL_SERVER", "NETS", "NETS_FILE", "DATABASE_URL", "BROKER_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "data"))


@pytest.mark.parametrize("raw", TRUE_VALUES)
def test_flag_true(raw, monkeypatch):
    monkeypatch.setenv("PER_JOB_FL_SERVER", raw)
    assert load_settings().per_job_fl_server is True


@pytest.mark.parametrize("raw", FALSE_VALUES)
def test_flag_false(raw, monkeypatch):
    monkeypatch.setenv("PER_JOB_FL_SERVER", raw)
    assert load_settings().per_job_fl_server is False


@pytest.mark.parametrize("raw", ["", "   "])
def test_flag_empty_means_default(raw, monkeypatch):
    # A Makefile `export PER_JOB_FL_SERVER=` of a commented-out value yields exactly this.
    monkeypatch.setenv("PER_JOB_FL_SERVER", raw)
    assert load_settings().per_job_fl_server is False


def test_flag_unset_means_default():
    assert load_settings().per_job_fl_server is False


@pytest.mark.parametrize("raw", INVALID_VALUES)
def test_flag_invalid_stops_with_a_clear_message(raw, monkeypatch):
    monkeypatch.setenv("PER_JOB_FL_SERVER", raw)
    with pytest.raises(SettingsError) as exc:
        load_settings()
    message = str(exc.value)
    assert "PER_JOB_FL_SERVER" in message
    assert "true/false, 1/0, yes/no, on/off" in message


def test_parse_flag_is_the_one_parser_for_every_flag():
    assert parse_flag("X", " YeS ", default=False) is True
    assert parse_flag("X", "", default=True) is True
    with pytest.raises(SettingsError, match="X="):
        parse_flag("X", "nope", default=True)


def test_two_nets_fully_configured(tmp_path, monkeypatch):
    nets = [net_decl(tmp_path, "net-a", "ecs"), net_decl(tmp_path, "net-b", "local")]
    nets[1]["per_job_fl_server"] = "on"
    monkeypatch.setenv("NETS", json.dumps(nets))
    settings = load_settings()
    assert [n.name for n in settings.nets] == ["net-a", "net-b"]
    a, b = settings.nets
    assert a.driver.kind == "ecs" and b.driver.kind == "local"
    assert a.required_sites == b.required_sites == ("site-1", "site-2")
    # Flag off globally: net-a is always-on, net-b's override makes it scale per job.
    assert a.always_on is True
    assert b.always_on is False


@pytest.mark.parametrize(
    ("field", "mutate", "needle"),
    [
        ("driver.ecs.cluster", lambda n: n["driver"].pop("cluster"), "driver.ecs.cluster"),
        ("admin", lambda n: n.pop("admin"), "'admin'"),
        ("admin.username", lambda n: n["admin"].pop("username"), "admin.username"),
        ("admin.kit_dir", lambda n: n["admin"].update(kit_dir="/nonexistent"), "admin.kit_dir"),
        ("driver.kind", lambda n: n["driver"].update(kind="k8s"), "driver"),
        ("ready_timeout_s", lambda n: n.update(ready_timeout_s=-1), "ready_timeout_s"),
        ("unknown", lambda n: n.update(idle_timout_s=5), "idle_timout_s"),
    ],
)
def test_a_net_missing_a_field_is_named(field, mutate, needle, tmp_path, monkeypatch):
    good = net_decl(tmp_path, "net-a", "ecs")
    bad = net_decl(tmp_path, "net-b", "ecs")
    mutate(bad)
    monkeypatch.setenv("NETS", json.dumps([good, bad]))
    with pytest.raises(SettingsError) as exc:
        load_settings()
    assert "net 'net-b'" in str(exc.value)
    assert needle in str(exc.value)


def test_nets_file_toml(tmp_path, monkeypatch):
    decl = net_decl(tmp_path, "net-a", "ecs")
    path = tmp_path / "nets.toml"
    path.write_text(
        f"""
[[nets]]
name = "net-a"
idle_timeout_s = 30
required_sites = ["site-1"]
[nets.driver]
kind = "ecs"
region = "eu-west-2"
cluster = "flip"
service = "fl-server-a"
[nets.admin]
kit_dir = "{decl["admin"]["kit_dir"]}"
username = "admin@flip"
"""
    )
    monkeypatch.setenv("NETS_FILE", str(path))
    settings = load_settings()
    assert settings.net("net-a").idle_timeout_s == 30


def test_duplicate_net_names_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("NETS", json.dumps([net_decl(tmp_path, "a"), net_decl(tmp_path, "a")]))
    with pytest.raises(SettingsError, match="unique"):
        load_settings()


def test_embedded_defaults_need_no_server(tmp_path):
    settings = load_settings()
    assert settings.database_url == f"sqlite:///{tmp_path / 'data' / 'fl-dispatcher.db'}"
    assert settings.broker_url.startswith("sqla+sqlite:///")


def test_redacted_hides_passwords_and_secrets(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://fl:hunter2@db:5432/fl")
    monkeypatch.setenv("BROKER_URL", "redis://:s3cret@redis:6379/0")
    monkeypatch.setenv("API_SECRET", "topsecret-api-key-0123")
    text = json.dumps(load_settings().redacted())
    for secret in ("hunter2", "s3cret", "topsecret-api-key-0123"):
        assert secret not in text
    assert "fl:***@db" in text


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "postgresql+psycopg"])
def test_a_postgresql_url_of_any_usual_form_means_psycopg(tmp_path, scheme):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path, DATABASE_URL=f"{scheme}://fl:pw@db.example:5432/fl"
    )
    assert settings.database_url == "postgresql+psycopg://fl:pw@db.example:5432/fl"


def test_a_postgresql_driver_that_is_not_installed_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SettingsError) as refused:
        Settings(FL_DISPATCHER_DATA_DIR=tmp_path, DATABASE_URL="postgresql+psycopg2://fl:pw@h/fl")
    assert "driver 'psycopg2' is not installed; use postgresql+psycopg://" in str(refused.value)
    assert "pw" not in str(refused.value)


def _docker(container: str, engine_url: str = "unix:///var/run/docker.sock") -> dict[str, str]:
    return {"kind": "docker", "container": container, "engine_url": engine_url}


@pytest.mark.parametrize(
    ("driver_a", "driver_b", "field"),
    [
        (_docker("fl-server"), _docker("fl-server"), "driver.container"),
        (
            {"kind": "ecs", "region": "eu-west-2", "cluster": "flip", "service": "fl"},
            {
                "kind": "ecs",
                "region": "eu-west-2",
                "cluster": "arn:aws:ecs:eu-west-2:123456789012:cluster/flip",
                "service": "arn:aws:ecs:eu-west-2:123456789012:service/flip/fl",
            },
            "driver.cluster+service",
        ),
        (
            {"kind": "local", "server_kit_dir": "KIT"},
            {"kind": "local", "server_kit_dir": "KIT/."},
            "driver.server_kit_dir",
        ),
    ],
)
def test_two_nets_naming_one_server_are_refused(driver_a, driver_b, field, tmp_path, monkeypatch):
    """Two nets driving one server: one net's idle scale-down would stop the server the
    other's RUNNING job lives on. The settings name both nets and the field they share."""
    kit = make_server_kit(tmp_path / "shared" / "server")
    a, b = net_decl(tmp_path, "net-a"), net_decl(tmp_path, "net-b")
    for net, driver in ((a, driver_a), (b, driver_b)):
        net["driver"] = {
            k: (v.replace("KIT", str(kit)) if k == "server_kit_dir" else v)
            for k, v in driver.items()
        }
    monkeypatch.setenv("NETS", json.dumps([a, b]))
    with pytest.raises(SettingsError) as exc:
        load_settings()
    assert "'net-a'" in str(exc.value) and "'net-b'" in str(exc.value)
    assert field in str(exc.value)


@pytest.mark.parametrize("engine_b", ["http://docker-proxy:2375", "tcp://Docker-Proxy:2375"])
def test_two_nets_naming_one_container_through_two_spellings_of_its_engine_are_refused(
    engine_b, tmp_path, monkeypatch
):
    """The Docker SDK reads tcp:// as http:// and a host name is case-insensitive, so both
    nets start and stop the one fl-server container (one's idle scale-down under the other's
    job), as if they named the same engine_url."""
    a = net_decl(tmp_path, "net-a", driver=_docker("fl-server", "tcp://docker-proxy:2375"))
    b = net_decl(tmp_path, "net-b", driver=_docker("fl-server", engine_b))
    monkeypatch.setenv("NETS", json.dumps([a, b]))
    with pytest.raises(SettingsError, match=r"'net-a' and 'net-b'.*driver.container"):
        load_settings()


def test_two_nets_declaring_one_server_endpoint_are_refused(tmp_path, monkeypatch):
    """Static nets have no driver to tell them apart: the address they declare is the server."""
    a = net_decl(tmp_path, "net-a", server_endpoint="fl.example.org:8002")
    b = net_decl(tmp_path, "net-b", server_endpoint="FL.example.org:8002")
    monkeypatch.setenv("NETS", json.dumps([a, b]))
    with pytest.raises(SettingsError, match=r"'net-a' and 'net-b'.*server_endpoint"):
        load_settings()


@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_server_endpoint_on_a_port_no_server_can_listen_on_is_refused(
    port, tmp_path, monkeypatch
):
    """Its kit problem would never be found (the kit cannot name that port either), and
    the net would wait out its readiness deadline on every job."""
    net = net_decl(tmp_path, "net-a", server_endpoint=f"fl.example.org:{port}")
    monkeypatch.setenv("NETS", json.dumps([net]))
    with pytest.raises(SettingsError, match=r"'net-a'.*server_endpoint.*port from 1 to 65535"):
        load_settings()


def test_nets_on_distinct_servers_are_accepted(tmp_path, monkeypatch):
    """Same container name on two engines, same service name in two clusters: two servers."""
    nets = [
        net_decl(tmp_path, "d1", driver=_docker("fl-server", "tcp://host-1:2375")),
        net_decl(tmp_path, "d2", driver=_docker("fl-server", "tcp://host-2:2375")),
        net_decl(tmp_path, "e1", "ecs"),
        net_decl(tmp_path, "e2", "ecs"),
        net_decl(tmp_path, "l1", "local"),
        net_decl(tmp_path, "l2", "local"),
        net_decl(tmp_path, "s1"),
        net_decl(tmp_path, "s2"),
    ]
    nets[3]["driver"] = {**nets[2]["driver"], "cluster": "other"}
    monkeypatch.setenv("NETS", json.dumps(nets))
    assert len(load_settings().nets) == 8


@pytest.mark.parametrize("secret", ["clé-secrète-0123456789", "tab\tinside", " padded "])
def test_an_api_secret_no_header_can_carry_is_refused_at_start(secret):
    """X-API-Key carries printable ASCII only (a server reads other bytes as Latin-1 and
    trims the ends), so such an API_SECRET could never match: every POST would be 401."""
    with pytest.raises(SettingsError, match="API_SECRET must be printable ASCII") as refused:
        load_settings(API_SECRET=secret)
    assert secret.strip() not in str(refused.value)
    assert load_settings(API_SECRET="s3cret-with inner space~!").api_secret


def test_the_awaited_runs_poll_is_still_read_under_its_old_name_with_a_warning(monkeypatch, caplog):
    """QUEUED_POLL_S became AWAITED_POLL_S (it polls the runs a QUEUED job awaits): the old
    name is read, with a warning, until 0.4.0; where both are set the new one wins."""
    monkeypatch.delenv("AWAITED_POLL_S", raising=False)
    monkeypatch.setenv("QUEUED_POLL_S", "2.5")
    with caplog.at_level("WARNING", logger="app.settings"):
        assert Settings().awaited_poll_s == 2.5
    assert "QUEUED_POLL_S is deprecated: set AWAITED_POLL_S" in caplog.text
    monkeypatch.setenv("AWAITED_POLL_S", "0.5")
    assert Settings().awaited_poll_s == 0.5
    monkeypatch.delenv("QUEUED_POLL_S")
    caplog.clear()
    with caplog.at_level("WARNING", logger="app.settings"):
        assert Settings().awaited_poll_s == 0.5
    assert "deprecated" not in caplog.text
