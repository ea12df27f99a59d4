"""Alembic environment bound to the models' metadata."""

from __future__ import annotations

import warnings
from logging.config import fileConfig
from pathlib import Path

from alembic import context

from app.db import make_engine
from models import Base

config = context.config


def _logging_ini() -> str:
    """The ini file whose [loggers] configure logging: the caller's, or ours next to this file
    when the command line took its settings from pyproject.toml's [tool.alembic] (plain
    `alembic ...` from the repository root, where there is no alembic.ini)."""
    name = config.config_file_name
    if name is not None and Path(name).is_file():
        return name
    return str(Path(__file__).with_name("alembic.ini"))


if config.attributes.get("configure_logger", True):
    fileConfig(_logging_ini(), disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    # A caller's Config (`fl-dispatcher db`, tests) may name the URL; get_main_option would
    # raise when the command line found no alembic.ini, so ask the way that also reads
    # pyproject.toml.
    url = config.get_alembic_option("sqlalchemy.url")
    if isinstance(url, str) and url:
        return url
    from app.settings import load_settings  # only when no caller gave a URL

    return load_settings().database_url


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it."""
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        compare_type=True,
        compare_server_default=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations on a live connection."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


# SQLite cannot reflect an expression index, so SQLAlchemy and Alembic say they skip
# comparing it; the one such index (ix_jobs_retries_uncounted) exists for PostgreSQL's planner.
_EXPRESSION_INDEX_WARNINGS = (
    r"Skipped unsupported reflection of expression-based index ix_jobs_retries_uncounted",
    r"autogenerate skipping metadata-specified expression-based index 'ix_jobs_retries_uncounted'",
)
for _message in _EXPRESSION_INDEX_WARNINGS:
    warnings.filterwarnings("ignore", message=_message)


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        compare_type=True,
        compare_server_default=True,
        # SQLite cannot ALTER most things; batch mode rebuilds tables the portable way.
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
