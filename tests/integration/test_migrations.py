"""Migrations: upgrade head on empty PostgreSQL and SQLite, downgrade to base, no drift."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, inspect, text

from app import migrate
from tests.fixtures.db import fresh_pg_database

pytestmark = [
    pytest.mark.integration,
    # SQLite cannot reflect the one expression index (ix_jobs_retries_uncounted).
    pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index"),
]

TABLES = {
    "nets",
    "jobs",
    "job_events",
    "rejected_requests",
    "net_events",
    "scale_events",
    "stray_runs",
    "callback_cursors",
    "callback_receiver",
    "metric_totals",
    "metric_net_clocks",
    "housekeeping_runs",
    "pending_kicks",
    "prewarms",
    "drains",
    "early_aborts",
    "refused_messages",
    "early_cancels",
    "alembic_version",
}


@pytest.fixture
def empty_pg():
    with fresh_pg_database("fld_mig") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'm.db'}"
    return request.getfixturevalue("empty_pg")


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_check_downgrade_upgrade(empty_db):
    migrate.upgrade(empty_db)
    assert _tables(empty_db) == TABLES
    migrate.check(empty_db)  # raises on any drift between models and migrations
    migrate.downgrade(empty_db, "base")
    assert _tables(empty_db) == {"alembic_version"}
    migrate.upgrade(empty_db)
    assert _tables(empty_db) == TABLES


def test_partial_unique_index_exists_after_migration(empty_db):
    migrate.upgrade(empty_db)
    engine = create_engine(empty_db)
    try:
        indexes = {i["name"]: i for i in inspect(engine).get_indexes("jobs")}
    finally:
        engine.dispose()
    assert indexes["uq_jobs_one_active_per_net"]["unique"]


def test_0017_adds_drains_to_a_database_with_work_and_a_drain_survives_to_head(empty_db):
    """A deployment on 0015 is migrated with its nets in place; the drain made after it is a
    row the next release's processes read (issue 40: drain, deploy, migrate, undrain)."""
    migrate.upgrade(empty_db, "0015")
    assert "drains" not in _tables(empty_db)
    engine = create_engine(empty_db)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO nets (name, state, state_changed_at, version)"
                    " VALUES ('net-a', 'READY', '2026-12-05 09:00:00+00:00', 1)"
                )
            )
        migrate.upgrade(empty_db)
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO drains (scope, drained_at) VALUES ('*', :at)"),
                {"at": "2026-12-05 09:01:00+00:00"},
            )
            assert conn.execute(text("SELECT scope, reason FROM drains")).all() == [("*", "")]
        migrate.downgrade(empty_db, "0015")
        assert "drains" not in _tables(empty_db) and "nets" in _tables(empty_db)
    finally:
        engine.dispose()


def test_0021_adds_early_aborts_and_its_downgrade_drops_it(empty_db):
    """A new table only: an abort kept at 0021 is a row; back at 0020 the table is gone and
    the rest of the schema is untouched."""
    migrate.upgrade(empty_db, "0020")
    assert "early_aborts" not in _tables(empty_db)
    migrate.upgrade(empty_db, "0021")
    engine = create_engine(empty_db)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO early_aborts (job_id, reason, reason_code, asked_at, kept_until)"
                    " VALUES (:id, 'user', 'aborted', :at, :at)"
                ),
                {"id": uuid.uuid4().hex, "at": "2026-12-05 17:00:00+00:00"},
            )
            assert conn.execute(text("SELECT reason FROM early_aborts")).scalars().all() == ["user"]
        migrate.downgrade(empty_db, "0020")
        assert _tables(empty_db) == TABLES - {"early_aborts", "refused_messages", "early_cancels"}
    finally:
        engine.dispose()


def test_0023_adds_early_cancels_and_its_downgrade_drops_it(empty_db):
    """A new table only: a cancel kept at 0023 is a row keyed by the prewarm's caller_key;
    back at 0022 the table is gone and the rest of the schema is untouched."""
    migrate.upgrade(empty_db, "0022")
    assert "early_cancels" not in _tables(empty_db)
    migrate.upgrade(empty_db, "0023")
    engine = create_engine(empty_db)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO early_cancels (caller_key, asked_at, kept_until)"
                    " VALUES ('hint-1', :at, :at)"
                ),
                {"at": "2026-12-06 12:00:00+00:00"},
            )
            keys = conn.execute(text("SELECT caller_key FROM early_cancels")).scalars().all()
            assert keys == ["hint-1"]
        migrate.downgrade(empty_db, "0022")
        assert _tables(empty_db) == TABLES - {"early_cancels"}
    finally:
        engine.dispose()


def test_0018_gives_the_jobs_not_yet_ended_their_flip_project_and_downgrades(empty_db):
    """A deployment on 0017 with a queue: the QUEUED and RUNNING jobs get the project FLIP put
    in their metadata (a valid id only), so the first claim after the upgrade counts them;
    ended jobs keep none. Downgrading to 0017 drops the column and its index."""
    migrate.upgrade(empty_db, "0017")
    engine = create_engine(empty_db)
    at = "2026-12-06 09:00:00+00:00"
    jobs = [
        ("11111111111111111111111111111111", "QUEUED", '{"project_id": "p-1"}'),
        ("22222222222222222222222222222222", "RUNNING", '{"project_id": "p-2", "m": 1}'),
        ("33333333333333333333333333333333", "QUEUED", '{"project_id": "not an id"}'),
        ("44444444444444444444444444444444", "COMPLETED", '{"project_id": "p-1"}'),
        ("55555555555555555555555555555555", "QUEUED", None),
    ]
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO nets (name, state, state_changed_at, version)"
                    " VALUES ('net-a', 'BUSY', :at, 1)"
                ),
                {"at": at},
            )
            for job_id, state, metadata in jobs:
                conn.execute(
                    text(
                        "INSERT INTO jobs (id, caller_key, definition, required_sites, metadata,"
                        " net_name, priority, state, attempts, retries, retries_counted,"
                        " max_attempts, created_at, state_changed_at, version) VALUES (:id, :key,"
                        " 'd', '[]', :metadata, :net, 0, :state, 0, 0, 0, 3, :at, :at, 1)"
                    ),
                    {
                        "id": job_id if "sqlite" in empty_db else str(uuid.UUID(job_id)),
                        "key": job_id,
                        "metadata": metadata,
                        "net": "net-a" if state == "RUNNING" else None,
                        "state": state,
                        "at": at,
                    },
                )
        migrate.upgrade(empty_db)
        with engine.begin() as conn:
            found = dict(conn.execute(text("SELECT caller_key, project_id FROM jobs")).all())
        assert found == {
            jobs[0][0]: "p-1",
            jobs[1][0]: "p-2",
            jobs[2][0]: None,
            jobs[3][0]: None,
            jobs[4][0]: None,
        }
        migrate.downgrade(empty_db, "0017")
        columns = {c["name"] for c in inspect(engine).get_columns("jobs")}
        indexes = {i["name"] for i in inspect(engine).get_indexes("jobs")}
        assert "project_id" not in columns and "ix_jobs_active_project" not in indexes
    finally:
        engine.dispose()


def test_0022_adds_refused_messages_and_the_digest_and_its_downgrade_drops_them(empty_db):
    """A nullable column on rejected_requests and a new table: a refusal kept at 0021 reads
    with no digest at 0022; one stored at 0022 with its message goes with it when pruned
    (the cascade), and back at 0021 the refusals keep their other columns, the table gone."""
    migrate.upgrade(empty_db, "0021")
    engine = create_engine(empty_db)
    insert = (
        "INSERT INTO rejected_requests (caller_key, reason, reason_code, at{extra})"
        " VALUES (:key, 'unknown net', 'rejected', :at{value})"
    )
    at = "2026-12-05 20:00:00+00:00"
    try:
        with engine.begin() as conn:
            conn.execute(text(insert.format(extra="", value="")), {"key": "old", "at": at})
        migrate.upgrade(empty_db, "0022")
        assert "refused_messages" in _tables(empty_db)
        with engine.begin() as conn:
            if "sqlite" in empty_db:
                conn.execute(text("PRAGMA foreign_keys=ON"))
            conn.execute(
                text(insert.format(extra=", payload_digest", value=", :d")),
                {"key": "new", "at": at, "d": "ab" * 32},
            )
            new_id = conn.execute(
                text("SELECT id FROM rejected_requests WHERE caller_key = 'new'")
            ).scalar_one()
            conn.execute(
                text("INSERT INTO refused_messages (message_id, rejection_id) VALUES ('m', :i)"),
                {"i": new_id},
            )
            kept = conn.execute(
                text("SELECT caller_key, payload_digest FROM rejected_requests ORDER BY caller_key")
            ).all()
            assert [tuple(r) for r in kept] == [("new", "ab" * 32), ("old", None)]
            conn.execute(text("DELETE FROM rejected_requests WHERE caller_key = 'new'"))
            assert conn.execute(text("SELECT count(*) FROM refused_messages")).scalar() == 0
        migrate.downgrade(empty_db, "0021")
        assert _tables(empty_db) == TABLES - {"refused_messages", "early_cancels"}
        with engine.begin() as conn:
            keys = conn.execute(text("SELECT caller_key FROM rejected_requests")).scalars()
            assert sorted(keys) == ["old"]
    finally:
        engine.dispose()
