"""What the invariants keep between steps and read from the world: the jobs, nets and holds
as the simulation's `WorldState` last read them (app.sim.state), the cluster's TRUE record of
runs, and the since-when clocks the bounded checks use. The checks themselves are the
families built on it (tests.sim.invariants, tests.sim.run_invariants, tests.sim.quiescence,
tests.sim.prewarm_invariants, tests.sim.call_invariants)."""

from __future__ import annotations

from app.sim.bounds import Bounds
from app.sim.servers import Run
from app.sim.simulation import Simulation
from app.sim.state import HoldRow, JobRow, NetRow, _secs, _uuid
from app.sim.superlink import SuperLink
from app.usecases import declared_nets
from models import ACTIVE_JOB_STATES, JobState, NetState

J = JobState
__all__ = ["HoldRow", "J", "JobRow", "NetRow", "Observer", "_secs", "_uuid"]


class Observer:
    """Keeps what it needs between steps (last history rows seen, since-when clocks)."""

    sim: Simulation

    def start(self, sim: Simulation) -> None:
        """Watch `sim` from now on (its first worker has started)."""
        self.sim = sim
        self._job_event_id = 0
        self._net_event_id = 0
        self._job_state: dict[str, JobState] = {}
        self._net_state: dict[str, NetState] = {}
        self._unneeded_since: dict[str, float] = {}
        self._refused_at: tuple[float, frozenset[str]] = (0.0, frozenset())  # (t, driver broken)
        self._orphan_since: dict[str, float] = {}
        self._dead_since: dict[str, float] = {}
        self._completions: dict[str, bool] = {}
        self._seen_answering: dict[str, float] = {}
        self._starved_since: dict[str, float] = {}
        self._undeclared_at: dict[str, float] = {}  # net -> last seen undeclared
        self._unreachable_at: dict[str, float] = {}  # net -> last seen not answering
        self._token_unreached_at: dict[str, float] = {}  # Flower net -> last not reached
        self._lists_refused_at: dict[str, float] = {}  # Flower net -> last lists refused
        self._held_unlisted_at: dict[str, float] = {}  # Flower net -> last claimed, run unlisted
        self._held_runs: dict[str, str] = {}  # job id -> the run id it held at the last step
        self._claims_seen: set[tuple[str, int]] = set()
        self._active_before: set[str] = set()  # jobs active at the last step (tests.sim.drains)
        self._drained_before: set[str] = set()  # nets drained at the last step

    # --- the world as the simulation last read it (app.sim.state) ---------------------------

    @property
    def bounds(self) -> Bounds:
        return self.sim.bounds

    @property
    def jobs(self) -> list[JobRow]:
        return self.sim.state.jobs

    @property
    def nets(self) -> list[NetRow]:
        return self.sim.state.nets

    @property
    def holds(self) -> list[HoldRow]:
        return self.sim.state.holds

    @property
    def _has_strays(self) -> bool:
        return self.sim.state.has_strays

    def read(self) -> None:
        self.sim.state.read()

    def held(self, net: str, t: float) -> bool:
        return self.sim.state.held(net, t)

    def job(self, job_id: str) -> JobRow | None:
        return self.sim.state.job(job_id)

    def needed(self, net: str) -> bool:
        return self.sim.state.needed(net)

    def _waits_for_its_stray(self, job_id: str) -> bool:
        return self.sim.state.waits_for_its_stray(job_id)

    # --- reporting ---------------------------------------------------------------------------

    def report(self, invariant: str, subject: str, detail: str) -> None:
        """Record a violation (once per invariant and subject: the simulation keeps them)."""
        self.sim.report(invariant, subject, detail)

    def counts(self, run: Run) -> bool:
        """Whether the dispatcher counts this run as its job's run."""
        job = self.job(run.job_id)
        if job is None or job.state not in ACTIVE_JOB_STATES or job.net != run.net:
            return False
        if job.nvflare_id is not None:
            return job.nvflare_id == run.nvflare_id
        return job.token == run.token and job.state in (J.DISPATCHING, J.ABORTING)

    def recorded_stray(self, run: Run) -> bool:
        """The dispatcher knows this run is a stray (a stray_runs row, where that table
        exists: it does not on the code before the fix). A row names its run by id, or by
        token where no id is known, as settle_stray_runs finds it (a token's later run,
        submitted again on a new process, is not the row's). On a Flower net a row's token
        names every run of it, id known or not: settling it looks the token up, which stops
        the token's later runs (`FlowerControlClient.find_run`)."""
        if not self._has_strays:
            return False
        by_lookup = isinstance(self.sim.cluster.servers.get(run.net), SuperLink)
        row = self.sim.conn.execute(
            "SELECT 1 FROM stray_runs WHERE net_name = ? AND (nvflare_job_id = ? OR"
            " ((nvflare_job_id IS NULL OR ?) AND submit_token = ?)) LIMIT 1",
            (run.net, run.nvflare_id, by_lookup, run.token),
        ).fetchone()
        return row is not None

    def _counted_completion(self, run: Run, t: float) -> bool:
        """A completed run counts if the dispatcher saw it complete (a status read answered
        its end), or could have: after it completed, while its job still held its id, its
        server answered (and still knew it) for three housekeeping intervals with the broker
        up, so monitor rounds asked, not all of them failed by a per-call fault. (A run that
        finished while its server was unreachable, or just before the server died, cannot be
        told from a lost run.)"""
        counted = self._completions.get(run.nvflare_id)
        if counted is not None:
            return counted
        server = self.sim.cluster.servers[run.net]
        job = self.job(run.job_id)
        # Held by its id: a run known only by its submit token (a DISPATCHING job whose
        # reply was lost) is seen only when a submit or token lookup reaches the server.
        held = job is not None and job.nvflare_id == run.nvflare_id
        if not held or run.poisoned:  # a status that never answers hides the completion
            self._completions[run.nvflare_id] = False
            return False
        if run.nvflare_id in server.finished_seen:
            self._completions[run.nvflare_id] = True  # a status read answered its end
            return True
        if server.reachable(t) and run.nvflare_id in server.store:
            since = self._seen_answering.setdefault(run.nvflare_id, t)
            # Less the broker's outages: no beat tick, so no monitor round asks meanwhile
            # (chaos 2420: a run completed 16 s into 84 s of outage, its server scaled to 0
            # by hand just before the broker came back; nothing could have seen the end).
            if (
                t - self._after_broker_outages(since, t)
                >= 3 * self.sim.world.housekeeping_interval_s
            ):
                self._completions[run.nvflare_id] = True  # a monitor round saw it answer
                return True
        else:
            self._seen_answering.pop(run.nvflare_id, None)
        return False  # undecided: asked again at the next step

    def _after_broker_outages(self, since: float, t: float) -> float:
        """The start of a wait counted from `since`, moved later by the time the broker was
        down between `since` and `t` (overlapping windows counted once): no message is
        delivered and no beat tick sent meanwhile, so no housekeeping round can end it."""
        down, reach = 0.0, since
        for began, ended in sorted(self.sim.broker.outages):
            start, end = max(began, reach), min(ended, t)
            if end > start:
                down += end - start
                reach = end
        return since + down

    def _removal_slack(self, net: str | None) -> float:
        """A job on a net NETS no longer declares is settled only once no process has
        declared the net for `declared_nets.undeclared_after_s` (a rolling deploy may still be
        adding it), then by the next reconcile rounds: its bounds grow by that much."""
        if net is None or self.sim.declared_net(net):
            return 0.0
        reconcile = 2 * self.sim.world.housekeeping_interval_s
        return declared_nets.undeclared_after_s(self.sim.settings) + 2 * reconcile
