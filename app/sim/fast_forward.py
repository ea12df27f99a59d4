"""The fast clock (`Simulation(..., fast_forward=True)`, fault-free worlds with no
adversary): which beat loops have anything to do now (a `Calm`), the ticks skipped when none
has (the clock jumps to the world's next change), and a readiness poll jumped to the first
poll that can see the server ready. Errs towards "due": a loop run for nothing costs time,
never a decision."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from app.sim.calm import Calm
from app.sim.clock import seconds_of
from app.sim.view import SimView
from models import ASSIGNABLE_NET_STATES


class FastClock:
    """The fast clock's side of a simulation."""

    def __init__(self, sim: SimView) -> None:
        self.sim = sim

    def calm(self) -> Calm:
        """fast_forward: which beat loops have something to do now, and when the world next
        changes by itself. Read from the tables and the fake world; errs towards "due" (a
        loop run for nothing costs time, never a decision)."""
        sim = self.sim
        calm = Calm()
        drivers = sim.cluster.drivers.values()
        if sim.broker.work_pending() or sim.armed():
            calm.in_flight = True
        if any(d.start_at is not None or d.stop_at is not None for d in drivers):
            calm.in_flight = True
            if any(d.stop_at is not None for d in drivers):
                calm.reconcile_due = True  # a scale-down is confirmed by reconcile
        conn = sim.conn
        if conn.execute("SELECT 1 FROM stray_runs LIMIT 1").fetchone() is not None:
            calm.in_flight = calm.reconcile_due = True
        t = sim.clock.t
        sim.cluster.advance(t)
        next_event = sim.next_event_time()
        if next_event is not None:
            calm.times.append(next_event)
        queued: list[str | None] = []
        active: set[str] = set()
        to_settle: set[str] = set()  # nets with a run monitor would settle or stop now
        # Reconcile acts on a job or a starting net only past STUCK_AFTER_S (its smallest
        # threshold) or ABORT_TIMEOUT_S in that state.
        stuck_s = min(self.sim.world.stuck_after_s, self.sim.world.abort_timeout_s)
        for state, net, requested, nvflare_id, dispatched, changed in conn.execute(
            "SELECT state, net_name, requested_net, nvflare_job_id, dispatched_at,"
            " state_changed_at FROM jobs WHERE state IN ('QUEUED', 'RUNNING', 'ASSIGNED',"
            " 'DISPATCHING', 'FINISHING', 'ABORTING')"
        ):
            if state == "QUEUED":
                queued.append(requested)
                continue
            if net is not None:
                active.add(net)
            if state in ("FINISHING", "ABORTING"):
                calm.monitor_due = True  # monitor settles aborts and report waits
                if state == "ABORTING" and net is not None:
                    to_settle.add(net)
            if state != "RUNNING" or net is None or nvflare_id is None or dispatched is None:
                calm.in_flight = True  # a step of the pipeline, an abort, a report wait
                if t - seconds_of(datetime.fromisoformat(changed)) > stuck_s:
                    calm.reconcile_due = True
                continue
            run = self.sim.cluster.servers[net].store.get(nvflare_id)
            if run is None or not run.live(t):
                calm.monitor_due = True  # ended: the next monitor round settles it
                to_settle.add(net)
                continue
            config = self.sim.settings.net(net)
            max_run_s = (
                config.max_run_s if config.max_run_s is not None else self.sim.world.max_run_s
            )
            deadline = seconds_of(datetime.fromisoformat(dispatched)) + max_run_s
            if deadline <= t:
                calm.monitor_due = True
                to_settle.add(net)
            calm.times.append(deadline)
            if run.end_at is not None:
                calm.times.append(run.end_at)
        calm.awaited_due = any(any(r in (None, n) for r in queued) for n in to_settle)
        held = self._holds(calm, t)
        for name, state, idle_since, changed in conn.execute(
            "SELECT name, state, idle_since, state_changed_at FROM nets"
        ):
            up = self.sim.cluster.replicas(name) > 0
            if (
                state in ASSIGNABLE_NET_STATES
                and name not in active
                and any(r in (None, name) for r in queued)
            ):
                calm.assign_due = True  # assign places a job there
            # A declared always-on net at zero is reconcile's to bring up (`watch_always_on`):
            # skipping its rounds left one STOPPED at zero through a rest (tests.sim's seed
            # 3877, a Flower STEP world's fast clock after the human's restart).
            always_on = self.sim.declared_net(name) and not self.sim.scales_to_zero(name)
            if state == "STOPPED" and not up and not always_on:
                continue
            if state == "BUSY" and name in active and up:
                continue
            if state == "STARTING" and name in active:
                calm.in_flight = True  # a cold start for a job: its pipeline drives it
                if t - seconds_of(datetime.fromisoformat(changed)) > stuck_s:
                    calm.reconcile_due = True
                continue
            if state != "READY" or name in active or not up:
                calm.in_flight = calm.reconcile_due = True  # stopping, unhealthy, drifted...
                continue
            if self.sim.scales_to_zero(name):
                since = seconds_of(datetime.fromisoformat(idle_since or changed))
                # prewarm_holds.idle_start: the grace starts at the last hold's end if later
                since = max([since, *held.get(name, ())])
                expiry = since + self.sim.settings.net(name).idle_timeout_s
                if expiry <= t:
                    calm.scale_down_due = True
                calm.times.append(expiry)
        return calm

    def _holds(self, calm: Calm, t: float) -> dict[str, list[float]]:
        """Prewarm holds as the fast clock must see them (app.usecases.prewarm.holds): a
        live hold on a net that is down wants it started again by the scale-down round's
        settling (due now); and each READY net's holds that end after it went idle, as
        their ends in seconds, where its idle grace starts instead. Both reads find nothing
        in a replay without hints."""
        conn = self.sim.conn
        for net, until in conn.execute(
            "SELECT p.net_name, p.hold_until FROM prewarms p JOIN nets n ON n.name ="
            " p.net_name WHERE p.outcome IS NULL AND NOT p.refused AND n.state = 'STOPPED'"
        ):
            if seconds_of(datetime.fromisoformat(until)) > t and not self.sim.cluster.replicas(net):
                calm.scale_down_due = True
        ends: dict[str, list[float]] = {}
        for net, until, ended in conn.execute(
            "SELECT p.net_name, p.hold_until, p.ended_at FROM prewarms p JOIN nets n ON"
            " n.name = p.net_name WHERE n.state = 'READY' AND NOT p.refused AND"
            " p.hold_until > coalesce(n.idle_since, n.state_changed_at)"
        ):
            end = min(until, ended) if ended is not None else until  # prewarm_holds.hold_end
            ends.setdefault(net, []).append(seconds_of(datetime.fromisoformat(end)))
        return ends

    def beats_to_skip(
        self, beats: list[tuple[str, float]], next_beat: list[float]
    ) -> tuple[set[str], Calm]:
        """The beat loops due now that would find nothing to do (not sent), and, when no
        loop has anything to do, every beat moved on to its first tick at or after the
        world's next change (fast_forward)."""
        calm = self.calm()
        skip = {task for task, _ in beats if not calm.needs(task)}
        until = calm.quiet_until(self.sim.clock.t)
        if until is not None:
            for i, (_, period) in enumerate(beats):
                if next_beat[i] < until:
                    next_beat[i] += math.ceil((until - next_beat[i]) / period) * period
        return skip, calm

    def poll_delay(self, kwargs: dict[str, Any]) -> float:
        """READY_POLL_S; with fast_forward and a fixed cold start, the whole number of polls
        until the first one that can see the server ready (or the readiness deadline pass):
        the ones in between would answer NOT_READY and write nothing."""
        poll = self.sim.settings.ready_poll_s
        net = kwargs.get("net_name")
        if "job_id" not in kwargs and isinstance(net, str):
            return self._warm_poll_delay(net)
        spec = self.sim.job_spec(str(kwargs.get("job_id")))
        if not self.sim.fast_forward or net not in self.sim.cluster.drivers or spec is None:
            return poll
        driver = self.sim.cluster.drivers[net]
        server = driver.server
        cold = server.spec.cold_start
        if cold is None:
            return poll
        never = any(site not in server.spec.sites for site in spec.sites)
        if driver.start_at is not None:
            ready = driver.start_at + cold.login_s + cold.sites_s
        elif driver.running and server.up_at is not None:
            connects = [server.site_connects_at(site) for site in spec.sites]
            ready = max([server.up_at + server.boot_s, *(c for c in connects if c is not None)])
        else:
            return poll
        row = self.sim.conn.execute(
            "SELECT assigned_at FROM jobs WHERE id = ?", (kwargs["job_id"].replace("-", ""),)
        ).fetchone()
        if row is None or row[0] is None:
            return poll
        deadline = (
            seconds_of(datetime.fromisoformat(row[0])) + self.sim.settings.net(net).ready_timeout_s
        )
        target = deadline if never else min(ready, deadline)
        ahead = target - self.sim.clock.t
        return poll if ahead <= poll else math.ceil(ahead / poll) * poll

    def _warm_poll_delay(self, net: str) -> float:
        """A prewarm's warm-up poll (READY_POLL_S), jumped as a job's readiness poll is: to
        the first poll that can see the net's server up with every site of the net's own
        connected (with a fixed cold start, all of them connect at once), or its readiness
        deadline, while the net is STARTING; the polls in between answer NOT_READY and
        write nothing."""
        poll = self.sim.settings.ready_poll_s
        driver = self.sim.cluster.drivers.get(net)
        if not self.sim.fast_forward or driver is None or driver.server.spec.cold_start is None:
            return poll
        server, cold = driver.server, driver.server.spec.cold_start
        if driver.start_at is not None:
            ready = driver.start_at + cold.login_s + cold.sites_s
        elif driver.running and server.up_at is not None:
            connects = [server.site_connects_at(site) for site in server.spec.sites]
            ready = max([server.up_at + server.boot_s, *(c for c in connects if c is not None)])
        else:
            return poll
        row = self.sim.conn.execute(
            "SELECT state, state_changed_at FROM nets WHERE name = ?", (net,)
        ).fetchone()
        if row is None or row[0] != "STARTING":
            return poll
        since = seconds_of(datetime.fromisoformat(row[1]))
        target = min(ready, since + self.sim.settings.net(net).ready_timeout_s)
        ahead = target - self.sim.clock.t
        return poll if ahead <= poll else math.ceil(ahead / poll) * poll
