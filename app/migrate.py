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
    heads = set(ScriptDirectory.from_config(alembic_config("")).get_heads())
    with engine.connect() as conn:
        return set(MigrationContext.configure(conn).get_current_heads()) == heads
