"""Run Alembic programmatically (used by `fl-dispatcher db ...`, the demo and the tests)."""

from __future__ import annotations

import sys
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


def schema_problem(engine: Engine) -> str | None:
    """Why the database's schema is not the one this code runs on (None when it is): not
    migrated yet, or migrated by a newer release (app/deploy/README.md "Upgrading")."""
    scripts = ScriptDirectory.from_config(alembic_config(""))
    heads = set(scripts.get_heads())
    with engine.connect() as conn:
        current = set(MigrationContext.configure(conn).get_current_heads())
    if current == heads:
        return None
    known = {rev.revision for rev in scripts.walk_revisions()}
    newer = sorted(current - known)
    if newer:
        return (
            f"at revision {', '.join(newer)}, newer than this code's head "
            f"{', '.join(sorted(heads))}: run the newer release, or take the database back "
            f"with the newer release's `fl-dispatcher db downgrade {', '.join(sorted(heads))}`"
        )
    return (
        f"at {', '.join(sorted(current)) or 'no revision'}, not at the migrations' head "
        f"{', '.join(sorted(heads))} (migrate has not run)"
    )
