"""The nets' rows kept in step with what the NETS setting declares: a declared net's row
inserted (STOPPED) when missing, each declaring process's stamp (`declared_at`) restamped,
nets no process declares any more found (removed or undeclared after a grace), and a net
taken out of service as MISCONFIGURED until a human fixes its settings.

Each takes an open `Session` (the caller's unit of work commits or rolls back) and an
explicit `now`; the job and net rows themselves are read and locked through `records`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from app.settings import Settings
from app.usecases import records
from models import JobState, Net, NetState


def sync_nets(
    session: Session,
    settings: Settings,
    now: datetime,
    *,
    at_start: bool = False,
    still_wrong: Mapping[str, str] | None = None,
) -> list[str]:
    """Make sure every configured net has a row; returns the names it created.

    At process start (`at_start`) a MISCONFIGURED net is reset to STOPPED (STOPPING while a
    scale-down call may still land): settings are validated at every start, so a restart
    after a fix is the human saying "try again". Not a net the start found its files still
    wrong for (`still_wrong`: name -> why): it stays MISCONFIGURED with the new reason, in
    this same transaction, so no claim ever sees it in service between the reset and the
    check.
    """
    still_wrong = still_wrong or {}
    existing = {n.name: n for n in session.scalars(select(Net).with_for_update())}
    created = []
    for net_config in settings.nets:
        net = existing.get(net_config.name)
        if net is None:
            if _insert_net(session, net_config.name, now):
                created.append(net_config.name)
            continue  # declared now, by this insert or by the one that won the race
        if at_start and net.misconfigured_after_job is not None:
            # Every start checks the files afresh: a verdict an earlier start kept for the
            # end of a job holds only while they are still wrong (the caller marks it again).
            net.misconfigured_after_job = None
            if net.name not in still_wrong:
                # Fixed: its grace counted calls never made, afresh. Still wrong (the
                # caller marks it again), it keeps counting: restarts every 15-30 s would
                # keep a dead or finished run's job for ever (sim ops 4550, drift 8187).
                net.answered()
        if at_start and net.state == NetState.MISCONFIGURED and net.name in still_wrong:
            net.last_error = still_wrong[net.name]
        elif (
            at_start
            and net.state == NetState.MISCONFIGURED
            and records.active_job(session, net.name) is None  # never STOPPED under a job
        ):
            # A scale-down call may still be in flight (its lease, scaling.scale_down): STOPPING
            # until reconcile finishes it, not STOPPED, which a job could claim under it. In
            # flight up to its due time included, as reconcile reads it (scaling.stop_in_flight).
            in_flight = net.stop_due_at is not None and now <= net.stop_due_at
            target = NetState.STOPPING if in_flight else NetState.STOPPED
            net.transition(target, now, "settings reloaded at start")
            net.last_error = None
        net.declared_at = now
    return created


def _insert_net(session: Session, name: str, now: datetime) -> bool:
    """Insert a net's row, STOPPED; False when another transaction created it meanwhile.
    Two first requests after a deploy that added the net both find its row missing (the
    locked read above cannot lock a row that does not exist yet): ON CONFLICT DO NOTHING
    lets the second wait for the first's commit and move on, where a plain INSERT failed
    on the key (IntegrityError, a 503 to the caller)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    stmt = (
        insert(Net)
        .values(name=name, state=NetState.STOPPED, state_changed_at=now, declared_at=now)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    result = session.execute(stmt)
    return bool(getattr(result, "rowcount", 0) == 1)


def note_declared(
    session: Session, settings: Settings, now: datetime, names: list[str] | None = None
) -> None:
    """This process declares these nets now (see `undeclared_nets`); `names`: only these of
    them (a reconcile stamps those whose stamp is `restamp_after_s` old)."""
    names = [n.name for n in settings.nets] if names is None else names
    if names:
        session.execute(update(Net).where(Net.name.in_(names)).values(declared_at=now))


def undeclared_nets(session: Session, settings: Settings, now: datetime) -> list[str]:
    """Nets with rows that no process has declared for `undeclared_after_s(settings)` plus
    `restamp_after_s` (how stale a live stamp may get): a redeploy removed them. One this
    process lacks but another declared lately is in the middle of a rolling deploy (added,
    or about to go) and is not among them."""
    declared = [n.name for n in settings.nets]
    return list(
        session.scalars(
            select(Net.name).where(
                Net.name.not_in(declared),
                or_(Net.declared_at.is_(None), Net.declared_at < removed_before(settings, now)),
            )
        )
    )


@dataclass(frozen=True)
class Removal:
    """The nets a redeploy removed, as one read of every net's stamp found them, and how far
    back to look for unpinned QUEUED jobs that only those nets could have run."""

    removed: list[str]
    # Unpinned jobs accepted before this may need sites no declared net has; None: look at
    # none (nothing removed, a declared net leaves its sites open, or a net this process
    # lacks was declared lately and may have them).
    sites_horizon: datetime | None = None
    # Removed nets with no stamp (removed before migration 0007): the horizon is the round's
    # own time until `stamp_unstamped` gives them one.
    unstamped: tuple[str, ...] = ()


def removal(
    declared_at: Mapping[str, datetime | None], settings: Settings, now: datetime
) -> Removal:
    """`undeclared_nets` of a read of every net's stamp (name -> `declared_at`), with the
    horizon of the jobs that may have lost every net with their sites (`Removal`)."""
    since = removed_before(settings, now)
    lacked = {name: at for name, at in declared_at.items() if not settings.has_net(name)}
    removed = [name for name, at in lacked.items() if at is None or at < since]
    if (
        not removed
        or len(removed) < len(lacked)  # one is in its grace: its sites are unknown here
        or any(net.sites is None for net in settings.nets)  # that net may run any job
    ):
        return Removal(removed)
    stamps = [lacked[name] for name in removed]
    if any(at is None for at in stamps):
        # Removed before migration 0007: every job so far, once (`stamp_unstamped`).
        unstamped = tuple(name for name in removed if lacked[name] is None)
        return Removal(removed, now, unstamped)
    # A job accepted after the last removed net was gone for the grace was accepted by a
    # process whose NETS lacked it (the grace outlasts a rolling deploy): its enqueue
    # refused it if no net had its sites. Twice the grace, for clocks and slow restarts;
    # so a quiet round reads no job once the jobs queued before then have left the queue.
    latest = max(at for at in stamps if at is not None)
    return Removal(removed, latest + timedelta(seconds=2 * removed_after_s(settings)))


def stamp_unstamped(session: Session, removal: Removal, settings: Settings) -> None:
    """Give the removed nets with no stamp one that keeps them removed and makes the next
    round's horizon this round's: a NULL stamp made every round read every unpinned QUEUED
    job for good, though a job queued since was checked by an enqueue that lacked the net."""
    if not removal.unstamped or removal.sites_horizon is None:
        return
    at = removal.sites_horizon - timedelta(seconds=2 * removed_after_s(settings))
    session.execute(
        update(Net)
        .where(Net.name.in_(removal.unstamped), Net.declared_at.is_(None))
        .values(declared_at=at)
    )


def removed_after_s(settings: Settings) -> float:
    """How old a net's last stamp must be for the net to count as removed: no process has
    declared it for the grace (`undeclared_after_s`), a live stamp being up to
    `restamp_after_s` old. So a net is never taken for removed sooner than the grace after
    the last round that declared it, and is at most a quarter of it later."""
    return undeclared_after_s(settings) + restamp_after_s(settings)


def removed_before(settings: Settings, now: datetime) -> datetime:
    """A net last declared before this counts as removed (`removed_after_s`)."""
    return now - timedelta(seconds=removed_after_s(settings))


def undeclared_after_s(settings: Settings) -> float:
    """How long no process may have declared a net before it counts as removed: longer than
    a rolling deploy leaves old and new processes side by side, and than ten reconcile
    rounds (each declares its nets)."""
    return max(settings.stuck_after_s, 20 * settings.housekeeping_interval_s)


def restamp_after_s(settings: Settings) -> float:
    """How old a net's stamp (`declared_at`) gets before a reconcile stamps it again: a
    quarter of the grace, so a round writes nothing most of the time (issue 37), and a
    removed net is noticed at most that much later."""
    return undeclared_after_s(settings) / 4


def mark_misconfigured(session: Session, name: str, reason: str, now: datetime) -> bool:
    """Take a net out of service until a human fixes its settings (jobs wait QUEUED).

    A job only claimed onto it (ASSIGNED, nothing submitted) goes back to the queue, its
    attempt kept, as reconcile does. A job past that point keeps the net: False, and the
    verdict stays on the row (shown as its `last_error`) for `records.release_net` to apply
    the moment the job lets the net go; meanwhile the monitor asks nothing of a server
    these files do not reach (`monitor._monitor_net`: unwatchable, settled past the grace
    by LOST_JOB_POLICY)."""
    net = records.get_net(session, name, lock=True)
    job = records.active_job(session, name)
    if job is not None:
        net.misconfigured_after_job = reason
        if job.state != JobState.ASSIGNED:
            net.last_error = f"misconfigured once job {job.id} ends: {reason}"
            return False
        records.requeue_job(
            session, job.id, f"net {name} misconfigured: {reason}", now, count_attempt=False
        )
        return True  # (requeue_job released the net: MISCONFIGURED with the reason)
    net.transition(NetState.MISCONFIGURED, now, reason)
    net.last_error = reason
    return True


def prepare_at_start(
    session: Session, settings: Settings, problems: Mapping[str, str], now: datetime
) -> None:
    """A worker start's one transaction, once it has checked each net's files (`problems`:
    name -> why they name another server): every declared net's row, MISCONFIGURED nets
    reset (`sync_nets(at_start=True)`), and each net whose files are wrong taken out of
    service, or its verdict kept for the end of its job (`mark_misconfigured`). One
    transaction, so no claim ever sees such a net in service between a reset and a mark."""
    sync_nets(session, settings, now, at_start=True, still_wrong=problems)
    for name, problem in problems.items():
        if records.get_net(session, name).state != NetState.MISCONFIGURED:
            mark_misconfigured(session, name, problem, now)


def ensure_net_rows(session: Session, settings: Settings, now: datetime) -> None:
    """Create the rows of configured nets no worker has created yet, so a job that names a
    net can be stored (jobs.requested_net references nets.name); cheap when all exist."""
    configured = {n.name for n in settings.nets}
    # This read spares sync_nets' locked read when every row exists (a wrong answer would
    # make sync_nets run, which creates the same rows, but on every enqueue).
    present = set(session.scalars(select(Net.name).where(Net.name.in_(configured))))
    if present != configured:
        sync_nets(session, settings, now)
        session.flush()
