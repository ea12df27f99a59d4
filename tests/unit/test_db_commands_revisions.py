"""Review 22: `fl-dispatcher db upgrade|downgrade`, the upgrade and rollback steps of
app/deploy/README.md "Upgrading", on the revisions an operator types.

Promises:
- app/entrypoints/cli.py: a bad argument is an error line (exit 1), never a traceback.
- app/deploy/README.md "Upgrading": "an old process starting against a newer schema does not
  start: `--wait` (compose's commands) waits, saying "database schema: at revision N, newer
  than this code's head M", and exits past its wait". compose's `migrate` runs
  `fl-dispatcher db upgrade --wait 300` on every `docker compose up`, so after a rollback
  whose downgrade was skipped (the old image tagged back first), it is the first old
  process to meet the newer schema.
- `db upgrade REV` prints "database at REV": what the database is at afterwards.

What happened, on a database at this code's head (0023):
- `db downgrade 0O22` (a typo of the CHANGELOG's head): alembic's CommandError "Can't locate
  revision identified by '0O22'", a traceback, exit 1;
- `db upgrade --wait 5` on a database a newer release migrated (alembic_version 0099): the
  same CommandError traceback at once, not the documented message;
- `db upgrade 0001` (an operator rolling back who typed upgrade for downgrade): alembic does
  nothing and the command prints "database at 0001", exit 0, while the database stays at
  0023.
"""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.engine import make_url

from app.entrypoints.cli import main
from app.migrate import MIGRATIONS_DIR
from tests.unit.test_cli import _isolated_logging, cli_env  # noqa: F401


def _version(sqlite_url: str) -> str:
    path = make_url(sqlite_url).database
    with sqlite3.connect(str(path)) as connection:
        [(version,)] = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    return str(version)


def _set_version(sqlite_url: str, version: str) -> None:
    path = make_url(sqlite_url).database
    with sqlite3.connect(str(path)) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (version,))


def _head() -> str:
    return max(p.name[:4] for p in (MIGRATIONS_DIR / "versions").glob("0*.py"))


def _no_traceback(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refusing the value
        code = int(exc.code or 0)
    except Exception as exc:  # what the operator would see as a traceback
        raise AssertionError(f"`{' '.join(argv)}`: traceback: {type(exc).__name__}: {exc}") from exc
    out, err = capsys.readouterr()
    return code, out, err


def test_a_downgrade_to_a_mistyped_revision_is_an_error_line(capsys, cli_env, sqlite_url) -> None:  # noqa: F811
    """`db downgrade 0O22`: alembic's CommandError, a traceback."""
    code, _, err = _no_traceback(capsys, "db", "downgrade", "0O22")

    assert code == 1 and "0O22" in err
    assert _version(sqlite_url) == _head()


def test_migrate_on_a_newer_schema_says_so_instead_of_a_traceback(
    capsys,
    cli_env,  # noqa: F811
    sqlite_url,
) -> None:
    """compose's migrate command after a rollback that skipped the downgrade: a traceback at
    once, not "at revision 0099, newer than this code's head"."""
    _set_version(sqlite_url, "0099")

    code, _, err = _no_traceback(capsys, "db", "upgrade", "--wait", "1")

    assert code != 0
    assert "0099" in err and "newer" in err, err


def test_upgrade_to_an_older_revision_does_not_claim_the_database_is_there(
    capsys,
    cli_env,  # noqa: F811
    sqlite_url,
) -> None:
    """`db upgrade 0001` on a database at the head: "database at 0001", exit 0; it is not."""
    code, out, _ = _no_traceback(capsys, "db", "upgrade", "0001")

    at = _version(sqlite_url)
    claimed = "database at 0001" in out
    assert not (claimed and at != "0001"), (
        f"printed {out.strip()!r} (exit {code}) while the database is at {at}"
    )


@pytest.mark.parametrize("argv", [["upgrade"], ["downgrade", "0022"], ["check"]], ids=" ".join)
def test_every_db_command_on_a_newer_schema_says_so_at_once_without_wait(
    capsys,
    cli_env,  # noqa: F811
    sqlite_url,
    argv: list[str],
) -> None:
    """Without `--wait` (an operator's own command): the same line at once, the database
    untouched; before, alembic's "Can't locate revision identified by '0099'" traceback."""
    _set_version(sqlite_url, "0099")

    code, _, err = _no_traceback(capsys, "db", *argv)

    assert code == 1 and "at revision 0099, newer than this code's head" in err, err
    assert _version(sqlite_url) == "0099"
