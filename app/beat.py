"""Exactly one beat schedules, whatever runs: Celery's beat scheduler behind the deployment's
beat lock, and a heartbeat file that proves the scheduler is ticking.

Two beats would double every housekeeping tick (compose pins one replica, but a rolling
deploy, a second `docker compose up` with another project name or an operator's `celery beat`
all start another). So every beat takes the lock before it sends anything, and a beat
without it stands by, asking again every `STANDBY_POLL_S`:

- PostgreSQL: a session advisory lock (`pg_try_advisory_lock`) on a connection of its own,
  held for the beat's life and checked on every tick. A beat that dies, is killed or loses
  its database connection loses the lock with its session, and a standby takes over within
  `STANDBY_POLL_S`; a beat that lost its connection asks again on a new one, so after a
  database restart one beat schedules again within a second of the database's return. A
  rolling deploy cannot break it: the new beat stands by until the old one's session ends.
  A holder that went silent (host or network gone, no FIN or RST) or was stopped loses the
  lock within `BEAT_LOCK_TIMEOUT_S` of its last check: the session is a lease the server
  ends once idle that long (`PgAdvisoryLock`). The one window: a beat whose connection
  drops between its check and its sends may send that one tick while a standby already took
  over (every task is idempotent; the cost is one duplicate tick).
- SQLite (the embedded default): an exclusive `flock` on `<database file>.beat-lock`, beside
  the database it guards, which holds between processes of one machine using that file
  (whatever data folder each was started with), the only place the embedded database can be
  shared anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from celery.beat import PersistentScheduler
from celery.utils.time import maybe_make_aware
from sqlalchemy import Connection, create_engine, func, make_url, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from app.settings import Settings

log = logging.getLogger(__name__)

# "fl_beat"; other advisory locks of this schema: app.metrics.fold._FOLD_LOCK_KEY, and the
# two-number keys of app.usecases.enqueue.record_rejection (per caller key), claims'
# project cap and app.usecases.prewarm.early_cancels (per prewarm key).
BEAT_LOCK_KEY = 0x666C5F62656174
STANDBY_POLL_S = 1.0
HEARTBEAT_FILE = "beat-heartbeat.json"


class BeatLock(Protocol):
    def hold(self) -> bool:
        """Take the lock, or check it is still ours; False while another beat holds it."""
        ...

    def still_held(self) -> bool:
        """Just before a send: True while the lock cannot have passed to another beat."""
        ...

    def release(self) -> None: ...


class PgAdvisoryLock:
    """A session advisory lock on a connection this beat keeps open, the standby's too (so
    asking again every second costs one query, not a new connection). Autocommit: it holds
    no transaction open, so no idle-in-transaction timeout ends the session.

    The session is a lease of `lease_s`: the server ends it (and so frees the lock) once it
    has been idle that long (`idle_session_timeout`), which a holder checking every second
    never is. A holder that died silently (power or network lost: no FIN, no RST, which TCP
    alone notices after about two hours) or was stopped (SIGSTOP: its kernel still answers)
    thus loses the lock within `lease_s` of its last check. Its own side gives up as soon:
    TCP keepalives and `tcp_user_timeout` end a connection whose peer went silent."""

    def __init__(self, database_url: str, lease_s: float = 10.0) -> None:
        self.lease_s = lease_s
        probe_s = max(1, int(lease_s / 4))  # libpq takes whole seconds
        # NullPool: closing the connection ends the session, which is what releases the lock.
        self._engine = create_engine(
            database_url,
            poolclass=NullPool,
            connect_args={
                "connect_timeout": max(2, math.ceil(lease_s)),
                "keepalives": 1,
                "keepalives_idle": probe_s,
                "keepalives_interval": probe_s,
                "keepalives_count": 3,
                "tcp_user_timeout": int(lease_s * 1000),
            },
        )
        self._conn: Connection | None = None
        self._held = False
        self._checked_at = -math.inf  # monotonic time a successful check was sent

    def hold(self) -> bool:
        try:
            if self._conn is None:
                self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                self._set_lease(self._conn)
            sent_at = time.monotonic()
            if self._held:
                self._conn.execute(text("SELECT 1"))  # the session, and so the lock, lives
                self._checked_at = sent_at
                return True
            lock = select(func.pg_try_advisory_lock(BEAT_LOCK_KEY))
            self._held = bool(self._conn.execute(lock).scalar())
            self._checked_at = sent_at
        except SQLAlchemyError as exc:
            if self._held:
                log.error("beat lock lost with its database session: standing by: %s", exc)
            self._drop()
            return False
        if self._held:
            log.info("beat lock taken: this beat schedules")
        return self._held

    def _set_lease(self, conn: Connection) -> None:
        # The session's own setting, so no server configuration is needed (PostgreSQL 14+).
        if int(conn.execute(text("SHOW server_version_num")).scalar_one()) < 140000:
            log.warning("PostgreSQL before 14: the beat lock has no lease (silent holders)")
            return
        timeout_ms = str(int(self.lease_s * 1000))
        conn.execute(select(func.set_config("idle_session_timeout", timeout_ms, False)))

    def still_held(self) -> bool:
        # The server cannot end the session within lease_s of the last check it received,
        # so a send up to half the lease after a check needs no query; later (the beat was
        # stopped or stalled between its check and its sends), check again first.
        if not self._held:
            return False
        if time.monotonic() - self._checked_at < self.lease_s / 2:
            return True
        return self.hold()

    def _drop(self) -> None:
        self._held = False
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):  # closing a dead connection
                self._conn.invalidate()  # never back to a pool: the session must end
            self._conn = None

    def release(self) -> None:
        self._drop()  # ending the session releases the lock
        self._engine.dispose()


class FileLock:
    """An exclusive flock on a file in the data folder, held open for the beat's life."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def hold(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        log.info("beat lock taken (%s): this beat schedules", self.path)
        return True

    def still_held(self) -> bool:
        return self._fd is not None  # a flock ends only with its file descriptor

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


def beat_lock_for(settings: Settings) -> BeatLock:
    """PostgreSQL's advisory lock on a PostgreSQL database, else a file lock beside it."""
    if settings.database_url.startswith("postgresql"):
        return PgAdvisoryLock(settings.database_url, settings.beat_lock_timeout_s)
    return FileLock(sqlite_lock_path(settings))


def sqlite_lock_path(settings: Settings) -> Path:
    """`<database file>.beat-lock`: keyed by the database, so beats started from different
    data folders on one database file still share it; an in-memory or URI-named database
    (no plain file to sit beside) keeps `<data dir>/beat.lock`."""
    database = make_url(settings.database_url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return settings.data_dir.resolve() / "beat.lock"
    path = Path(database).resolve()  # relative as SQLite itself opens it: to the cwd
    return path.with_name(f"{path.name}.beat-lock")


def heartbeat_path(settings: Settings) -> Path:
    return settings.data_dir.resolve() / HEARTBEAT_FILE


def write_heartbeat(path: Path, *, active: bool, now: float, beat: str = "") -> None:
    """Write-then-rename, so a health check never reads half a file."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    record = {
        "at": now,
        "active": active,
        "pid": os.getpid(),
        "beat": beat,
        "monotonic": time.monotonic(),
        "boot": _boot_id(),
    }
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def _active_other(path: Path, beat: str) -> bool:
    """The heartbeat is another beat's, written while it was active."""
    try:
        record = json.loads(path.read_text())
        return bool(record.get("active")) and record.get("beat") != beat
    except (OSError, ValueError, AttributeError):
        return False


def _boot_id() -> str:
    """This boot of this machine's kernel: its monotonic clock means something only here."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def heartbeat_age_s(path: Path, now: float) -> float | None:
    """Seconds since this data folder's beat last ticked; None if it never did. A heartbeat
    from the future (the wall clock stepped back since: a negative age every check passed,
    for a hung beat too) is aged by the monotonic clock on the machine and boot that wrote
    it; a ticking beat rewrites it within a second anyway."""
    try:
        record = json.loads(path.read_text())
        age = now - float(record["at"])
        boot = _boot_id()
        if age < 0 and boot and record.get("boot") == boot and "monotonic" in record:
            return time.monotonic() - float(record["monotonic"])
        return age
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class SingleBeatScheduler(PersistentScheduler):  # type: ignore[misc]
    """Celery's persistent scheduler that sends only while it holds the beat lock, and writes
    a heartbeat on every tick (a standby never over an active beat's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from app.celery_app import current_settings

        settings = current_settings()
        self._beat_lock = beat_lock_for(settings)
        self._heartbeat = heartbeat_path(settings)
        self._active = False
        # Names this beat's heartbeats: pids repeat across containers sharing a volume.
        self._beat_id = uuid.uuid4().hex
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        held = self._beat_lock.hold()
        if held != self._active:
            log.warning(
                "beat %s", "active: scheduling" if held else "standing by: another beat holds"
            )
            self._active = held
        if held:
            self._forget_runs_from_the_future()
        # Held, at least every STANDBY_POLL_S too: each tick's check renews the lease.
        interval = (
            min(float(super().tick(*args, **kwargs)), STANDBY_POLL_S) if held else STANDBY_POLL_S
        )
        if held or not _active_other(self._heartbeat, self._beat_id):
            # A standby never overwrites another active beat's heartbeat: sharing the data
            # folder with a holder that stopped ticking, it must not vouch for it. In a
            # folder of its own it writes its own (standing by, alive), also after it lost
            # the lock itself.
            write_heartbeat(self._heartbeat, active=held, now=time.time(), beat=self._beat_id)
        return interval

    def apply_async(self, entry: Any, *args: Any, **kwargs: Any) -> Any:
        """Send one due entry, only while the lock cannot have passed to another beat."""
        if not self._beat_lock.still_held():
            log.warning("beat lock lost before sending %s: standing by", entry.name)
            self._active = False
            return None
        return super().apply_async(entry, *args, **kwargs)

    def _forget_runs_from_the_future(self) -> None:
        # Celery keys both its due check (last run + period) and its heap (a wall-clock
        # time per entry) on the wall clock: after a backward step (a host that booted
        # ahead, corrected by NTP) every entry that ran "later" than now waits out the whole
        # step, and the schedule file hands those runs to a restarted beat too. Such an
        # entry is due now; rebuilding the heap recomputes every entry's time from now.
        now = maybe_make_aware(self.app.now())
        stepped = False
        for entry in self.schedule.values():
            if maybe_make_aware(entry.last_run_at) > now:
                period = getattr(entry.schedule, "run_every", None)
                entry.last_run_at = now - period if isinstance(period, timedelta) else now
                stepped = True
        if stepped:
            log.warning("beat: last runs lie in the future (the clock stepped back): due now")
            self._heap = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._beat_lock.release()
