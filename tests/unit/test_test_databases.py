"""The unit tier's databases (tests/fixtures/db.py): every test has its own SQLite file behind
one shared engine, and a test's sessions reach its own file only, whatever an earlier test
left in that engine's pool."""

from __future__ import annotations

import shutil

from sqlalchemy import text

from tests.fixtures.db import _TestDatabase


def test_a_connection_opened_on_an_earlier_tests_database_never_serves_this_test(
    tmp_path, sqlite_factory
):
    """A probe thread of an earlier test (app.parallel.Prober's threads outlive a round by
    design) that opened its connection after that test's engine was disposed left it in the
    pool; this test's sessions must never be handed it. They were: a claim then read another
    file than the enqueue before it had written (test_pipeline's cold start found no job)."""
    engine = sqlite_factory.kw["bind"]
    mine = _TestDatabase.path
    earlier = tmp_path / "earlier.db"
    shutil.copyfile(mine, earlier)
    engine.dispose()
    _TestDatabase.path = str(earlier)  # as it was while the earlier test ran
    try:
        with engine.connect() as conn:  # the straggler's connection, back in the pool after
            conn.exec_driver_sql("SELECT 1")
    finally:
        _TestDatabase.path = mine
    with sqlite_factory() as session:
        files = [row.file for row in session.execute(text("PRAGMA database_list"))]
    assert files[0] == mine
