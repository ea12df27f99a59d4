"""How long each bounded condition may last: the time bounds the invariants hold the
dispatcher to, derived from the settings the world runs with plus a slack for what the fault
profile may legitimately delay; a clean world gets no slack beyond two beat ticks. The
simulation's run loop gives up waiting for the world to come to rest at the liveness bound
(a replay of `fl-dispatcher simulate` too)."""

from __future__ import annotations

from app.settings import Settings
from app.sim.deployment import Declared
from app.sim.faults import HUMAN_FIX_DELAY_S, FaultProfile
from app.sim.workload import WorldSpec
from app.usecases.retries import submit_try_s


class Bounds:
    """How long each bounded condition may last (simulated seconds): what the settings
    promise, plus what this fault profile may legitimately add to that one path."""

    def __init__(
        self, world: WorldSpec, p: FaultProfile, settings: Settings, declared: Declared
    ) -> None:
        tick = world.housekeeping_interval_s
        reconcile = 2 * tick
        budget = world.retry_budget_s() if not p.clean else 0.0
        stuck = world.stuck_after_s
        abort_timeout = float(getattr(settings, "abort_timeout_s", stuck))
        # Slack common to every path: a beat tick or two, delayed or redelivered messages,
        # slow admin calls.
        common = 2 * tick + p.msg_delay_max_s + p.admin_latency_max_s * 4 + p.submit_latency_max_s
        if p.worker_kill:
            common += p.worker_restart_s
        if p.stall or p.last_try_stall or p.slow_scale_call:
            # A task paused mid-way (or a scale call the platform answers late) finishes
            # its step that much later.
            common += max(p.stall_max_s, 2 * stuck)
        if p.retry_backlog:
            common += 90.0  # a retry that runs late behind a broker backlog
        partition = p.partition_max_s if (p.partition_rate or p.lost_reply_partition) else 0.0
        if p.outage_p:
            partition = max(partition, p.outage_max_s)
        stop_s = 20.0 if p.driver_slow else 4.0
        # Every net the platform has, with the timeouts NETS gives it now (or last gave it).
        nets = {n.name: n for n in (*world.nets, *world.spare)}
        nets |= {n.name: n for n in declared.nets}
        self.assigned = {
            n.name: n.ready_timeout_s + stuck + 2 * reconcile + common for n in nets.values()
        }
        # A submit is abandoned once its tries' own budget (every retry's wait and every
        # try's time, retries.submit_try_s) and STUCK_AFTER_S have passed.
        tries = world.retry_max * (world.retry_backoff_max_s + submit_try_s(settings))
        self.dispatching = stuck + 2 * reconcile + max(budget, tries) + common
        self.aborting = max(abort_timeout, stuck) + 2 * reconcile + budget + common
        # A driver broken for a while (up to 90 s, adversary._schedule_faults) cannot scale
        # anything down until it is fixed.
        broken = 90.0 if p.driver_broken_rate else 0.0
        self.idle = {
            n.name: max(n.idle_timeout_s, stuck, n.ready_timeout_s)
            + 2 * reconcile
            + stop_s
            + broken
            + common
            for n in nets.values()
        }
        self.orphan = stuck + 2 * reconcile + budget + common
        self.unaccounted = 2 * tick + common
        # A free net may legitimately refuse new jobs while it settles stray runs.
        self.starved = self.orphan + partition
        self.settle = max(world.server_lost_grace_s, partition) + 3 * tick + common
        self.max_run = world.max_run_s + 3 * tick + common
        self.finishing = world.report_timeout_s + 2 * tick + common
        # A prewarm's row is settled (used, expired, cancelled, failed written down) by a
        # scale-down round within a few ticks of its hold's end, once faults have stopped.
        self.prewarm_settle = 3 * tick + common
        # Every job ends within `liveness_s(its max_attempts)` after faults stop: a human's
        # fix of a broken setting, each attempt given up at its readiness deadline and
        # waiting its turn again, then a whole run, then some ticks.
        self.per_attempt = max(self.assigned.values()) + self.starved
        self.liveness = HUMAN_FIX_DELAY_S + world.max_run_s + 8 * tick

    def liveness_s(self, max_attempts: int) -> float:
        """How long after faults stop a job with this many attempts must have ended."""
        return self.liveness + max_attempts * self.per_attempt
