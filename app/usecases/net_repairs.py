"""The reconciler's repairs of one declared net, each decided on the round's read of it and
re-checked under the net's row lock: drift between the nets table and what the driver sees,
a scale-to-zero net whose chain was lost, an always-on server watched for an OUTAGE, and a
net found misconfigured taken out of service."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session, aliased

from app.adapters.backend import Readiness, ServerState
from app.db import unit_of_work
from app.errors import MisconfigurationError, TransientError
from app.runtime import Runtime
from app.usecases import records
from app.usecases.failed_starts import (
    ADOPTED_START,
    SETTLE_START,
    SETTLING_STARTS,
    give_up_failed_start,
)
from app.usecases.fleet import NetRow
from app.usecases.outages import ask_unrecorded, overdue_start, start_age_s, start_clock
from app.usecases.prewarm.holds import idle_from_holds, wanted_hold, wanted_sites
from app.usecases.prewarm.warm_up import mark_ready
from app.usecases.scaling import (
    net_misconfigured,
    runs_revive,
    scale_net,
    stop_in_flight,
    stop_net,
)
from models import JobState, NetEvent, NetState, StrayRun

log = logging.getLogger(__name__)

# The longest a STOPPED net holding overdue strays rests at zero before it is started again
# to settle them (`_settle_rest_s`): a mended server settles its strays within the hour.
SETTLE_REST_MAX_S = 3600.0


def settle_misconfigured(rt: Runtime, name: str, row: NetRow, exc: MisconfigurationError) -> str:
    """Take a net reconcile found misconfigured out of service. A job only claimed onto it
    (ASSIGNED) goes back to the queue with it, never left on a net a restart resets to
    STOPPED; a job past that point is its chain's or the monitor's to settle first."""
    state, changed_at = _net_state(rt, name)
    if state == NetState.MISCONFIGURED:
        return f"misconfigured: {exc}"
    if changed_at != row.changed_at and state in (NetState.READY, NetState.OUTAGE):
        # A server's answer moved it since the read (a driver call stalled across it): the next
        # round judges it (an always-on OUTAGE answering under a denial is READY, round 16).
        return f"not judged: {exc} (the net moved on since this round read it)"
    if row.job_id is not None and row.job_state != JobState.ASSIGNED:
        return f"misconfigured: {exc} (left to job {row.job_id}, {row.job_state})"
    bound = (JobState.ASSIGNED, row.attempt)
    if not net_misconfigured(rt, name, row.job_id, str(exc), attempt=bound):
        if row.job_id is None:
            return f"misconfigured: {exc} (a job claimed the net meanwhile: left to its chain)"
        return f"misconfigured: {exc} (job {row.job_id} moved on: left to it)"
    return f"misconfigured: {exc}"


def _net_state(rt: Runtime, name: str) -> tuple[NetState, datetime]:
    with rt.sessions() as session:
        net = records.get_net(session, name)
        return net.state, net.state_changed_at


def _set_net_state(
    rt: Runtime,
    name: str,
    expected: NetState,
    target: NetState,
    reason: str,
    *,
    require_idle: bool = False,
    since: datetime | None = None,
) -> bool:
    """Move a net only if it is still in `expected` (and, with `require_idle`, still has no
    active job; with `since`, still in the state it entered then: not in it again since),
    checked under the row lock assignment takes."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        if net.state != expected or (since is not None and net.state_changed_at != since):
            return False
        if require_idle and records.active_job(session, name) is not None:
            return False
        if target == NetState.READY:
            now = rt.clock()
            # A start a prewarm asked for idles from the end of its last hold once every
            # hold ended: a late READY never buys a fresh grace past hold end + grace.
            # So does one that went to OUTAGE as always-on and is back to scale-to-zero mode
            # (misconfig seed 9241), as `_back_up` has it.
            began = (
                net.state_changed_at
                if expected == NetState.STARTING
                else _start_of(session, name)
                if expected == NetState.OUTAGE
                else None
            )
            idle_since = now if began is None else idle_from_holds(session, name, began, now)
            net.transition(NetState.READY, now, reason)
            net.idle_since = idle_since
        else:
            net.transition(target, rt.clock(), reason)
        return True


def _hold_wants(rt: Runtime, name: str) -> bool:
    """A live prewarm hold wants the net up."""
    with rt.sessions() as session:
        return wanted_hold(session, name, rt.clock()) is not None


def _back_up(rt: Runtime, name: str, expected: NetState) -> NetState | None:
    """A reachable always-on server ends its net's OUTAGE (or a state scale-to-zero mode
    left): BUSY if a job still holds the net, else READY, decided under the row lock, not
    on the round's earlier read (the job may have ended since). None: the net moved on."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        if net.state != expected:
            return None
        held = records.active_job(session, name) is not None
        if held and expected != NetState.OUTAGE:
            return None  # a job claimed it meanwhile: its chain moves it
        target = NetState.BUSY if held else NetState.READY
        net.answered()  # a failure the monitor counted is over: its runs are not lost
        now = rt.clock()
        began = _start_of(session, name) if expected == NetState.OUTAGE else None
        net.transition(target, now, "always-on server reachable")
        if target == NetState.READY:
            # A start past its deadline (`overdue_start`) that came up late idles from its
            # holds' end, as one found up while STARTING (seed 4946): no fresh grace.
            net.idle_since = now if began is None else idle_from_holds(session, name, began, now)
        return target


def _start_of(session: Session, name: str) -> datetime | None:
    """When the net's start began, if its last move was that start's STARTING -> OUTAGE."""
    moves = session.execute(
        select(NetEvent.from_state, NetEvent.to_state, NetEvent.at)
        .where(NetEvent.net_name == name)
        .order_by(NetEvent.id.desc())
        .limit(2)
    ).all()
    if not moves or moves[0].from_state != NetState.STARTING:
        return None
    return moves[1].at if len(moves) > 1 and moves[1].to_state == NetState.STARTING else None


def _start_to_settle(rt: Runtime, name: str, stopped_at: datetime) -> str:
    """A STOPPED net whose stray runs wait in its server's state database (a run pending
    when the server went away starts with the next one): no job may be claimed onto it, nor
    its strays' jobs anywhere, until they are settled, and only a server that answers can
    stop them. So it is started, job-less (STARTING, READY once up, as a prewarm's start);
    each reconcile's settling stops them once it answers, and the idle net is scaled down
    as any other (simulation seeds 870, 947, 1387). Once a stray is overdue (older than
    ABORT_TIMEOUT_S when the net last stopped) the server failed to settle it at least
    once: the net rests at zero as long as the stray had waited then, at most
    SETTLE_REST_MAX_S, so a SuperLink that never answers (or never lets the run be stopped)
    is started ever less often, not every round, and one that is mended is tried again
    within the hour."""
    rest_s = _settle_rest_s(rt, name, stopped_at)
    # (A clock stepped back behind the stop cannot say how long the net rested: no rest.)
    if 0 <= (rt.clock() - stopped_at).total_seconds() < rest_s:
        return ""
    # Only the stop this round read: a round stalled across a new stop leaves it its own rest.
    started = NetState.STOPPED, NetState.STARTING, SETTLE_START
    if not _set_net_state(rt, name, *started, require_idle=True, since=stopped_at):
        return ""
    if rest_s:
        log.error(
            "stray runs need an operator: net started again to settle them",
            extra={"net": name, "reason": f"rested {rest_s:.0f}s at zero"},
        )
    scale_net(rt, name, 1, "stray runs kept in the server's state database: start to settle")
    return "STOPPED with stray runs its state database keeps: started to settle them"


def _settle_rest_s(rt: Runtime, name: str, stopped_at: datetime) -> float:
    """How long a STOPPED net holding strays rests at zero before it is started to settle
    them: 0 while its oldest stray had waited less than ABORT_TIMEOUT_S when the net
    stopped, or while no settling start was made since that stray was recorded and since a
    human last put the net back in service from MISCONFIGURED (nothing failed to settle it:
    a start that found the settings wrong tried nothing, and the restart after the fix is
    the human saying "try again"); else that wait (doubling from one start to the next), at
    most SETTLE_REST_MAX_S. A stray recorded after the stop by the clock (a clock stepped
    back behind it) has a wait no one can read: the longest rest once a settling start was
    tried within that long before the stop, so the step brings back no storm of starts. The
    fix bounds the starts by the order of the net's events, which no clock step changes."""
    with rt.sessions() as session:
        oldest = session.scalar(
            select(func.min(StrayRun.created_at)).where(StrayRun.net_name == name)
        )
        if oldest is None:
            return 0.0
        waited_s = (stopped_at - oldest).total_seconds()
        if 0 <= waited_s < rt.settings.abort_timeout_s:
            return 0.0
        # The human's fix by its place in the net's history, not by its time: a clock
        # stepped back behind the fix dates every later start before it (misconfig 241,
        # forced drift 1617: no start counted, a start every round).
        fix = aliased(NetEvent)
        fixed = select(func.coalesce(func.max(fix.id), 0)).where(
            fix.net_name == name, fix.from_state == NetState.MISCONFIGURED
        )
        # Since the stray, or, its wait unreadable, within the longest rest before the stop
        # (a start of yesterday's, for another stray, says nothing of this one).
        since = oldest if waited_s >= 0 else stopped_at - timedelta(seconds=SETTLE_REST_MAX_S)
        tried = session.scalar(
            select(
                exists().where(
                    NetEvent.net_name == name,
                    NetEvent.to_state == NetState.STARTING,
                    NetEvent.reason.in_(SETTLING_STARTS),
                    NetEvent.at >= since,
                    *([NetEvent.at <= stopped_at] if waited_s < 0 else []),
                    NetEvent.id > fixed.scalar_subquery(),
                )
            )
        )
    if not tried:
        return 0.0
    return min(waited_s, SETTLE_REST_MAX_S) if waited_s >= 0 else SETTLE_REST_MAX_S


def forget_dead_strays(rt: Runtime, name: str) -> str:
    """A MISCONFIGURED net at zero replicas whose runs do not revive: its strays died with
    the server, as at a STOPPED net's zero replicas. Forgotten, not asked of a server that
    does not run every round until a human's fix (misconfig seeds 16 and 50)."""
    with unit_of_work(rt.sessions) as session:
        records.clear_stray_runs(session, name)
    return "MISCONFIGURED at zero replicas: stray runs gone with the server"


def repair_scaling_net(rt: Runtime, name: str, row: NetRow) -> str:  # noqa: PLR0912
    """Settle a scale-to-zero net left between states or drifted from its driver; the
    note says what was done ("" for nothing)."""
    state, changed_at = row.state, row.changed_at
    job_state, job_id, attempt = row.job_state, row.job_id, row.attempt
    now = rt.clock()
    age_s = (now - changed_at).total_seconds()
    if state == NetState.BUSY:
        return ""  # monitor owns busy nets
    if job_id is not None:
        if state == NetState.STARTING and job_state == JobState.ASSIGNED:
            return _redrive_lost_scale_up(rt, name, job_id, attempt, age_s)
        return ""
    observation = rt.driver(name).observe()
    up = observation.running > 0 or observation.pending > 0 or observation.desired > 0
    if state == NetState.MISCONFIGURED:
        # A misconfigured net must not keep a server running (a failed scale-down earlier).
        if up and _still(rt, name, state):
            stop_net(rt, name, "misconfigured net still had a server")
            return "MISCONFIGURED net had a server; scaled to 0"
        if not up and row.strays and not runs_revive(rt, name):
            return forget_dead_strays(rt, name)
        return ""
    if state == NetState.STOPPED and not up and row.strays:
        if runs_revive(rt, name):
            return _start_to_settle(rt, name, changed_at)
        # The server is confirmed at zero replicas: whatever it ran died with it.
        with unit_of_work(rt.sessions) as session:
            records.clear_stray_runs(session, name)
        return "STOPPED at zero replicas: stray runs gone with the server"
    if state in (NetState.STOPPING, NetState.UNHEALTHY):
        if stop_in_flight(row.stop_due_at, now):
            # Finishing the stop now would let a job claim the net and start it, and that
            # call land on it after: the call records the net down itself when it lands.
            return ""
        # Decided on the round's read: re-checked under the lock, so a net that was stopped
        # and claimed since (STARTING, its job's server coming up) keeps its replica.
        if not _still(rt, name, state):
            return ""
        stop_net(rt, name, f"settling {state}")
        return f"{state}: scale-down re-driven"
    if state == NetState.OUTAGE:
        # PER_JOB_FL_SERVER was turned on across a redeploy: a former always-on net.
        target = NetState.READY if observation.is_up else NetState.STOPPED
        _set_net_state(rt, name, NetState.OUTAGE, target, "now scales to zero")
        return f"OUTAGE -> {target} (net scales to zero now)"
    if state == NetState.STARTING:
        # Its job went away (aborted, requeued) while the server came up, or a prewarm
        # started it (its warm_up may still be polling it). A settling start failing: no wait.
        if failed := give_up_failed_start(rt, name, observation):
            return failed
        # Its deadline counts from the first ask for its replica (a warm-up that ran late
        # asked for it then), as an always-on start's does; from STARTING if none was asked.
        clock = start_clock(rt, name, changed_at)
        if observation.is_up:
            note = _ready_once_ready(rt, name, clock.age_s, changed_at)
            if note is not None:
                return note
        overdue = clock.age_s > rt.settings.net(name).ready_timeout_s
        if overdue and clock.unasked and observation.desired > 0 and _hold_wants(rt, name):
            # A warm-up's ask between its driver call and its scale event (seed 5435); a
            # start no live hold wants is abandoned all the same.
            ask_unrecorded(rt, name, "reconcile")
            return "STARTING past its deadline, desired with no ask recorded: asked again"
        # Only the start this round read (its deadline is that start's): a round that stalled
        # across a stop and a new start leaves the new one to its own deadline.
        abandoned = overdue and _set_net_state(
            rt,
            name,
            NetState.STARTING,
            NetState.STOPPING,
            "start abandoned",
            require_idle=True,
            since=changed_at,
        )
        if abandoned:
            stop_net(rt, name, "start abandoned")
            return "STARTING without a job past the deadline: stopped"
        return ""
    if state == NetState.STOPPED and up and row.strays and runs_revive(rt, name):
        # A server started by hand (the stray alert's advice) on a net whose strays wait in
        # its state database: adopted as a settling start, not taken down as drift before
        # it could settle them.
        if _set_net_state(
            rt, name, NetState.STOPPED, NetState.STARTING, ADOPTED_START, require_idle=True
        ):
            return "STOPPED with a server and stray runs: adopted to settle them"
        return ""
    if state == NetState.STOPPED and up and age_s > rt.settings.stuck_after_s:
        # Drift: a server runs that nobody uses (e.g. a crash between scale and commit).
        # STOPPING first, under the lock and only if still STOPPED: no job can be claimed
        # onto the net while its server is being taken away (a claim moves a STOPPED net to
        # STARTING in its own transaction: test_a_drifted_server_is_left_to_a_job_claimed_
        # meanwhile). And only if still idle, however a job got there (a hand edit, a path
        # a later change adds): taking a server from a job's run is the one thing never to do
        # (test_a_drift_stop_never_takes_a_server_a_job_is_on_however_it_got_there).
        if _set_net_state(
            rt, name, NetState.STOPPED, NetState.STOPPING, "drift: server up", require_idle=True
        ):
            stop_net(rt, name, "drift: server up while STOPPED")
            return "drift: STOPPED net had a server; scaled to 0"
        return ""
    if state == NetState.READY and not up:
        if _set_net_state(
            rt, name, NetState.READY, NetState.STOPPED, "drift: server gone", require_idle=True
        ):
            return "drift: READY net had no server; now STOPPED"
        return ""  # a job was claimed onto the warm net meanwhile: its chain scales it up
    return ""


def _ready_once_ready(rt: Runtime, name: str, age_s: float, since: datetime) -> str | None:
    """A job-less STARTING net whose driver runs a replica is READY only once its server is,
    judged as warm_up judges it: the server answers and the sites its live holds wait for
    (else the net's required sites) are connected; past ready_timeout_s, a server that
    answers is READY all the same. None: past that deadline with no server answering (the
    start is to be abandoned); "" while it is not ready yet."""
    with rt.sessions() as session:
        sites = wanted_sites(session, name, rt.clock()) or list(
            rt.settings.net(name).required_sites
        )
    try:
        readiness = rt.admin(name).is_ready(sites)
    except TransientError as exc:  # not ready as far as anyone can tell (warm_up reads it so)
        readiness = Readiness(False, ServerState.UNREACHABLE, detail=f"transient: {exc}")
    past_deadline = age_s > rt.settings.net(name).ready_timeout_s
    if readiness.ready or (past_deadline and readiness.server_state == ServerState.STARTED):
        # Under the row lock: READY only while still STARTING with no job (a job claimed
        # meanwhile owns it), idle from its holds' end; the holds note when it was ready.
        if mark_ready(rt, name, readiness, "up, no job: idle", since):
            return "STARTING without a job: now READY (idle)"
        return ""
    return None if past_deadline else ""


def _still(rt: Runtime, name: str, state: NetState) -> bool:
    """The net is still in `state` with no active job, read under the row lock claims take.
    None of these states is one a claim takes a net from, so the answer holds until the
    scale-down that follows."""
    with unit_of_work(rt.sessions) as session:
        net = records.get_net(session, name, lock=True)
        return net.state == state and records.active_job(session, name) is None


def _redrive_lost_scale_up(
    rt: Runtime, name: str, job_id: uuid.UUID, attempt: int, age_s: float
) -> str:
    """A STARTING net whose job is still ASSIGNED but whose driver was never asked for a
    replica lost its chain before scale_up ran (a lost message, a dead worker): start it
    again. Every step is idempotent, so a chain that was merely slow does no harm."""
    if age_s <= rt.settings.stuck_after_s or rt.driver(name).observe().desired > 0:
        return ""
    rt.outbox.start_pipeline(str(job_id), name, attempt)
    return f"STARTING with no scale-up for {age_s:.0f}s: pipeline of job {job_id} re-driven"


def _ask_for_its_replica(rt: Runtime, name: str, state: NetState, job: uuid.UUID | None) -> None:
    """An always-on net left down gets its replica asked for if none is wanted."""
    try:
        if rt.driver(name).observe().desired < 1:
            scale_net(rt, name, 1, "always-on net: one replica")
    except MisconfigurationError as exc:
        # A platform refusing for good (a service or container gone, access denied) makes
        # the net MISCONFIGURED (README), unless it is an OUTAGE whose server answers again:
        # READY then (README: "Once the server answers"), as a net that never went down
        # reads no driver and stays READY through the same refusal.
        if state != NetState.OUTAGE or rt.admin(name).server_state() != ServerState.STARTED:
            raise
        log.warning("always-on replica not checked", extra={"net": name, "reason": str(exc)})
    except TransientError as exc:
        # A platform refusing every call (throttled, its API down) must not keep a start
        # that never comes up from paging: its deadline runs from the first ask all the same.
        if state == NetState.STARTING and job is None:
            overdue_start(rt, name, rt.admin(name).server_state())
        if state != NetState.OUTAGE:
            raise
        # Nor keep an OUTAGE whose server answers again paging: the server decides (the
        # watch reads it next), as before its replica was asked for; asked again next round.
        log.warning("always-on replica not checked", extra={"net": name, "reason": str(exc)})


def watch_always_on(rt: Runtime, name: str, row: NetRow) -> str:
    """An always-on server that cannot be reached is an OUTAGE, loudly; back again, READY.
    A start whose server is still not up past the readiness deadline is one too.
    A net left STOPPING, UNHEALTHY or STOPPED by scale-to-zero mode (PER_JOB_FL_SERVER
    turned off across a redeploy) is brought back up: always-on means one replica."""
    state, job = row.state, row.job_id
    if state == NetState.MISCONFIGURED:
        return ""
    net_config = rt.settings.net(name)
    scalable = net_config.driver.kind != "static"
    # An OUTAGE too: its replica lost (a docker container that exited reads as none wanted)
    # or scaled to zero by hand; nothing else would ask for it, and the net stayed an OUTAGE
    # at zero for good (round 15's break-it). Asked each round, as the platform's own
    # restart policy would: READY once the server answers.
    left_down = state in (
        NetState.STOPPING,
        NetState.UNHEALTHY,
        NetState.STOPPED,
        NetState.OUTAGE,
    ) or (
        # A start no job holds: a prewarm's across a redeploy, or a claim's whose job
        # ended before its scale_up; nothing else would ask for its replica.
        state == NetState.STARTING and job is None
    )
    if scalable and left_down:
        _ask_for_its_replica(rt, name, state, job)
    server = rt.admin(name).server_state()
    if server == ServerState.STARTED:
        if state == NetState.STARTING and job is None:
            # A start scale-to-zero mode left (a prewarm's, across a redeploy): READY as it
            # would be there, once its sites are connected, idle from its holds' end
            # (simulator seeds 8780, 4946: a READY with no site connected, a fresh grace).
            # Its deadline counts from the first ask, as `overdue_start`'s does.
            age_s = start_age_s(rt, name, row.changed_at)
            return _ready_once_ready(rt, name, age_s, row.changed_at) or ""
        left_behind = state in (
            NetState.OUTAGE,
            NetState.STOPPED,
            NetState.STOPPING,
            NetState.UNHEALTHY,
        )
        if left_behind:
            target = _back_up(rt, name, state)
            if target is None:
                return ""  # moved on since the round's read
            if state == NetState.OUTAGE:  # only an outage's end is logged as one
                log.warning("outage over", extra={"net": name})
            return f"{state} -> {target}"
        return ""
    note: str = ""
    if state == NetState.STARTING:
        note = overdue_start(rt, name, server) if job is None else ""
    elif state != NetState.OUTAGE:
        _set_net_state(rt, name, state, NetState.OUTAGE, f"always-on server {server}")
        log.error("OUTAGE: always-on server unreachable", extra={"net": name, "server": server})
        note = f"{state} -> OUTAGE"
    if (
        scalable
        and row.strays
        and not runs_revive(rt, name)
        and not rt.driver(name).observe().is_up
    ):
        # Scaled to zero by hand (or crashed for good): the runs it held died with it, and a
        # job waiting on its own stray run may go elsewhere instead of waiting for an operator.
        with unit_of_work(rt.sessions) as session:
            records.clear_stray_runs(session, name)
        note = (note + "; " if note else "") + "no server: stray runs gone with it"
    return note
