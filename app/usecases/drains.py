"""Drain (issue 40): take nets, or the whole deployment, out of the rotation before a
redeploy, and put them back.

A drained net (a `drains` row names it, or the whole deployment's row "*" exists) takes no
new claim (`claims._free`) and no prewarm (`prewarm`: refused, reason code `net_drained`);
what it runs finishes, a FINISHING job's hold for flip-api's report included; the idle
scale-down then takes its server to zero after the net's grace as usual, since no QUEUED
job counts as wanting a drained net (`claims.queued_job_fits`). QUEUED jobs wait: nothing
fails them or spends an attempt; a job every net it may run on is drained says "net
drained" in its `waiting_for`. The rows are the only record: a drain survives a restart of
every process, and the deployment's row covers nets added to NETS later.

`drain` locks the drained nets' rows, as a claim and a prewarm lock them, and commits
after any claim or prewarm that holds one, which it then counts (an active job shows in
`status`; a live hold it ends). A claim reads the drain in the statement that locks its
net and again in the one that picks the job, after that lock: on PostgreSQL the locking
statement's snapshot may predate the drain's commit while its lock comes after it, and the
next statement's own snapshot then sees the drain, so no claim lands on a net after its
drain said it drained (tests/integration/test_drain_pg.py). A prewarm let through the
locking statement that way is ended by the next
scale-down round (`prewarm_warm_up.settle_prewarms`). `undrain` deletes the rows and kicks
the assigner, which claims for the queued jobs at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app import names
from app.db import unit_of_work
from app.errors import InvalidRequest, quoted
from app.read_models import ActiveJob, DrainChanged, DrainedNet, DrainView, iso
from app.runtime import Runtime
from app.schemas import unstorable
from app.settings import Settings
from app.usecases import declared_nets
from app.usecases.prewarm.holds import end_hold, settle_row
from models import (
    ACTIVE_JOB_STATES,
    ALL_NETS,
    Drain,
    Job,
    JobState,
    Net,
    Prewarm,
    PrewarmOutcome,
)

log = logging.getLogger(__name__)

# The words a QUEUED job's `waiting_for` starts with when only drained nets could take it.
NET_DRAINED = "net drained"

# The longest reason a drain keeps: POST /drain's limit (app/entrypoints/README.md), the
# contract every door keeps (the CLI's `drain --reason` too).
DRAIN_REASON_MAX_CHARS = 500


_DRAINED_SCOPES = select(Drain.scope, Drain.drained_at)


def _since(scopes: dict[str, datetime], declared: Sequence[str]) -> dict[str, datetime]:
    """Each drained net (declared, or with a drain of its own kept) and when its drain
    began: the earlier of its own and the deployment's."""
    found = {scope: at for scope, at in scopes.items() if scope != ALL_NETS}
    whole = scopes.get(ALL_NETS)
    if whole is not None:
        for name in declared:
            own = found.get(name)
            found[name] = whole if own is None else min(own, whole)
    return found


@dataclass(frozen=True)
class _Target:
    everything: bool
    nets: tuple[str, ...]


def _target(nets: Sequence[str], everything: bool) -> _Target:
    if everything == bool(nets):
        raise InvalidRequest("name the nets to drain or undrain, or ask for all of them (--all)")
    return _Target(everything, tuple(dict.fromkeys(nets)))


def drain(
    rt: Runtime, nets: Sequence[str] = (), *, everything: bool = False, reason: str = ""
) -> DrainChanged:
    """Drain these declared nets, or the whole deployment (idempotent: a drain already in
    place keeps its time). Live prewarm holds on them end `cancelled`, so nothing keeps
    their servers up past the idle grace. InvalidRequest for a net NETS does not declare."""
    target = _target(nets, everything)
    _check_reason(reason)
    unknown = [n for n in target.nets if not rt.settings.has_net(n)]
    if unknown:
        known = ", ".join(n.name for n in rt.settings.nets) or "none"
        raise InvalidRequest(f"unknown net(s) {_named(unknown)} (known: {known})")
    now = rt.clock()
    scopes = (ALL_NETS,) if target.everything else target.nets
    with unit_of_work(rt.sessions) as session:
        declared_nets.ensure_net_rows(session, rt.settings, now)
        # The claim's lock (FOR UPDATE, no SKIP): a claim holding one of them commits first,
        # and every claim after this commit reads the drain (claims._lock_net).
        locked = select(Net.name).order_by(Net.name).with_for_update()
        if not target.everything:
            locked = locked.where(Net.name.in_(target.nets))
        held = list(session.scalars(locked))
        present = set(session.scalars(select(Drain.scope).where(Drain.scope.in_(scopes))))
        for scope in scopes:
            if scope not in present:
                session.add(Drain(scope=scope, drained_at=now, reason=reason))
        _end_holds(session, held, now)
        view = drain_state(session, _declared(rt.settings))
    log.info(
        "drained",
        extra={"net": "*" if target.everything else ",".join(target.nets), "reason": reason},
    )
    return DrainChanged(**view.model_dump(), notified=None)


def _named(unknown: Sequence[str]) -> str:
    """The unknown nets a message names: the first few, each quoted short and escaped (a
    body may list a thousand, each as long as it likes)."""
    shown = ", ".join(quoted(name) for name in unknown[:_NAMED_MAX])
    return shown + (f" and {len(unknown) - _NAMED_MAX} more" if len(unknown) > _NAMED_MAX else "")


_NAMED_MAX = 10


def _check_reason(reason: str) -> None:
    """InvalidRequest for a reason no drain keeps: longer than POST /drain takes, or text
    the database cannot hold (a NUL; a lone surrogate, as Python reads an argument typed in
    a Latin-1 terminal): refused, as `abort --reason` is, before any drain is written."""
    problem = unstorable(reason)
    if problem is not None:
        raise InvalidRequest(f"drain reason {problem}: it cannot be stored; no drain was made")
    if len(reason) > DRAIN_REASON_MAX_CHARS:
        raise InvalidRequest(
            f"drain reason of {len(reason)} characters: at most {DRAIN_REASON_MAX_CHARS}; "
            "no drain was made"
        )


def _end_holds(session: Session, net_names: list[str], now: datetime) -> None:
    """The live prewarm holds on the drained nets end now (`cancelled`, saying so)."""
    rows = session.scalars(
        select(Prewarm)
        .where(Prewarm.net_name.in_(net_names), Prewarm.outcome.is_(None), ~Prewarm.refused)
        .order_by(Prewarm.id)
        .with_for_update()
    )
    for row in rows:
        if settle_row(session, row, now):
            continue  # it had ended already (expired, failed): it says how
        end_hold(row, PrewarmOutcome.CANCELLED, now, f"net {row.net_name} drained")
        log.info(
            "prewarm ended by a drain", extra={"caller_key": row.caller_key, "net": row.net_name}
        )


def undrain(rt: Runtime, nets: Sequence[str] = (), *, everything: bool = False) -> DrainChanged:
    """Undrain these nets, or everything (the deployment's drain and every net's), and kick
    the assigner. Undraining one net while the whole deployment is drained is refused (it
    would change nothing): undrain --all, then drain the nets to keep drained."""
    target = _target(nets, everything)
    with unit_of_work(rt.sessions) as session:
        scopes = set(session.scalars(select(Drain.scope)))
        if not target.everything:
            if ALL_NETS in scopes:
                raise InvalidRequest(
                    "the whole deployment is drained, so these nets stay drained: undrain "
                    "--all, then drain the nets to keep drained"
                )
            unknown = [n for n in target.nets if n not in scopes and not rt.settings.has_net(n)]
            if unknown:
                raise InvalidRequest(f"unknown net(s) {_named(unknown)}, and none drained")
        gone = scopes if target.everything else scopes & set(target.nets)
        if gone:
            session.execute(delete(Drain).where(Drain.scope.in_(gone)))
        view = drain_state(session, _declared(rt.settings))
    notified = None
    if gone:
        log.info("undrained", extra={"net": ",".join(sorted(gone))})
        # Committed first: the round this kick starts reads the nets free again.
        notified = rt.outbox.send(names.ASSIGN_NEXT_JOB)
    return DrainChanged(**view.model_dump(), notified=notified)


def drain_view(rt: Runtime) -> DrainView:
    """What is drained now, and whether draining is complete (GET /drain, `status`)."""
    with rt.sessions() as session:
        return drain_state(session, _declared(rt.settings))


def _declared(settings: Settings) -> list[str]:
    return [n.name for n in settings.nets]


def drain_state(session: Session, declared: Sequence[str], queued: int | None = None) -> DrainView:
    """What is drained, in `session`, among the `declared` nets (and any net with a drain of
    its own): one read while nothing is (and the QUEUED count unless given), three while
    something is."""
    scopes = {scope: at for scope, at in session.execute(_DRAINED_SCOPES)}
    whole = scopes.get(ALL_NETS)
    since = _since(scopes, declared)
    if queued is None:
        queued = session.scalar(select(func.count()).where(Job.state == JobState.QUEUED)) or 0
    if not since and whole is None:
        return DrainView(
            state="none",
            complete=False,
            deployment=False,
            deployment_since=None,
            nets=[],
            queued=queued,
        )
    names_ = sorted(since)
    states = {
        n: s for n, s in session.execute(select(Net.name, Net.state).where(Net.name.in_(names_)))
    }
    active = {
        j.net_name: ActiveJob.of(j)
        for j in session.scalars(
            select(Job).where(Job.net_name.in_(names_), Job.state.in_(ACTIVE_JOB_STATES))
        )
    }
    nets = [
        DrainedNet(
            name=name,
            since=since[name].isoformat(),
            deployment=name not in scopes,
            declared=name in declared,
            state=states.get(name),
            active_job=active.get(name),
        )
        for name in names_
    ]
    complete = not active
    return DrainView(
        state="drained" if complete else "draining",
        complete=complete,
        deployment=whole is not None,
        deployment_since=iso(whole),
        nets=nets,
        queued=queued,
    )
