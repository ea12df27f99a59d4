"""The CLI after the demo (issue 41): a folder's settings file read with --env-file, reading
commands that create nothing, `status` naming nets only the database knows, and `config
check` warning about what is valid but cannot work (no net, a kit it cannot read: not
UTF-8, in a folder this user cannot enter, unreadable), once per net and with exit 0."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app import migrate
from app.db import make_engine, session_factory
from app.entrypoints.cli import main
from app.schemas import EnqueueJob
from app.settings import ENV_FILE_VARIABLE, Settings
from app.usecases import declared_nets, enqueue
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
        declared_nets.sync_nets(session, settings, utcnow(), at_start=True)
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


def static_net(name: str, kit: Path, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "driver": {"kind": "static"},
        "required_sites": ["site-1"],
        "admin": {"kit_dir": str(kit), "username": "admin@nvidia.com"},
        **extra,
    }


def test_config_check_warns_about_every_kit_when_one_kits_config_is_not_utf8(
    tmp_path, capsys, monkeypatch
):
    utf16, keyless = good_kit(tmp_path / "kit-1"), good_kit(tmp_path / "kit-2")
    config = utf16 / "startup" / "fed_admin.json"
    config.write_text(config.read_text(), encoding="utf-16")
    (keyless / "startup" / "client.key").unlink()
    nets = [static_net("net-1", utf16), static_net("net-2", keyless)]
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("NETS", json.dumps(nets))
    code, out, err = run(capsys, "config", "check")
    assert code == 0
    assert "configuration valid, with 2 warning(s)" in out
    assert f"warning: net net-1: admin kit {utf16}: startup/fed_admin.json is not UTF-8" in err
    assert f"warning: net net-2: admin kit {keyless}" in err


NOBODY = 65534
needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="reads the kit as another user: needs root to become uid 65534 and back",
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may enter (pytest's own temporary folder is root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="fld-kits-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """This process reads files as uid/gid 65534 (the workers' other user), then root again."""
    groups = os.getgroups()
    os.setgroups([])
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def _config_check_imported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Run config check once as root, on a kit with a warning, so that every module it
    imports lazily is loaded before it runs as a user who cannot read the code."""
    kit = good_kit(tmp_path / "warm-up-kit")
    (kit / "startup" / "client.key").unlink()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NETS", json.dumps([static_net("warm-up", kit)]))
        run(capsys, "config", "check")


@needs_root
def test_config_check_warns_about_a_kit_whose_folder_this_user_cannot_enter(
    shared_dir, tmp_path, capsys, monkeypatch
):
    """A kit folder chmod 700 by the user who provisioned it (compose's workers are uid
    10001): the settings' validation lets it by (no process stops on a PermissionError),
    and config check names the net and the kit, once, with exit 0."""
    kit = good_kit(shared_dir / "kit")
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(shared_dir / "data"))
    _config_check_imported(capsys, tmp_path)
    monkeypatch.setenv("NETS", json.dumps([static_net("net-1", kit)]))
    assert run(capsys, "config", "check")[0] == 0  # root reads it
    (kit / "startup").chmod(0o700)
    with as_nobody():
        code, out, err = run(capsys, "config", "check")
    assert code == 0 and "configuration valid, with 1 warning(s)" in out
    assert f"warning: net net-1: admin kit {kit}: startup/fed_admin.json is missing or " in err
    assert err.count(str(kit)) == 1, err


@needs_root
def test_config_check_warns_once_and_exits_0_on_a_kit_config_it_cannot_read(
    shared_dir, tmp_path, capsys, monkeypatch
):
    """On a net that names its server_endpoint (nets.ecs.toml does), an unreadable kit
    config is this user's warning, not also a kit problem (exit 2):
    app/entrypoints/README.md's CLI table."""
    kit = good_kit(shared_dir / "kit")
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(shared_dir / "data"))
    _config_check_imported(capsys, tmp_path)
    net = static_net("net-1", kit, server_endpoint="localhost:18002")  # the kit's
    monkeypatch.setenv("NETS", json.dumps([net]))
    code, out, _ = run(capsys, "config", "check")
    assert code == 0 and out.endswith("configuration ok\n")
    (kit / "startup" / "fed_admin.json").chmod(0o600)
    with as_nobody():
        code, out, err = run(capsys, "config", "check")
        json_code, json_out, _ = run(capsys, "config", "check", "--json")
    assert code == 0
    assert "configuration valid, with 1 warning(s)" in out
    assert err.count(str(kit)) == 1, err
    assert json_code == 0 and json.loads(json_out)["nets"][0]["kit_problem"] is None
