"""The CLI after the demo (issue 41): a folder's settings file read with --env-file, reading
commands that create nothing, `status` naming nets only the database knows, and `config
check` warning about what is valid but cannot work (no net, a kit it cannot read)."""

from __future__ import annotations

import json
import logging
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app import migrate
from app.db import make_engine, session_factory
from app.entrypoints.cli import main
from app.schemas import EnqueueJob
from app.settings import ENV_FILE_VARIABLE, Settings
from app.usecases import enqueue, services
from models import utcnow
from tests.fixtures.db import net_decl
from tests.unit.test_kit_check import make_kit

SETTINGS_ALIASES = [f.alias for f in Settings.model_fields.values() if f.alias]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """No setting from the test runner's environment; main()'s log handler removed after."""
    for alias in SETTINGS_ALIASES:
        monkeypatch.delenv(alias, raising=False)
    # Empty is unset; set through monkeypatch, the --env-file main() records is undone after.
    monkeypatch.setenv(ENV_FILE_VARIABLE, "")
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "fl-dispatcher"]:
        root.removeHandler(handler)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def good_kit(folder: Path) -> Path:
    now = datetime.now(UTC)
    return make_kit(folder, not_before=now - timedelta(days=1), not_after=now + timedelta(days=30))


@pytest.fixture
def kept(tmp_path, job_root) -> Path:
    """A folder as `demo --keep` leaves one: its settings file, its nets file, a database
    holding its net and a job."""
    folder = tmp_path / "kept"
    net = net_decl(folder, "local-net", "local")
    (folder / "nets.json").write_text(json.dumps({"nets": [net]}))
    (folder / "fl-dispatcher.env").write_text(
        f"# the demo's settings\nFL_DISPATCHER_DATA_DIR={folder / 'data'}\n"
        f"NETS_FILE={folder / 'nets.json'}\nJOB_ROOT={job_root}\nPER_JOB_FL_SERVER=true\n"
    )
    settings = Settings(_env_file=folder / "fl-dispatcher.env")
    migrate.upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    with session_factory(engine).begin() as session:
        services.sync_nets(session, settings, utcnow(), at_start=True)
        request = EnqueueJob(caller_key="demo-1", definition="tiny-job", net="local-net")
        enqueue.enqueue_job(session, settings, request, utcnow())
    engine.dispose()
    return folder


def test_the_folders_settings_file_shows_its_net_and_jobs(capsys, kept, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env_file = str(kept / "fl-dispatcher.env")
    code, out, err = run(capsys, "--env-file", env_file, "status", "--json", "--no-probe")
    assert code == 0, err
    status = json.loads(out)
    assert [(n["name"], n["state"]) for n in status["nets"]] == [("local-net", "STOPPED")]
    assert status["queue"]["queued"] == 1
    code, out, _ = run(capsys, "--env-file", env_file, "jobs", "--json")
    assert [j["caller_key"] for j in json.loads(out)] == ["demo-1"]
    # The environment wins over the file, as compose's env_file is read.
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "elsewhere"))
    code, _, err = run(capsys, "--env-file", env_file, "jobs")
    assert code == 1 and f"no database at {tmp_path / 'elsewhere'}" in err
    # The file is named to every process the command starts (a worker's pool processes
    # build their settings again), and read by them without --env-file.
    assert os.environ[ENV_FILE_VARIABLE] == env_file
    monkeypatch.delenv("FL_DISPATCHER_DATA_DIR")
    code, out, _ = run(capsys, "jobs", "--json")
    assert [j["caller_key"] for j in json.loads(out)] == ["demo-1"]


def test_a_settings_file_that_is_not_there_stops_the_command(capsys, tmp_path):
    code, out, err = run(capsys, "--env-file", str(tmp_path / "nope.env"), "status")
    assert (code, out) == (2, "")
    assert f"settings file {tmp_path / 'nope.env'}: no such file" in err


@pytest.mark.parametrize(
    "argv",
    [["status"], ["status", "--json"], ["jobs"], ["job", str(uuid.uuid4())], ["ready"]],
)
def test_reading_commands_on_no_database_create_nothing_and_say_what_to_do(
    capsys, tmp_path, monkeypatch, argv
):
    """`status` right after the demo used to create ./.fl-dispatcher and then say the
    database had no tables."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert list(tmp_path.iterdir()) == []  # not even the data folder
    where = tmp_path / ".fl-dispatcher" / "fl-dispatcher.db"
    if argv[0] == "ready":
        assert f"database not ready: no such file: {where}" in err
    else:
        assert f"no database at {where}" in err
        assert "fl-dispatcher db upgrade" in err and "--env-file" in err


def test_status_names_the_nets_only_the_database_knows(capsys, kept, tmp_path, monkeypatch):
    """/metrics (read from the tables) showed the demo's net while status, with other
    settings, showed none and said nothing."""
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(kept / "data"))
    monkeypatch.setenv("JOB_ROOT", str(tmp_path))
    code, out, err = run(capsys, "status", "--json", "--no-probe")
    assert code == 0
    assert json.loads(out)["nets"] == []
    assert "no net is declared" in err
    assert "the database also holds net(s) these settings do not declare: local-net" in err
    code, _, err = run(capsys, "--env-file", str(kept / "fl-dispatcher.env"), "status")
    assert code == 0 and "do not declare" not in err and "no net is declared" not in err


def test_config_check_warns_when_no_net_is_declared(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "data"))
    code, out, err = run(capsys, "config", "check")
    assert code == 0
    assert "configuration ok" not in out
    assert "configuration valid, with 1 warning(s) on stderr" in out
    assert "warning: no net is declared (NETS_FILE or NETS)" in err
    code, out, _ = run(capsys, "config", "check", "--json")
    assert [w.split(" (")[0] for w in json.loads(out)["warnings"]] == ["no net is declared"]


def test_config_check_warns_about_a_kit_it_cannot_read_and_is_ok_with_a_good_one(
    capsys, tmp_path, monkeypatch
):
    kit = good_kit(tmp_path / "kit")
    net = {"name": "net-1", "driver": {"kind": "static"}, "required_sites": ["site-1"]}
    net["admin"] = {"kit_dir": str(kit), "username": "admin@nvidia.com"}
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("NETS", json.dumps([net]))
    code, out, err = run(capsys, "config", "check")
    assert (code, err) == (0, "")
    assert out.endswith("configuration ok\n")

    # nvflare writes keys 0600 for whoever provisioned: another user cannot read them.
    (kit / "startup" / "client.key").unlink()
    code, out, err = run(capsys, "config", "check")
    assert code == 0 and "configuration ok" not in out
    assert f"warning: net net-1: admin kit {kit}: client key is missing or unreadable" in err
    assert f"(read as uid {os.getuid()}); the net would be MISCONFIGURED" in err
