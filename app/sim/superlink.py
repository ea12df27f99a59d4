"""The simulated Flower SuperLink (flwr 1.42): what a Flower net's server does with runs, where
it differs from the NVFLARE server of app.sim.servers. The SimServer, its sites (SuperNodes),
its partitions and its driver are the same; the runs' records are Flower's:

- No submit token: every start-run starts a new run, whatever its config says. The adapter
  (app.adapters.flower.client) finds a run by the token it puts in the run config; the
  record keeps it (`Run.token`).
- States: pending (until the SuperExec claims the run), starting (its ServerApp starts),
  running, finished:completed / failed / stopped. A ServerApp waiting for a SuperNode that
  never connects runs on (the strategy waits): no SUBMITTED-for-good as in NVFLARE.
- A stop is final: the record reads finished:stopped at once, the SuperLink refuses every
  later call of the run (flwr's `check_abort`), and a pending run is never started. No run
  goes on after a stop (NVFLARE's deaf runs and its job runner's revival do not apply).
- A restart: an in-memory SuperLink forgets every run (and kills them); one with a state
  database (`NetSpec.keeps_jobs`) keeps the records: a claimed run (starting or running)
  died with its ServerApp and reads as it was until its task's token expires (30-60 s: the
  last heartbeat's ttl), then finished:failed "Task failed because the run expired" (LOST);
  a pending run is claimed by the new SuperLink's SuperExec and runs after all.
- No start time: the client answers `NO_START_TIME` (app.adapters.flower.client).
- A list of every run refused while `lists_refused` is set (the sweep's adversary, its
  IDLE worlds): the token lookup and the live runs fail, a run's own status answers.
- Faults that never end (the sweep's adversary, tests.sim.flower_faults): from `gone_from`
  on, the replica runs but nothing answers (a wrong address, a broken Control API), across
  every restart; from `refuses_stops_from` on, it answers but refuses every StopRun.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app.sim.clock import EPOCH_S
from app.sim.host import Host
from app.sim.servers import Run, SimServer, parse_token
from app.sim.workload import COMPLETED

FLOWER = "flower"
FINISHED = "finished"
EXPIRED = "Task failed because the run expired"  # flwr 1.42, a primary task's token expired
# The ServerApp's own verdict (FAILED) and a failure without one (LOST): classify.run_status.
APP_FAILED = "ServerApp failed with exception: RuntimeError (simulated)"
CUT_OFF = "Task failed with unknown error."
_ID_BASE = 7_000_000_000_000_000_000  # Flower run ids are unsigned 64-bit numbers


def record(run: Run, t: float) -> tuple[str, str, str, str]:
    """The run's record as the SuperLink's ListRuns gives it: (status, sub_status, details,
    running_at as ISO text, "" if it never ran)."""
    ran = run.starts_at is not None and not run.dormant and run.starts_at <= t
    running_at = _iso(run.starts_at) if ran and run.starts_at is not None else ""
    if run.aborted(t):
        began, stop = run.starts_at, run.aborted_at
        ran_first = began is not None and stop is not None and began <= stop
        return FINISHED, "stopped", "", running_at if ran_first else ""
    if run.killed_at is not None:
        if run.expires_at is not None and t < run.expires_at:
            # Its ServerApp died with the SuperLink; the record does not know it yet.
            killed = run.killed_at
            if run.starts_at is not None and killed < run.starts_at:
                return "starting", "", "", ""
            return "running", "", "", running_at
        return FINISHED, "failed", EXPIRED, ""
    if run.end_at is not None and run.end_at <= t:
        if run.outcome == COMPLETED:
            return FINISHED, "completed", "", ""
        if run.outcome == "FINISHED:EXECUTION_EXCEPTION":
            return FINISHED, "failed", APP_FAILED, ""
        return FINISHED, "failed", CUT_OFF, ""
    if run.pending(t):
        return "pending", "", "", ""
    if run.starts_at is not None and t < run.starts_at:
        return "starting", "", "", ""
    return "running", "", "", running_at


def _iso(at: float) -> str:
    return datetime.fromtimestamp(EPOCH_S + at, UTC).isoformat()


@dataclass
class SuperLink(SimServer):
    """One Flower net's SuperLink process: its Control API, its SuperNodes (the sites), and
    its runs' records (in memory, or in a state database that outlives it: `keeps_jobs`)."""

    # Its own draws: a stream no NVFLARE server uses (worlds without a Flower net unchanged).
    flower_rng: random.Random = field(default_factory=lambda: random.Random(0))
    # The token whose next start-run loses its reply after starting the run (the sweep's
    # adversary, tests.sim.flower_faults: another submit of the attempt got in first).
    lose_reply_of: str | None = None
    # Faults that never end (tests.sim.flower_faults): from then on, for good.
    gone_from: float | None = None  # the replica runs, nothing answers
    refuses_stops_from: float | None = None  # it answers, every StopRun is refused
    # A list of the runs (the token lookup, the live runs) refused while it is set, one run's
    # status still read (tests.sim.flower_faults' IDLE: a blip over the round ending a job).
    lists_refused: bool = False

    def gone(self, t: float) -> bool:
        """Nothing answers for good (only an operator can mend it)."""
        return self.gone_from is not None and t >= self.gone_from

    def refuses_stops(self, t: float) -> bool:
        """Every StopRun is refused for good (only an operator can mend it)."""
        return self.refuses_stops_from is not None and t >= self.refuses_stops_from

    def answering(self, t: float) -> bool:
        return not self.gone(t) and super().answering(t)

    def start(self, t: float, rng: random.Random, no_start_time_p: float = 0.0) -> None:
        """Up: a SuperLink tells no start time at all (no NVFLARE "no start time" quirk);
        with a state database, its SuperExec claims the runs still pending in it."""
        super().start(t, rng)
        assert self.up_at is not None
        for run in self.store.values():
            if not run.dormant or run.aborted_at is not None:  # a stopped run never starts
                continue
            run.dormant = False
            run.claimed_at = self.up_at + self.boot_s + self.flower_rng.uniform(0.2, 2.0)
            run.starts_at = run.claimed_at + run.start_s
            run.end_at = None if run.duration_s is None else run.starts_at + run.duration_s

    def kill_runs(self, t: float, runs: list[Run]) -> None:
        """Claimed runs die with their ServerApps; with a state database a pending run waits
        in it for the next SuperLink (dormant: live, it will run), and a dead run's record
        reads as it was until its task's token expires."""
        database = self.spec.keeps_jobs
        for run in runs:
            if run.net != self.name or not run.live(t):
                continue
            if database and run.pending(t):
                run.dormant, run.end_at = True, None
                continue
            run.killed_at = t
            if database:
                run.expires_at = t + self.flower_rng.uniform(30.0, 60.0)

    def new_run(self, host: Host, token: str, t: float, number: int) -> Run:
        """A start-run: always a new run (the token is only the run config's)."""
        job_id, attempt = parse_token(token)
        spec = host.job_spec(job_id)
        faults = host.faults
        duration = spec.duration_s if spec is not None else 60.0
        outcome = spec.outcome if spec is not None else COMPLETED
        rng = host.rng  # the same fault draws as an NVFLARE run's
        if duration is not None and rng.random() < faults.hung_run:
            duration = None
        if rng.random() < faults.failed_run:
            outcome = rng.choice(("FINISHED:EXECUTION_EXCEPTION", "FINISHED:ABNORMAL"))
        flower = self.flower_rng
        claimed = t + flower.uniform(0.2, 2.0)  # the SuperExec's next poll claims it
        slow = faults.slow_start and flower.random() < faults.slow_start
        start_s = flower.uniform(2.0, 20.0) if slow else flower.uniform(0.5, 3.0)
        # The ServerApp runs from then on; its rounds wait for the job's SuperNodes (for one
        # that never connects, for ever: the run hangs running, never SUBMITTED as NVFLARE's).
        begin = claimed + start_s
        for site in spec.sites if spec is not None else ():
            connects = self.site_connects_at(site)
            if connects is None:
                duration = None
            else:
                begin = max(begin, connects)
        run = Run(
            net=self.name,
            nvflare_id=str(_ID_BASE + number),
            token=token,
            job_id=job_id,
            attempt=attempt,
            incarnation=self.incarnation,
            submitted_at=t,
            end_at=None if duration is None else begin + duration,
            outcome=outcome,
            poisoned=rng.random() < faults.poisoned_status,
            starts_at=claimed + start_s,
            claimed_at=claimed,
            start_s=start_s,
            duration_s=None if duration is None else begin + duration - (claimed + start_s),
        )
        self.store[run.nvflare_id] = run
        return run
