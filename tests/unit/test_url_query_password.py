"""Review 22: a DATABASE_URL password given as a query parameter is printed and logged.

Promise (README "Configuration essentials", app/README.md "Configuration"): `config check`
prints the effective configuration "secrets redacted"; app/logs.py: "A redacting filter on
the handler masks the configured secrets wherever they would appear"; `db upgrade` (compose's
`migrate`, whose output is the service's log) names the database with its password masked.

Scenario: DATABASE_URL=postgresql+psycopg://fl@postgres:5432/fl?password=<secret>, a form
SQLAlchemy hands to psycopg as the password (libpq's `password` keyword; the test checks it
is the connection's password), e.g. to keep a password with URL-unsafe characters out of
the authority, which compose.yml's POSTGRES_PASSWORD note asks for.

What happened: `redact_url` masks only `user:password@`, so `config check`, the `db upgrade`
line ("database at head: ...?password=<secret>") and a log line quoting the URL all show
it; `secret_values` reads the password from the URL's authority only and masks nothing.
"""

from __future__ import annotations

import io
import logging

from sqlalchemy import create_engine

from app.logs import configure_logging
from app.redact import redact_url
from app.settings import Settings

SECRET = "pg-query-secret-4b7e"
URL = f"postgresql+psycopg://fl@postgres:5432/fl?password={SECRET}&sslmode=prefer"


def connection_password(url: str) -> object:
    """The password SQLAlchemy hands the driver for `url` (no connection made)."""
    engine = create_engine(url)
    try:
        _, kwargs = engine.dialect.create_connect_args(engine.url)
    finally:
        engine.dispose()
    return kwargs.get("password")


def test_config_check_and_the_db_commands_mask_a_query_password(tmp_path) -> None:
    assert connection_password(URL) == SECRET  # the form is a real password
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, DATABASE_URL=URL)

    shown = settings.redacted()["DATABASE_URL"]
    printed = redact_url(settings.database_url)  # cmd_db's "database at head: <this>"

    assert SECRET not in shown, shown
    assert SECRET not in printed, printed


def test_a_log_line_quoting_the_url_masks_a_query_password(tmp_path) -> None:
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, DATABASE_URL=URL)
    stream = io.StringIO()
    handler = configure_logging(settings, stream=stream)
    try:
        logging.getLogger("a-worker").error("cannot reach %s", settings.database_url)
    finally:
        logging.getLogger().removeHandler(handler)

    assert SECRET not in stream.getvalue(), stream.getvalue()
