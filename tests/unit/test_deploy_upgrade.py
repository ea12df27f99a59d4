"""Upgrades (app/deploy/README.md "Upgrading"): the version follows the CHANGELOG, whose
newest entry names the migration head a rollback goes back to; and a process of an older
release, started against a newer schema, says so instead of "migrate has not run"."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from alembic.script import ScriptDirectory
from sqlalchemy import text

from app import migrate
from app.db import make_engine
from app.readiness import missing_dependencies

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "app" / "deploy" / "CHANGELOG.md"
ENTRY = re.compile(r"^## (\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)$", re.MULTILINE)


def entries() -> list[tuple[str, str]]:
    """(version, its text) of each CHANGELOG entry, newest first."""
    body = CHANGELOG.read_text()
    found = list(ENTRY.finditer(body))
    return [
        (m.group(1), body[m.end() : found[i + 1].start() if i + 1 < len(found) else len(body)])
        for i, m in enumerate(found)
    ]


def test_the_version_is_the_changelog_s_newest_entry():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    listed = [v for v, _ in entries()]
    assert listed[0] == version
    as_tuples = [tuple(int(p) for p in v.split(".")) for v in listed]
    assert as_tuples == sorted(as_tuples, reverse=True) and len(set(listed)) == len(listed)


def test_each_entry_names_a_migration_head_and_the_newest_is_the_code_s():
    heads = []
    for version, body in entries():
        named = re.search(r"^Database: migration head `(\w+)`", body, re.MULTILINE)
        assert named is not None, f"{version} names no migration head"
        heads.append(named.group(1))
    scripts = ScriptDirectory.from_config(migrate.alembic_config(""))
    assert [heads[0]] == scripts.get_heads()
    known = {rev.revision for rev in scripts.walk_revisions()}
    assert set(heads) <= known


def test_the_rollback_steps_say_0_1_0_s_callbacks_count_attempts_from_0():
    """Rolling back undoes the contract too: a receiver moved to 1-based attempts is told."""
    guide = " ".join((ROOT / "app" / "deploy" / "README.md").read_text().split())
    rollback = guide.split("**Rolling back**", 1)[1]
    assert "rolling back to 0.1.0, a status callback's `attempt` is the 0-based" in rollback


def test_an_older_process_on_a_newer_schema_says_the_database_is_newer(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        assert missing_dependencies(engine, None, schema=True) == []
        (head,) = ScriptDirectory.from_config(migrate.alembic_config("")).get_heads()
        with engine.begin() as conn:  # as a later release's migration would leave it
            conn.execute(text("UPDATE alembic_version SET version_num = '0099_later'"))
        (problem,) = missing_dependencies(engine, None, schema=True)
        assert problem == (
            f"database schema: at revision 0099_later, newer than this code's head {head}: "
            "run the newer release, or take the database back with the newer release's "
            f"`fl-dispatcher db downgrade {head}`"
        )
        with engine.begin() as conn:  # not migrated yet: the old words, with the revisions
            conn.execute(text("DELETE FROM alembic_version"))
        (problem,) = missing_dependencies(engine, None, schema=True)
        assert problem == (
            f"database schema: at no revision, not at the migrations' head {head} "
            "(migrate has not run)"
        )
    finally:
        engine.dispose()
