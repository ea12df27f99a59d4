"""Prewarm holds (tasks/README.md "Prewarm"): which holds are live, where a held net's idle grace
starts, and how one open hold is settled (used, expired, failed). Read by the idle
scale-down, the status pages and the metrics; written by the warm-up and the cancel."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, exists, select
from sqlalchemy.orm import Session

from app.errors import NetDrained, NetMisconfigured
from app.read_models import NetHold
from models import (
    ACTIVE_JOB_STATES,
    Job,
    Net,
    NetState,
    Prewarm,
    PrewarmOutcome,
    StrayRun,
)

# What a live prewarm's `status` says of its server: coming up, or up and held.
WARMING = "warming"
HELD = "held"

UP = (NetState.READY, NetState.BUSY)


def startable(session: Session, net_name: str) -> bool:
    """No job holds the net and no run is left on its server (what a claim asks too)."""
    busy = exists().where(Job.net_name == net_name, Job.state.in_(ACTIVE_JOB_STATES))
    stray = exists().where(StrayRun.net_name == net_name)
    return not session.scalar(select(busy | stray))


def misconfigured_error(net: Net) -> NetMisconfigured:
    why = f": {net.last_error}" if net.last_error else ""
    return NetMisconfigured(
        f"net {net.name} is MISCONFIGURED{why}; nothing was started (an operator must fix "
        "its settings and restart the dispatcher first)",
        net_name=net.name,
    )


def drained_error(net_name: str, fitting: list[str] | None = None) -> NetDrained:
    """A prewarm is refused, not held, on a drained net: a drained net takes no new job, so
    warming or holding its server could only keep it up for nothing and hold back the
    drain's end (its scale to zero); the caller learns at once, and may hint again after
    the undrain."""
    which = (
        f"every net with its sites is drained ({', '.join(fitting)})"
        if fitting
        else (f"net {net_name} is drained")
    )
    return NetDrained(
        f"{which}: it takes no new job until an operator undrains it (a redeploy, most "
        "likely); nothing was started or held, hint again after the undrain",
        net_name=net_name,
    )


@dataclass(frozen=True)
class Hold:
    """A live hold on a net: the one that ends last."""

    caller_key: str
    hold_until: datetime
    ready: bool

    def view(self) -> NetHold:
        """As /fl/status shows it."""
        return NetHold(
            caller_key=self.caller_key,
            hold_until=self.hold_until.isoformat(),
            status=HELD if self.ready else WARMING,
        )


def live_holds(session: Session, now: datetime) -> dict[str, Hold]:
    """Each held net's live hold that ends last (open, before its deadline)."""
    holds: dict[str, Hold] = {}
    for net_name, key, until, ready_at, state in session.execute(
        select(
            Prewarm.net_name, Prewarm.caller_key, Prewarm.hold_until, Prewarm.ready_at, Net.state
        )
        .join(Net, Net.name == Prewarm.net_name)
        .where(Prewarm.outcome.is_(None), ~Prewarm.refused, Prewarm.hold_until > now)
    ):
        if net_name is None or (net_name in holds and holds[net_name].hold_until >= until):
            continue
        holds[net_name] = Hold(key, until, ready_at is not None or state in UP)
    return holds


def hold_end(hold_until: datetime, ended_at: datetime | None) -> datetime:
    return min(hold_until, ended_at) if ended_at is not None else hold_until


def idle_start(session: Session, net_name: str, idle_since: datetime) -> datetime:
    """When the net's idle grace starts: when it went idle, or when the last hold on it
    ended, whichever is later. A live hold ends in the future: the net is not idle yet.
    (This is where every hold is honoured: the idle scale-down asks it under the net's
    row lock.)"""
    ends = [
        hold_end(until, ended)
        for until, ended in session.execute(
            select(Prewarm.hold_until, Prewarm.ended_at).where(
                Prewarm.net_name == net_name, Prewarm.hold_until > idle_since, ~Prewarm.refused
            )
        )
    ]
    return max([idle_since, *ends])


def idle_from_holds(session: Session, net_name: str, started: datetime, now: datetime) -> datetime:
    """Where a prewarmed net's idle clock starts once it is up: now while a hold on it is
    live, else the end of the last hold that wanted this start (hold end + grace bounds the
    server); now if no hold did."""
    ends = [
        hold_end(until, ended)
        for until, ended in session.execute(
            select(Prewarm.hold_until, Prewarm.ended_at).where(
                Prewarm.net_name == net_name, Prewarm.hold_until > started, ~Prewarm.refused
            )
        )
    ]
    return min(now, max(ends)) if ends else now


def idle_starts(session: Session) -> dict[str, datetime]:
    """`idle_start` of every READY net a hold defers (the others: their idle_since), in
    one read, for the metrics and the pages."""
    starts: dict[str, datetime] = {}
    for name, since, until, ended in session.execute(
        select(Net.name, Net.idle_since, Prewarm.hold_until, Prewarm.ended_at)
        .join(
            Prewarm,
            and_(
                Prewarm.net_name == Net.name,
                Prewarm.hold_until > Net.idle_since,
                ~Prewarm.refused,
            ),
        )
        .where(Net.state == NetState.READY)
    ):
        earlier = starts.get(name) or since or until
        starts[name] = max(earlier, hold_end(until, ended))
    return starts


def wanted_sites(session: Session, net_name: str, now: datetime) -> list[str]:
    """Every site the net's live holds wait for."""
    wanted: set[str] = set()
    for sites in session.scalars(
        select(Prewarm.required_sites).where(
            Prewarm.net_name == net_name,
            Prewarm.outcome.is_(None),
            ~Prewarm.refused,
            Prewarm.hold_until > now,
        )
    ):
        wanted.update(sites)
    return sorted(wanted)


def end_hold(row: Prewarm, outcome: PrewarmOutcome, at: datetime, detail: str) -> None:
    row.outcome = outcome
    row.ended_at = min(at, row.hold_until)
    row.detail = detail[:2000]


def settle_row(session: Session, row: Prewarm, now: datetime) -> str:
    """Settle one open hold if it has ended: its deadline past (expired), its net
    MISCONFIGURED (failed). `used` is never inferred here: the claim that uses a hold ends
    it in its own transaction (claims._use_holds), so a hold still open was not seen by any
    claim before it. Inferring it from times compared a claim's and a hint's timestamps,
    written by two processes whose clocks may disagree: a hint taken by a worker whose clock
    was stepped back read as older than a claim made before it, and was settled used by it."""
    if row.net_name is None:
        return ""  # (an accepted prewarm always names its net)
    if row.hold_until <= now:
        end_hold(row, PrewarmOutcome.EXPIRED, row.hold_until, "no job came within its time")
        return "expired"
    net = session.get(Net, row.net_name)
    if net is not None and net.state == NetState.MISCONFIGURED:
        end_hold(row, PrewarmOutcome.FAILED, now, str(misconfigured_error(net)))
        return "failed: net misconfigured"
    return ""


def wanted_hold(session: Session, net_name: str, now: datetime) -> str | None:
    return session.scalar(
        select(Prewarm.caller_key)
        .where(
            Prewarm.net_name == net_name,
            Prewarm.outcome.is_(None),
            ~Prewarm.refused,
            Prewarm.hold_until > now,
        )
        .limit(1)
    )
