"""tests/tools/services.sh, which tests/run.sh runs first: on a real PostgreSQL of its own
(trust auth, as a fresh Debian cluster has), it creates the role and database that
FL_TEST_PG_URL names, leaves them alone once they exist, and names what is missing when no
server answers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.fixtures import testrun
from tests.fixtures.services import PrivatePostgres

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "tools" / "services.sh"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    server.init()
    yield server
    server.destroy()


def run_script(url: str) -> subprocess.CompletedProcess[str]:
    # As tests/run.sh runs it: the project's virtualenv first on PATH.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = os.environ | {"FL_TEST_PG_URL": url, "PATH": path}
    # A Redis it starts where none runs is the machine's, as when tests/run.sh runs it: not
    # this test run's, which the next run would stop.
    env.pop(testrun.ENV, None)
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_a_missing_role_and_database_are_created_and_then_left_alone(postgres):
    url = f"postgresql+psycopg://fl_tests@127.0.0.1:{postgres.port}/fl_tests_admin"

    first = run_script(url)
    assert first.returncode == 0, first.stderr
    assert "creating PostgreSQL role fl_tests and database fl_tests_admin" in first.stdout

    # What the tests do with it (tests/fixtures/db.py): log in without a password, create a
    # database of their own and drop it again.
    with psycopg.connect(
        host="127.0.0.1", port=postgres.port, user="fl_tests", dbname="fl_tests_admin",
        autocommit=True,
    ) as conn:  # fmt: skip
        privileges = conn.execute(
            "SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert privileges == (False, True)  # what the tests need, no more
        conn.execute('CREATE DATABASE "fl_tests_scratch"')
        conn.execute('DROP DATABASE "fl_tests_scratch" WITH (FORCE)')
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'fl_tests_admin'"
        ).fetchone()
    assert owner == ("fl_tests",)

    again = run_script(url)
    assert again.returncode == 0, again.stderr
    assert "creating" not in again.stdout


def test_no_server_is_a_failure_that_says_what_to_provide(postgres):
    postgres.stop()
    try:
        url = f"postgresql+psycopg://fl_tests@127.0.0.1:{postgres.port}/fl_tests_admin"
        done = run_script(url)
    finally:
        postgres.start()
    assert done.returncode == 1
    assert f"no PostgreSQL answers on 127.0.0.1:{postgres.port}" in done.stderr
    assert "FL_TEST_PG_URL" in done.stderr and "bash tests/run.sh -m unit" in done.stderr
