"""The simulated NVFLARE server: one net's server process (its admin port, its sites, its job
store) and the runs it holds, as they really are (not as any client believes). A Flower
net's server is a SimServer with Flower's records of runs (app.sim.superlink.SuperLink).

Servers restart (a new start time; their runs forgotten, or kept "RUNNING" forever as
NVFLARE 2.9 does after a SIGKILL).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from app.sim.clock import EPOCH_S
from app.sim.workload import COMPLETED, NetSpec

ABORTED = "FINISHED:ABORTED"
JOB_ID_LEN = 36  # a UUID in its canonical text form, as submit tokens start with it


@dataclass
class Run:
    """One NVFLARE run as it really is (not as any client believes)."""

    net: str
    nvflare_id: str
    token: str
    job_id: str
    attempt: int | None
    incarnation: int
    submitted_at: float
    end_at: float | None  # None: hangs (reports RUNNING forever)
    outcome: str  # its final status if it ends by itself
    poisoned: bool  # job_status never answers for it
    waiting: bool = False  # SUBMITTED for good: a required site never connects
    aborted_at: float | None = None
    killed_at: float | None = None  # its server process died under it
    deaf: bool = False  # an abort is accepted but does not stop it
    # The server's job runner deploys and starts the run until then (status DISPATCHED);
    # None: it starts as it is submitted.
    starts_at: float | None = None
    # An abort accepted while the job runner was starting the run: NVFLARE 2.9's runner
    # then overwrites the FINISHED:ABORTED mark and the run goes on from here.
    revives_at: float | None = None
    # A Flower run's (app.sim.superlink): pending until the SuperExec claims it, then
    # starting for `start_s`, then running for `duration_s` (None: for ever); `expires_at`:
    # the record of a run killed with its SuperLink reads as it was until then; `dormant`:
    # pending in the state database of a SuperLink that is down (it runs once one is up).
    claimed_at: float | None = None
    start_s: float = 0.0
    duration_s: float | None = None
    expires_at: float | None = None
    dormant: bool = False

    def pending(self, t: float) -> bool:
        """A Flower run no SuperExec has claimed yet (never true of an NVFLARE run)."""
        return self.dormant or (self.claimed_at is not None and t < self.claimed_at)

    def aborted(self, t: float) -> bool:
        """An abort has stopped the run (one the job runner overwrote stops it only until
        the runner is done starting it)."""
        return self.aborted_at is not None and (self.revives_at is None or t < self.revives_at)

    def aborted_unstarted(self, t: float) -> bool:
        """It reads FINISHED:ABORTED with no start time: aborted before the runner started it."""
        if not self.aborted(t) or self.aborted_at is None:
            return False
        return self.waiting or (self.starts_at is not None and self.aborted_at < self.starts_at)

    def starting(self, t: float) -> bool:
        """The job runner is deploying or starting the run now."""
        return self.starts_at is not None and t < self.starts_at

    def live(self, t: float) -> bool:
        """The run's processes are running (it occupies the server, it may produce results)."""
        if self.aborted(t) or self.killed_at is not None:
            return False
        return self.end_at is None or t < self.end_at

    def completed(self, t: float) -> bool:
        """It ran to FINISHED:COMPLETED (its results count)."""
        return (
            not self.aborted(t)
            and self.killed_at is None
            and self.end_at is not None
            and self.end_at <= t
            and self.outcome == COMPLETED
        )

    def status(self, t: float) -> str:
        """The raw NVFLARE status the server reports."""
        if self.aborted(t):
            return ABORTED
        if self.killed_at is not None:
            return "RUNNING"  # NVFLARE 2.9 after a SIGKILL: the dead run reads RUNNING forever
        if self.end_at is not None and self.end_at <= t:
            return self.outcome
        if self.waiting:
            return "SUBMITTED"
        return "DISPATCHED" if self.starting(t) else "RUNNING"


def parse_token(token: str) -> tuple[str, int | None]:
    """(job id, attempt) of a submit token `<job id>-<attempt>[.<dispatch>]`."""
    job_id, _, rest = (
        token[:JOB_ID_LEN],
        token[JOB_ID_LEN : JOB_ID_LEN + 1],
        token[JOB_ID_LEN + 1 :],
    )
    try:
        return job_id, int(rest.split(".")[0])
    except ValueError:
        return job_id, None


@dataclass
class SimServer:
    """One net's NVFLARE server process (its admin port, its sites, its job store)."""

    spec: NetSpec
    up_at: float | None = None  # the process's start time; None while it is down
    incarnation: int = 0
    boot_s: float = 1.0
    site_delays: tuple[float, ...] = ()
    store: dict[str, Run] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    partition_until: float = -1.0
    partitions: list[tuple[float, float]] = field(default_factory=list)
    # The workers' last admin call found it not answering (a partition, a reset): what they
    # know of its runs is from before, so a lost-run verdict is theirs to make (the checker's
    # completed-run-rerun asks this, not whether it answers at the check's instant).
    refused_last: bool = False
    kit_broken: bool = False
    # The server a redeploy's kit (a Flower net's certificate) names instead of this one, and
    # what the workers' client then meets: nothing answering there (`unreachable`), a
    # server that refuses the kit (`refused`), or another net's server that answers as its
    # own (`another`: `kit_other`, which knows none of this net's runs). None: the kit is
    # right (tests.sim.kits).
    kit_elsewhere: str | None = None
    kit_answer: str = "unreachable"
    kit_other: str | None = None
    no_start_time_until: float = -1.0
    # Added to every site's delay at each start (tests.sim.late_starts: sites that connect
    # well after the server answers); drawn nothing, so every other world is as it was.
    sites_late_s: float = 0.0
    # Windows in which every submit reaches the server but its reply is lost (a proxy that
    # times out answers): a dispatch's every retry, the last included, and reconcile's
    # re-sent submits with the same token all lose theirs.
    reply_loss: list[tuple[float, float]] = field(default_factory=list)
    # Runs whose final status a client has read (the dispatcher saw them end), once the
    # handler that read it ended with no database error after the read (`Simulation.
    # after_message`): a read whose write failed, or whose worker died, saw nothing.
    finished_seen: set[str] = field(default_factory=set)
    # The reads of a final status not yet confirmed so, by the message that made them.
    finished_read: dict[int, set[str]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self, t: float, rng: random.Random, no_start_time_p: float = 0.0) -> None:
        self.incarnation += 1
        self.up_at = t
        cold = self.spec.cold_start
        if cold is not None:
            self.boot_s = cold.login_s
            self.site_delays = tuple(cold.sites_s for _ in self.spec.sites)
        else:
            self.boot_s = rng.uniform(0.5, 4.0)
            self.site_delays = tuple(rng.uniform(0.5, 8.0) for _ in self.spec.sites)
        if self.sites_late_s:
            self.site_delays = tuple(d + self.sites_late_s for d in self.site_delays)
        if no_start_time_p and rng.random() < no_start_time_p:
            self.no_start_time_until = t + self.boot_s + rng.uniform(5.0, 40.0)
        if not self.spec.keeps_jobs:
            self.store.clear()
            self.tokens.clear()

    def stop(self, t: float, runs: list[Run]) -> None:
        """The process dies: every live run on it dies too (zombies stay in the store)."""
        if self.up_at is None:
            return
        self.kill_runs(t, runs)
        self.up_at = None
        if not self.spec.keeps_jobs:
            self.store.clear()
            self.tokens.clear()

    def kill_runs(self, t: float, runs: list[Run]) -> None:
        """The runs the process dies with: every live one (a SuperLink's: app.sim.superlink)."""
        for run in runs:
            if run.net == self.name and run.live(t):
                run.killed_at = t

    def partition(self, start: float, end: float) -> None:
        """The admin port is unreachable from `start` to `end` (the server runs on)."""
        self.partition_until = max(self.partition_until, end)
        self.partitions.append((start, end))

    def partitioned_at(self, t: float) -> bool:
        return any(start <= t < end for start, end in self.partitions)

    def answering(self, t: float) -> bool:
        return (
            self.up_at is not None and t >= self.up_at + self.boot_s and t >= self.partition_until
        )

    def reachable(self, t: float) -> bool:
        """The dispatcher's admin client can talk to it (up, not partitioned, kit fine)."""
        return self.answering(t) and not self.kit_broken and self.kit_elsewhere is None

    def booting(self, t: float) -> bool:
        return self.up_at is not None and t < self.up_at + self.boot_s

    def sites(self, t: float) -> tuple[str, ...]:
        if self.up_at is None:
            return ()
        ready_at = self.up_at + self.boot_s
        return tuple(
            s for s, d in zip(self.spec.sites, self.site_delays, strict=True) if t >= ready_at + d
        )

    def site_connects_at(self, site: str) -> float | None:
        """When `site` is (or was) connected to this incarnation; None: never."""
        if self.up_at is None or site not in self.spec.sites:
            return None
        return self.up_at + self.boot_s + self.site_delays[self.spec.sites.index(site)]

    def start_time(self) -> float:
        assert self.up_at is not None
        return EPOCH_S + self.up_at
