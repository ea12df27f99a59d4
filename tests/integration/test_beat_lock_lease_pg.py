"""BEAT_LOCK_TIMEOUT_S against a real PostgreSQL: every lease the settings accept lets a beat
take its lock. The lease's TCP keepalive is a quarter of it, and Linux refuses a
TCP_KEEPIDLE over 32767 s: libpq then refused every connection ("setsockopt(TCP_KEEPIDLE)
failed: Invalid argument") and a beat with a lease from 131072 s stood by silently for ever,
nothing scheduled (break-it review 21b, when every duration was capped at 1e9 s). The lease
is now at most 3600 s."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.errors import SettingsError
from app.settings import Settings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("value", ["3600", "200000", "1e9"])
def test_a_beat_lock_lease_the_settings_accept_lets_a_beat_take_the_lock(tmp_path, value) -> None:
    from app.beat import PgAdvisoryLock
    from tests.fixtures.db import fresh_pg_database

    try:
        settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, BEAT_LOCK_TIMEOUT_S=value)
    except (SettingsError, ValidationError):
        assert float(value) > 3600  # refused at start, with its name
        return
    with fresh_pg_database("fld_beat_lease") as url:  # its own database: its own locks
        lock = PgAdvisoryLock(url, settings.beat_lock_timeout_s)
        try:
            assert lock.hold(), f"BEAT_LOCK_TIMEOUT_S={value}: the beat never takes its lock"
        finally:
            lock.release()
