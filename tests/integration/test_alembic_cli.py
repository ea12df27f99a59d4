"""Plain `alembic ...` from the repository root, as someone who knows Alembic would type it:
pyproject.toml's [tool.alembic] finds migrations/, and env.py takes the URL from Settings
(DATABASE_URL, or the embedded default under FL_DISPATCHER_DATA_DIR)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from models import Base
from tests.fixtures.db import fresh_pg_database

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC = str(Path(sys.executable).with_name("alembic"))  # the console script users run
TABLES = set(Base.metadata.tables) | {"alembic_version"}  # what head must have built
# Everything Settings or Alembic would read from the environment is set by the test.
_OWN = {"DATABASE_URL", "FL_DISPATCHER_DATA_DIR", "NETS", "NETS_FILE", "ALEMBIC_CONFIG"}


def alembic(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in _OWN}
    return subprocess.run(
        [ALEMBIC, *args],
        cwd=cwd,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    return (
        ScriptDirectory.from_config(
            Config(toml_file=str(ROOT / "pyproject.toml"))
        ).get_current_head()
        or ""
    )


def _schema(url: str) -> tuple[set[str], str | None]:
    engine = create_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
        if "alembic_version" not in tables:
            return tables, None
        with engine.connect() as conn:
            return tables, conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


@pytest.fixture
def empty_pg():
    with fresh_pg_database("fld_cli") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'cli.db'}"
    return request.getfixturevalue("empty_pg")


def test_there_is_no_alembic_ini_at_the_root():
    # If one appeared, it (not pyproject.toml) would configure the command line.
    assert not (ROOT / "alembic.ini").exists()


def test_upgrade_head_then_check_from_the_repository_root(empty_db, tmp_path):
    env = {"DATABASE_URL": empty_db, "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data")}
    head = head_revision()
    assert head

    ok(alembic("upgrade", "head", cwd=ROOT, env=env))
    assert _schema(empty_db) == (TABLES, head)
    assert "No new upgrade operations detected" in ok(alembic("check", cwd=ROOT, env=env))
    assert head in ok(alembic("current", cwd=ROOT, env=env))

    # `check` is not a rubber stamp: a database behind head fails it.
    ok(alembic("downgrade", "base", cwd=ROOT, env=env))
    behind = alembic("check", cwd=ROOT, env=env)
    assert behind.returncode != 0
    assert "not up to date" in behind.stdout + behind.stderr


def test_without_database_url_the_embedded_default_is_migrated(tmp_path):
    data = tmp_path / "data"
    ok(alembic("upgrade", "head", cwd=ROOT, env={"FL_DISPATCHER_DATA_DIR": str(data)}))
    db = data / "fl-dispatcher.db"
    assert db.is_file()
    assert _schema(f"sqlite:///{db}") == (TABLES, head_revision())


def test_autogenerate_writes_an_empty_lint_clean_revision(tmp_path):
    # Same configuration, in a copy, so the test never writes into the repository.
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(
        ROOT / "migrations", tmp_path / "migrations", ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'gen.db'}",
        "FL_DISPATCHER_DATA_DIR": str(tmp_path / "data"),
    }
    ok(alembic("upgrade", "head", cwd=tmp_path, env=env))

    ok(alembic("revision", "--autogenerate", "-m", "probe", cwd=tmp_path, env=env))

    before = {p.name for p in (ROOT / "migrations" / "versions").glob("*.py")}
    new = [p for p in (tmp_path / "migrations" / "versions").glob("*.py") if p.name not in before]
    assert [p.name.endswith("_probe.py") for p in new] == [True]
    source = new[0].read_text()
    assert f'down_revision: str | Sequence[str] | None = "{head_revision()}"' in source
    # Models and migrations agree, so there is nothing to do...
    assert "op." not in source
    # ...and the post-write hooks left it as ruff wants it.
    for args in (["check"], ["format", "--check"]):
        lint = subprocess.run(
            [sys.executable, "-m", "ruff", *args, str(new[0])],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
