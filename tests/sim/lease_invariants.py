"""`step-redriven`: a job in the dispatch chain (ASSIGNED or DISPATCHING) that no message
holds any more (its next link or retry lost, its worker gone with it) is driven again within
one step lease and one monitor round (README, step leases: a worker's death costs at most
one lease and one interval). Round 4's fix 21: before it only a submit had a lease, and a job
whose chain was lost while it waited for readiness sat ASSIGNED until reconcile requeued it
past ready_timeout_s + STUCK_AFTER_S, which `job-state-bounded` allows.

A message holds the job if it is on the broker (due, delayed, a retry's countdown, restored
after an outage) or being run, as a step of the job's current attempt or as a link still to
come in a chain. The clock starts when none does, restarts when the job moves on (another
state or attempt) or is driven again (a new lease taken: a re-drive whose message the broker
then lost was a re-drive all the same), and stands still while the broker is down (nothing
can be sent then)."""

from __future__ import annotations

from app.sim.messages import Message
from app.sim.simulation import Simulation
from app.usecases.retries import submit_try_s
from app.usecases.step_leases import poll_lease_s, retry_budget_s, step_try_s
from models import JobState
from tests.sim.observer import Observer

CHAIN_STATES = (JobState.ASSIGNED, JobState.DISPATCHING)


class LeaseInvariants(Observer):
    """The clock of each chain job no message holds."""

    def start(self, sim: Simulation) -> None:
        super().start(sim)
        # job id -> (since when no message held it, its state, attempt and lease then)
        self._unheld: dict[str, tuple[float, JobState, int, str | None]] = {}

    def redrive_bound_s(self) -> float:
        """The longest lease a step takes (a readiness poll's, a retry's countdown and try,
        a submit's try) and one monitor round, plus what the profile may delay: the monitor
        round's message (delays), a worker's clock stepped back, a paused worker."""
        sim, p = self.sim, self.sim.profile
        settings = sim.settings
        lease = max(
            poll_lease_s(settings),
            settings.retry_backoff_max_s + step_try_s(settings),
            submit_try_s(settings),
        )
        slack = 2.0 + p.msg_delay_max_s + 4 * p.admin_latency_max_s + p.submit_latency_max_s
        if p.clock_step_p:
            slack += 30.0  # the worker that looks may have its clock 30 s behind
        if p.msg_drop or p.msg_refuse or p.worker_kill:
            # A monitor round's message lost, or its worker killed: the next round.
            slack += settings.housekeeping_interval_s + p.worker_restart_s
        if p.stall or p.last_try_stall or p.slow_scale_call:
            slack += max(p.stall_max_s, 2 * settings.stuck_after_s)
        return lease + settings.housekeeping_interval_s + slack

    def _held(self) -> set[tuple[str, int]]:
        """(job id, attempt) of every chain step a message holds."""
        held: set[tuple[str, int]] = set()
        sim = self.sim

        def note(kwargs: dict[str, object]) -> None:
            job, attempt = kwargs.get("job_id"), kwargs.get("attempt")
            if isinstance(job, str) and isinstance(attempt, int):
                held.add((job, attempt))

        messages: list[Message] = [*sim.broker.pending, *sim.current]
        for message in messages:
            note(message.kwargs)
            for _task, kwargs in message.chain:
                note(kwargs)
        return held

    def _lease(self, job_id: str) -> str | None:
        """The job's step lease as stored (`step_due_at`): a new one is a step driven."""
        row = self.sim.conn.execute(
            "SELECT step_due_at FROM jobs WHERE id = ?", (job_id.replace("-", ""),)
        ).fetchone()
        return None if row is None else row[0]

    def _step_redriven(self, t: float) -> None:
        chain = [j for j in self.jobs if j.state in CHAIN_STATES]
        if not chain:
            self._unheld.clear()
            return
        sim = self.sim
        held = self._held()
        down = bool(sim.broker.outages) and sim.broker.down_until(t) is not None
        settings = sim.settings
        budget_s = retry_budget_s(settings) + settings.stuck_after_s
        bound = self.redrive_bound_s()
        watched = set()
        for job in chain:
            if job.net is None or not sim.declared_net(job.net) or (job.id, job.attempt) in held:
                continue
            if job.state == JobState.DISPATCHING and t - job.changed_s > budget_s - 31.0:
                continue  # past its submit's budget: reconcile abandons it (job-state-bounded)
            watched.add(job.id)
            now = (job.state, job.attempt, self._lease(job.id))
            seen = self._unheld.get(job.id)
            if down or seen is None or seen[1:] != now:
                self._unheld[job.id] = (t, *now)
                continue
            # The worst share of the bound a seed saw (its stats: tests/sim/README.md).
            share = self.sim.stats.get("redrive_share", 0.0)
            self.sim.stats["redrive_share"] = max(share, round((t - seen[0]) / bound, 3))
            if t - seen[0] > bound:
                self.report(
                    "step-redriven",
                    f"job {job.id[:8]} {job.state} attempt {job.attempt}",
                    f"no message has held it for {t - seen[0]:.0f}s (bound {bound:.0f}s: a "
                    f"step lease and a monitor round) on net {job.net}: its chain was lost and "
                    "nothing drove it again",
                )
        for job_id in [j for j in self._unheld if j not in watched]:
            del self._unheld[job_id]
