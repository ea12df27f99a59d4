"""Break-it 22b: the URL query-password masking (fd6ead6) masks too little and too much.

Promises: app/deploy/CHANGELOG.md 0.3.11: "A URL password given as a query parameter
(`?password=`, `?sslpassword=`, a `token` or `secret`) is masked wherever the authority's is
(`config check`, the `db` commands, log lines)"; `redact_url`'s docstring: "an `@` further on
(a query's) masks more, never less"; app/logs.py: the redacting filter masks the configured
secrets "wherever they would appear" (and leaves the rest of the line for the operator).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from app.logs import configure_logging
from app.redact import redact_url
from app.settings import Settings
from tests.unit.test_url_query_password import connection_password


@pytest.fixture
def logged(tmp_path) -> Iterator[tuple[io.StringIO, list[Settings]]]:
    """The process's log handler on a stream, configured with the settings the test puts
    in the list (plain lines)."""
    stream = io.StringIO()
    holder: list[Settings] = []
    yield stream, holder
    for handler in [h for h in logging.getLogger().handlers if h.get_name() == "fl-dispatcher"]:
        logging.getLogger().removeHandler(handler)


def _log_with(settings: Settings, stream: io.StringIO, logger: str, msg: str, *args: object) -> str:
    configure_logging(settings, stream=stream)
    logging.getLogger(logger).error(msg, *args)
    return stream.getvalue()


HEAD, TAIL = "pg-query", "tail-of-secret-9f3"
HASH_URL = f"postgresql+psycopg://fl@postgres:5432/fl?password={HEAD}#{TAIL}"


def test_a_query_password_holding_a_hash_is_masked_whole(tmp_path, logged) -> None:
    """Scenario: DATABASE_URL=...?password=pg-query#tail-of-secret-9f3. SQLAlchemy reads the
    query up to the end of the URL (no fragment), so psycopg's password is all of it.

    What happened: `redact_url` (config check, `db upgrade`'s "database at ...") stops the
    value at the `#` and prints `?password=***#tail-of-secret-9f3`; the log filter knows
    only `pg-query` (urlsplit's query, which ends at the `#`), so a line quoting the URL
    shows the tail too: half the password in clear."""
    assert connection_password(HASH_URL) == f"{HEAD}#{TAIL}"  # a real password
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, DATABASE_URL=HASH_URL)
    stream, _ = logged

    shown = settings.redacted()["DATABASE_URL"]
    printed = redact_url(settings.database_url)
    line = _log_with(settings, stream, "a-worker", "cannot reach %s", settings.database_url)

    assert TAIL not in shown, shown
    assert TAIL not in printed, printed
    assert TAIL not in line, line


def test_a_percent_encoded_password_parameter_is_masked(tmp_path, logged) -> None:
    """Scenario: DATABASE_URL=...?%70assword=<secret> (`%70` is `p`; a URL-encoding tool or
    a template that encodes every name writes it so). SQLAlchemy decodes the parameter's
    name, so psycopg gets it as the password.

    What happened: SECRET_QUERY matches the name as written only; `config check`, the db
    commands' line and the log filter show the password."""
    secret = "pct-encoded-secret-51"
    url = f"postgresql+psycopg://fl@postgres:5432/fl?%70assword={secret}"
    assert connection_password(url) == secret
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, DATABASE_URL=url)
    stream, _ = logged

    shown = settings.redacted()["DATABASE_URL"]
    line = _log_with(settings, stream, "a-worker", "cannot reach %s", settings.database_url)

    assert secret not in shown, shown
    assert secret not in line, line


def test_an_access_line_for_a_lookup_by_caller_key_keeps_its_status(tmp_path, logged) -> None:
    """Scenario: flip-api looks a job up by its key, `GET /jobs?caller_key=flip-run-42`
    (api.py's list_jobs); uvicorn's access line goes through the redacting filter.

    What happened: SECRET_QUERY, now applied to every log line, takes `caller_key` for a
    secret (it holds `key`) and its value runs to the next `&` or `#`, across spaces: the
    line ends `GET /jobs?caller_key=***`, the HTTP version and the status code gone (a 500
    reads like a 200). Before fd6ead6 the line was whole."""
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path)
    stream, _ = logged
    line = _log_with(
        settings,
        stream,
        "uvicorn.access",
        '%s - "%s %s HTTP/%s" %d',
        "10.0.0.7:51234",
        "GET",
        "/jobs?caller_key=flip-run-42",
        "1.1",
        500,
    )
    assert 'HTTP/1.1" 500' in line, line


def test_a_database_error_keeps_its_parameters(tmp_path, logged) -> None:
    """Scenario: a statement fails on SQLite (the laptop's, the demo's database), whose
    parameters are `?`; the worker logs the exception. SQLAlchemy's message holds the SQL
    and, on the next line, the parameters (the job's key an operator needs).

    What happened: `?` then `... caller_key =` reads as a secret query parameter: the
    rest of the traceback text after that `=` up to the next `&` or `#` (the parameters,
    every line below) is `***`."""
    engine = create_engine(f"sqlite:///{tmp_path / 'e.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE early_cancels (caller_key TEXT, n INTEGER CHECK (n > 0))"))
        conn.execute(text("INSERT INTO early_cancels VALUES ('flip-run-42', 1)"))
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path)
    stream, _ = logged
    configure_logging(settings, stream=stream)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE early_cancels SET n=:n WHERE early_cancels.caller_key = :k"),
                {"n": 0, "k": "flip-run-42"},
            )
    except IntegrityError:
        logging.getLogger("a-worker").exception("cancel failed")
    finally:
        engine.dispose()

    line = stream.getvalue()
    assert "[parameters: (0, 'flip-run-42')]" in line, line
