"""What `local-net` and `demo --keep` write (app.local.settings_folder, app.local.local_net):
a nets file any Settings reads back as the same nets, a settings file that reads the same to
`--env-file` and to a shell, without secrets, and next steps that are the README's."""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from app.entrypoints.cli import main
from app.local.demo import _next_steps
from app.local.local_net import LocalNet, make_local_net, next_steps
from app.local.settings_folder import env_lines, nets_toml, write_settings_folder
from app.settings import ENV_FILE_VARIABLE, Settings, load_settings
from tests.fixtures.db import make_admin_kit, make_server_kit

README = Path(__file__).resolve().parents[2] / "README.md"


def a_net(folder: Path) -> dict[str, object]:
    return {
        "name": "local-net",
        "idle_timeout_s": 6.0,
        "ready_timeout_s": 120,
        "per_job_fl_server": True,
        "required_sites": ["site-1", "site-2"],
        "driver": {"kind": "local", "server_kit_dir": str(make_server_kit(folder / "server"))},
        "admin": {
            "kit_dir": str(make_admin_kit(folder / "admin@x.org")),
            "username": "admin@x.org",
        },
    }


def test_the_nets_file_reads_back_as_the_nets_it_was_written_from(tmp_path):
    net = a_net(tmp_path)
    assert tomllib.loads(nets_toml([net, net | {"name": "other"}])) == {
        "nets": [net, net | {"name": "other"}]
    }


def test_the_settings_file_reads_the_same_to_env_file_and_a_shell_and_holds_no_secret(tmp_path):
    net = a_net(tmp_path)
    settings = {
        "FL_DISPATCHER_DATA_DIR": tmp_path / "a data folder #1",
        "PER_JOB_FL_SERVER": True,
        "HOUSEKEEPING_INTERVAL_S": 2.0,
        "CALLBACK_URL": "http://127.0.0.1:9/cb",
        "CALLBACK_SECRET": "a-secret-of-the-run-0123456789",
        "API_SECRET": "another-secret-0123456789",
        "FLOWER_BASIC_AUTH": "ops:flower-secret",
    }
    env_file = write_settings_folder(tmp_path, settings, [net], "line one\n\nline three")
    text = env_file.read_text()
    assert text.startswith("# line one\n#\n# line three\n")
    assert "secret" not in text.lower() and "CALLBACK_URL" not in text and "FLOWER" not in text

    read = Settings(_env_file=env_file)
    assert read.data_dir == tmp_path / "a data folder #1"
    assert (read.per_job_fl_server, read.housekeeping_interval_s) == (True, 2.0)
    assert [n.name for n in read.nets] == ["local-net"]
    assert read.nets_file == tmp_path / "nets.toml"

    shell = subprocess.run(
        ["bash", "-c", f'set -a; . "{env_file}"; printf %s "$FL_DISPATCHER_DATA_DIR"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout == str(tmp_path / "a data folder #1")


HELD = [
    "o'brien",
    'a "quoted" back\\slash\\',
    "$HOME, `cmd` and a back\\slash",
    "# not a comment",
    "  spaces at the ends  ",
    "tab\tand;semicolon&",
    "ünïcødé",
    "",
]


@pytest.mark.parametrize("value", HELD)
def test_a_value_reads_back_as_written_to_the_settings_loader_and_a_shell(tmp_path, value):
    """What pydantic-settings reads the file with (python-dotenv) and a shell's `set -a;
    . FILE` both read back the value written: a path under /home/o'brien, say."""
    from dotenv import dotenv_values

    env_file = tmp_path / "fl-dispatcher.env"
    env_file.write_text(env_lines({"SOME_PATH": value}, "a header"))
    assert dotenv_values(env_file)["SOME_PATH"] == value
    shell = subprocess.run(
        ["bash", "-c", f'set -a; . "{env_file}"; printf %s "$SOME_PATH"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout == value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("it's ${HOME}", "'\\$\\{'"),  # python-dotenv expands it in every quoting
        ("it's $HOME", "a quote or a backslash and a '\\$'"),  # a shell expands it
        ("two\nlines", "a newline"),
    ],
)
def test_a_value_the_file_cannot_hold_is_refused_by_name(value, why):
    with pytest.raises(ValueError, match=f"JOB_ROOT: a value with .*{why}"):
        env_lines({"JOB_ROOT": value}, "h")


def test_the_demos_settings_folder_can_be_written_under_a_path_with_an_apostrophe(tmp_path):
    folder = tmp_path / "o'brien"
    folder.mkdir()
    env_file = write_settings_folder(
        folder, {"FL_DISPATCHER_DATA_DIR": folder / "data"}, [a_net(folder)], "a header"
    )
    read = Settings(_env_file=env_file)
    assert (read.data_dir, read.nets_file) == (folder / "data", folder / "nets.toml")


def test_a_settings_folder_holds_no_password_of_the_database_or_broker(tmp_path):
    """The kept settings file is world-readable: a stack run on a PostgreSQL or Redis with
    a password leaves its URLs without it, and says where the password goes."""
    settings = {
        "FL_DISPATCHER_DATA_DIR": tmp_path / "data",
        "DATABASE_URL": "postgresql+psycopg://fl:db-pass-0123456789@db:5432/fl",
        "BROKER_URL": "redis://:broker-pass-0123456789@redis:6379/5",
        "S3_ENDPOINT_URL": "http://minio:9000/?password=s3-pass-0123456789&region=x",
    }
    env_file = write_settings_folder(tmp_path, settings, [a_net(tmp_path)], "a header")
    text = env_file.read_text()
    assert "pass-0123456789" not in text
    read = Settings(_env_file=env_file)
    assert read.database_url == "postgresql+psycopg://fl@db:5432/fl"
    assert read.broker_url == "redis://redis:6379/5"
    assert read.s3_endpoint_url == "http://minio:9000/?region=x"
    for name in ("DATABASE_URL", "BROKER_URL", "S3_ENDPOINT_URL"):
        assert f"# {name} without its password: export {name} with it" in text


def test_local_net_prints_the_readme_steps():
    """What `local-net` says to run next is the README's "After the demo" block, line for
    line (the e2e test runs that block)."""
    folder = Path("~/fl-local")
    made = LocalNet(
        folder=folder,
        net={"name": "local-net"},
        site_kits={s: folder / "kits" / s for s in ("site-1", "site-2")},
        env_file=folder / "fl-dispatcher.env",
        nets_file=folder / "nets.toml",
        job="tiny-fedavg",
    )
    printed = [line.strip() for line in next_steps(made).splitlines()[1:]]
    section = README.read_text().split("\n## After the demo\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None
    assert block.group(1).splitlines() == ["fl-dispatcher local-net ~/fl-local", *printed]


def test_local_net_wants_a_new_folder_and_a_site(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["local-net", str(tmp_path / "taken")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and f"{tmp_path / 'taken'} is not empty: give a new folder" in err
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["notes.txt"]
    with pytest.raises(ValueError, match="at least one site"):
        make_local_net(tmp_path / "new", sites=0)
    assert not (tmp_path / "new").exists()


def _as_shell_reads(said: str) -> list[list[str]]:
    """Each printed `fl-dispatcher ...` line as a shell splits it into arguments."""
    lines = [line.strip().removesuffix("&").strip() for line in said.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("fl-dispatcher ")]


def test_local_nets_next_steps_name_its_files_whole_in_a_folder_with_a_space(tmp_path):
    folder = tmp_path / "FL nets" / "o'brien"
    made = LocalNet(
        folder=folder,
        net={"name": "local-net"},
        site_kits={s: folder / "kits" / s for s in ("site-1", "site-2")},
        env_file=folder / "fl-dispatcher.env",
        nets_file=folder / "nets.toml",
        job="tiny-fedavg",
    )
    commands = _as_shell_reads(next_steps(made))
    assert len(commands) == 6
    for argv in commands:
        if argv[1] == "participant":
            assert argv[2] in {str(kit) for kit in made.site_kits.values()}
        else:
            assert argv[1:3] == ["--env-file", str(made.env_file)]


def test_the_demos_closing_lines_name_its_settings_file_whole_in_a_folder_with_a_space(tmp_path):
    root = tmp_path / "FL demo"
    out = io.StringIO()
    _next_steps(root, kept=True, out=out)
    commands = _as_shell_reads(out.getvalue())
    assert len(commands) == 3
    for argv in commands:
        assert argv[1:3] == ["--env-file", str(root / "fl-dispatcher.env")]


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--name", "My Net"], "net name 'My Net': a nets file takes"),
    ],
)
def test_local_net_refuses_what_its_nets_file_or_a_server_cannot_take(
    tmp_path, capsys, option, said
):
    """A name the folder's own nets file refuses (its settings would then stop every
    command), a port no server can listen on: refused before anything is made."""
    folder = tmp_path / "fl-local"
    assert main(["local-net", str(folder), *option]) == 1
    assert said in capsys.readouterr().err
    assert not folder.exists()


@pytest.mark.parametrize("option", [["--port", "70000"], ["--port", "0"], ["--sites", "0"]])
def test_local_net_refuses_a_port_or_a_site_count_out_of_range_before_anything(
    tmp_path, capsys, option
):
    """A port no server can listen on, no sites: argparse's error line (exit 2), as for every
    number option (cli_args), and nothing made."""
    folder = tmp_path / "fl-local"
    with pytest.raises(SystemExit) as exited:
        main(["local-net", str(folder), *option])
    assert exited.value.code == 2
    assert f"argument {option[0]}" in capsys.readouterr().err
    assert not folder.exists()


def test_a_local_net_that_fails_leaves_no_half_made_folder_behind(tmp_path, capsys):
    """nvflare refusing the admin's name fails the provisioning, after the folder was
    begun: the folder is not left behind, so the corrected command is not refused."""
    folder = tmp_path / "new" / "fl-local"
    assert main(["local-net", str(folder), "--admin", "not-an-email"]) == 1
    assert "local-net:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nor the parent it made, nor its building folder
    (tmp_path / "empty").mkdir()
    assert main(["local-net", str(tmp_path / "empty"), "--admin", "not-an-email"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.fixture
def no_settings_in_the_environment(monkeypatch):
    """No setting from the test runner's environment."""
    for field in Settings.model_fields.values():
        if field.alias:
            monkeypatch.delenv(field.alias, raising=False)
    monkeypatch.setenv(ENV_FILE_VARIABLE, "")


@pytest.mark.usefixtures("no_settings_in_the_environment")
def test_local_net_works_in_a_folder_under_a_path_with_an_apostrophe(tmp_path, capsys):
    folder = tmp_path / "o'brien" / "fl-local"
    assert main(["local-net", str(folder)]) == 0, capsys.readouterr().err
    settings = load_settings(folder / "fl-dispatcher.env")
    assert settings.data_dir == folder / "data"
    assert settings.net("local-net").admin.kit_dir == folder / "kits" / "admin@nvidia.com"
    assert [p.name for p in tmp_path.iterdir()] == ["o'brien"]  # no building folder left


@pytest.mark.usefixtures("no_settings_in_the_environment")
def test_a_local_nets_settings_keep_its_own_database_with_a_data_folder_exported(
    tmp_path, monkeypatch
):
    """With FL_DISPATCHER_DATA_DIR exported (as `config check` advises) the environment
    wins: the folder's database and broker are named, so its worker stays on them."""
    made = make_local_net(tmp_path / "fl-local")
    monkeypatch.setenv("FL_DISPATCHER_DATA_DIR", str(tmp_path / "my-deployment"))
    settings = load_settings(made.env_file)
    assert [n.name for n in settings.nets] == ["local-net"]
    assert settings.database_url == f"sqlite:///{made.folder / 'data' / 'fl-dispatcher.db'}"
    assert settings.broker_url == f"sqla+sqlite:///{made.folder / 'data' / 'broker.db'}"


@pytest.mark.parametrize("kept", [True, False])
def test_the_demo_ends_by_saying_how_to_look_at_what_it_did(tmp_path, kept):
    out = io.StringIO()
    _next_steps(tmp_path, kept=kept, out=out)
    said = out.getvalue()
    look = f"fl-dispatcher --env-file {tmp_path / 'fl-dispatcher.env'}"
    if kept:
        assert all(f"  {look} {cmd}" in said for cmd in ("status", "jobs", "api --port 8080"))
        assert "/nets and /fl/status" in said
    else:
        assert "Its folder is deleted" in said and "fl-dispatcher demo --keep" in said
    assert "fl-dispatcher local-net DIR" in said
