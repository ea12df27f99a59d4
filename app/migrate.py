"""Run Alembic programmatically (used by `fl-dispatcher db ...`, the demo and the tests)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(database_url: str) -> Config:
    """An Alembic Config for `database_url`, independent of the current directory."""
    # Alembic's default stdout is the sys.stdout of the moment alembic was imported; its
    # messages (`db check`'s verdict) go to the one in place now, which may have been replaced
    # since (by the CLI's caller, or a test runner that captures output per run).
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"), stdout=sys.stdout)
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # A literal '%' in a URL would be read as interpolation by configparser.
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the schema to `revision`."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    """Take the schema down to `revision`."""
    command.downgrade(alembic_config(database_url), revision)


def check(database_url: str) -> None:
    """Raise if the models and the migrations have drifted apart."""
    command.check(alembic_config(database_url))


def at_head(engine: Engine) -> bool:
    """True when the database's schema is at the migrations' head."""
    return schema_problem(engine) is None


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config(""))


def current(engine: Engine) -> frozenset[str]:
    """The revisions the database is at (empty: base, never migrated or all the way down)."""
    with engine.connect() as conn:
        return frozenset(MigrationContext.configure(conn).get_current_heads())


def resolve(revision: str) -> frozenset[str] | None:
    """The revisions `revision` names for `db upgrade`/`downgrade` (empty: base); None for a
    relative one (`-1`, `+2`, `head-1`), a step from wherever the database is. alembic's
    CommandError for one no migration has (a typo)."""
    if "+" in revision or "-" in revision:
        return None
    return frozenset(script.revision for script in _scripts().get_revisions(revision) if script)


def newer_schema(engine: Engine) -> str | None:
    """`schema_problem` when a newer release migrated the database (a revision this code
    does not have, which it can neither upgrade from nor downgrade), else None."""
    scripts = _scripts()
    newer = current(engine) - {rev.revision for rev in scripts.walk_revisions()}
    return _newer(newer, scripts.get_heads()) if newer else None


def _newer(newer: Iterable[str], heads: Iterable[str]) -> str:
    head = ", ".join(sorted(heads))
    return (
        f"at revision {', '.join(sorted(newer))}, newer than this code's head {head}: run "
        f"the newer release, or take the database back with the newer release's "
        f"`fl-dispatcher db downgrade {head}`"
    )


def schema_problem(engine: Engine) -> str | None:
    """Why the database's schema is not the one this code runs on (None when it is): not
    migrated yet, or migrated by a newer release (app/deploy/README.md "Upgrading")."""
    scripts = _scripts()
    heads = set(scripts.get_heads())
    at = current(engine)
    if at == heads:
        return None
    newer = at - {rev.revision for rev in scripts.walk_revisions()}
    if newer:
        return _newer(newer, heads)
    return (
        f"at {', '.join(sorted(at)) or 'no revision'}, not at the migrations' head "
        f"{', '.join(sorted(heads))} (migrate has not run)"
    )
