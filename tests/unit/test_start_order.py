"""What lets every compose service start in any order: the file lock that keeps one beat
active on the embedded database (a standby's heartbeat never vouching for a stalled holder),
and `--wait`, which retries a process's dependencies."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import migrate
from app.beat import FileLock, beat_lock_for, heartbeat_age_s, write_heartbeat
from app.readiness import DependencyTimeout, wait_for_dependencies
from app.settings import Settings


def test_one_file_lock_holder_at_a_time(tmp_path: Path):
    first, second = FileLock(tmp_path / "beat.lock"), FileLock(tmp_path / "beat.lock")

    assert first.hold()
    assert first.hold()  # still ours
    assert not second.hold()

    first.release()

    assert second.hold()
    second.release()


def test_beats_on_one_sqlite_database_from_two_data_folders_share_one_lock(tmp_path: Path):
    # The lock belongs to the database, not to the folder a beat was started with: two
    # beats on one database file must not both schedule.
    database_url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = beat_lock_for(_settings(tmp_path / "one", database_url))
    second = beat_lock_for(_settings(tmp_path / "two", database_url))
    try:
        assert first.hold()
        assert not second.hold()
        first.release()
        assert second.hold()
    finally:
        first.release()
        second.release()


def test_the_heartbeat_age(tmp_path: Path):
    path = tmp_path / "beat-heartbeat.json"
    assert heartbeat_age_s(path, now=100.0) is None

    write_heartbeat(path, active=False, now=100.0)

    assert heartbeat_age_s(path, now=112.5) == 12.5


def test_the_heartbeat_age_survives_a_backward_clock_step(tmp_path: Path, monkeypatch):
    # A beat that ticked, then hung, while NTP stepped the clock back an hour: by the wall
    # clock its heartbeat lies in the future (a negative age), which passed every health
    # check for the hour. Its age is the time that really passed since.
    from app import beat

    monotonic = {"now": 5000.0}
    monkeypatch.setattr(beat.time, "monotonic", lambda: monotonic["now"])
    path = tmp_path / "beat-heartbeat.json"
    write_heartbeat(path, active=True, now=100_000.0)

    monotonic["now"] += 100.0

    assert heartbeat_age_s(path, now=100_000.0 - 3600 + 100) == 100.0


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        DATABASE_URL=database_url,
        BROKER_URL=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
    )


def test_wait_gives_up_naming_an_unmigrated_schema(tmp_path: Path):
    settings = _settings(tmp_path, f"sqlite:///{tmp_path / 'empty.db'}")
    clock = _Clock()

    with pytest.raises(DependencyTimeout, match="not at the migrations' head"):
        wait_for_dependencies(
            settings, 10, schema=True, broker=True, sleep=clock.sleep, clock=clock
        )

    assert clock.slept == [2.0] * 5  # retried until the deadline, then gave up


def test_wait_returns_once_the_schema_is_at_head(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'db.db'}"
    settings = _settings(tmp_path, url)
    clock = _Clock()

    def migrate_on_second_try(seconds: float) -> None:
        clock.sleep(seconds)
        migrate.upgrade(url)

    wait_for_dependencies(
        settings, 60, schema=True, broker=True, sleep=migrate_on_second_try, clock=clock
    )

    assert clock.slept == [2.0]


def test_migrate_waits_for_the_database_only(tmp_path: Path):
    settings = _settings(tmp_path, f"sqlite:///{tmp_path / 'empty.db'}")

    wait_for_dependencies(settings, 0, schema=False, broker=False)  # an empty db answers


def test_a_standby_beats_heartbeat_does_not_vouch_for_a_stalled_active_beat(
    tmp_path, monkeypatch
) -> None:
    """Scenario: two beats share a data folder (FileLock's own case: SQLite, one machine; or
    compose's beat-data volume with a second replica). The active one, holding the lock,
    stalls (a hung broker send) at t=0; the standby ticks every second and rewrites the same
    beat-heartbeat.json with "active": false. `fl-dispatcher ready --beat-ticked-within 60`
    reads only the file's age, so at t=100 it reports the beat ticking: the hung holder is
    never restarted, the standby never gets the lock, and no beat round (the cover of a lost
    kick) runs. Promise ("Run exactly one beat": the heartbeat proves the scheduler is
    ticking; "Queues and kicks": beat's round within one interval). Fix: only the active
    beat writes the shared heartbeat (or heartbeat_age_s ignores "active": false / the file
    is per process), so the check fails for the holder that stopped ticking."""
    from app import beat

    path = tmp_path / beat.HEARTBEAT_FILE
    holder = beat.FileLock(tmp_path / "beat.lock")
    assert holder.hold()
    beat.write_heartbeat(path, active=True, now=0.0)  # the holder's last tick, then it hangs

    standby = object.__new__(beat.SingleBeatScheduler)
    standby._beat_lock = beat.FileLock(tmp_path / "beat.lock")
    standby._heartbeat = path
    standby._active = False
    standby._beat_id = "standby"
    monkeypatch.setattr(beat.time, "time", lambda: 100.0)
    assert standby.tick() == beat.STANDBY_POLL_S  # standing by: the holder has the lock
    age = beat.heartbeat_age_s(path, 101.0)
    holder.release()
    assert age is None or age > 60, f"the stalled beat looks like it ticked {age:.0f}s ago"
