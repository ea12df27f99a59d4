"""What scale-to-zero saves on a workload, by idle grace: `fl-dispatcher simulate`.

Each grace value replays the trace through the same `Simulation` the bug-hunting sweep uses
(the real use cases and tables, beat, the Celery-like message layer), fault-free, with fake
servers whose cold start takes fixed, configurable times (`ColdStart`) and runs that last
their traced duration. One more replay with every net always on gives each job's wait
without cold starts; a job's added wait is its wait at a grace minus that one. A trace with
prewarm hints is replayed at each grace twice, without its hints and with them (each hint
sent as flip-api's `prewarm` task at its time). The human table and the plot:
`app.sim.savings_table`.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from app.net_config import NetConfig
from app.schemas import PREWARM_WITHIN_MAX_S, job_id_for
from app.settings import Settings
from app.sim.clock import seconds_of
from app.sim.db import template_db
from app.sim.faults import CLEAN
from app.sim.forked import in_processes
from app.sim.simulation import Simulation
from app.sim.trace import Trace, TraceError
from app.sim.workload import ColdStart, JobSpec, NetSpec, PrewarmSpec, Workload, WorldSpec

DEFAULT_GRACES = (0.0, 60.0, 300.0, 600.0, 1800.0)
# This repository's local NVFLARE 2.9 (server and two sites on one machine; the local driver
# starts the server process at once and stops it synchronously): the means of
# `python -m tests.bench.bench_cold_start --reps 6 --down 20` (app/sim/README.md "Simulating
# scale-to-zero"). A site re-registers on its own retry timer, so one cold start's `sites`
# is about 6-8 s or 16-18 s; the mean is what server-hours add up to.
LOCAL = ColdStart("local", provision_s=0.0, login_s=3.2, sites_s=13.4, stop_s=0.1)
# ECS Fargate: placing the task, pulling the NVFLARE image and starting the container come
# first, and a stopped task drains for a while. NOT measured here (no AWS from this
# machine): an assumption to replace with what your cluster shows (the STARTING -> READY
# times in the net history), e.g. `--cold-start 60,3.2,13.4,30`.
FARGATE = ColdStart("fargate", provision_s=60.0, login_s=3.2, sites_s=13.4, stop_s=30.0)
PROFILES = {p.name: p for p in (LOCAL, FARGATE)}


def _default(name: str) -> Any:
    """The dispatcher's own default for a setting (what a deployment runs with)."""
    fields = Settings.model_fields if name in Settings.model_fields else NetConfig.model_fields
    return fields[name].default


# A hint asks for its lead plus this margin (`within_s`). In a replay its job is claimed a
# second or so after it is submitted (the enqueue, then assign's kick); a caller cannot time
# its lead to the second, and a hold that ends just before the claim costs a whole cold
# start while a used hold ends at the claim, costing nothing more. So the margin is one
# scale-down round (HOUSEKEEPING_INTERVAL_S, 15 s): the dispatcher's own slack in acting on
# a hold's end. It costs server time only where the job is claimed onto another net.
HINT_MARGIN_S = float(_default("housekeeping_interval_s"))


@dataclass(frozen=True)
class GraceResult:
    """The figures of one grace value."""

    grace_s: float
    server_h: float  # server-hours used (replica asked for or running), scale-to-zero nets
    saved_h: float  # always-on server-hours minus server_h
    saved_pct: float
    cold_starts: int
    wait_p50_s: float  # added wait per job against the always-on replay
    wait_p95_s: float
    wait_max_s: float
    cold_waits: int  # jobs whose server was started while they waited
    unfinished: int  # jobs that did not complete (should be 0: the replay is fault-free)
    wall_s: float  # how long the replay took (wall clock)


@dataclass(frozen=True)
class HintedResult(GraceResult):
    """One grace's figures replayed with the trace's prewarm hints."""

    hints: int = 0  # prewarms accepted
    hints_used: int = 0  # of those, a job was claimed onto the held net while it held
    hints_refused: int = 0  # prewarms the dispatcher refused (should be 0)
    # The p95 added wait of the hinted jobs alone, replayed without their hints and with
    # them: what a hint buys the job it was sent for (the p95 of every job also counts the
    # unhinted ones, which a hint cannot help).
    hinted_p95_none_s: float = 0.0
    hinted_p95_s: float = 0.0


@dataclass(frozen=True)
class Report:
    """Every grace's figures and the recommended one."""

    source: str
    jobs: int
    nets: tuple[str, ...]
    horizon_h: float
    utilization: float
    always_on_h: float
    cold_start: ColdStart
    wait_budget_s: float  # the p95 added wait a recommended grace may cost
    results: tuple[GraceResult, ...]
    recommended_s: float | None
    wall_s: float
    # A trace with prewarm hints: each grace replayed with them too (empty: no hints).
    hinted_jobs: int = 0
    hint_margin_s: float = HINT_MARGIN_S
    hinted_results: tuple[HintedResult, ...] = ()
    hinted_recommended_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values (the hinted figures only for a hinted trace)."""
        data = asdict(self)
        data["cold_start"] = asdict(self.cold_start) | {"total_s": self.cold_start.total_s}
        if not self.hinted_jobs:
            for key in ("hinted_jobs", "hint_margin_s", "hinted_results", "hinted_recommended_s"):
                del data[key]
        return data


@dataclass(frozen=True)
class Replay:
    """One replay's raw outcome."""

    waits: dict[int, float]  # trace index -> wait from submission to dispatch
    up_s: float  # scale-to-zero nets' server-seconds
    cold_starts: int
    cold_waits: int
    unfinished: int
    wall_s: float
    hints: int = 0  # prewarms accepted, used and refused (app.sim.savings.HintedResult)
    hints_used: int = 0
    hints_refused: int = 0


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (`q` in 0..100): the smallest value with at least q% of
    the values at or below it; 0 for no values."""
    if not values:
        return 0.0
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def seen_cold_start_s(cold: ColdStart) -> float:
    """One cold start as the dispatcher can see it, the default wait budget: the server's
    own time, plus up to one READY_POLL_S until a readiness poll sees it ready, plus up to one
    AWAITED_POLL_S for a job queued behind the cold-started one (its start follows the poll
    that sees the run before it end, which in the always-on replay fell elsewhere)."""
    return float(cold.total_s + _default("ready_poll_s") + _default("awaited_poll_s"))


def recommend(results: Sequence[GraceResult], budget_s: float) -> float | None:
    """The cheapest grace (fewest server-hours; the shorter grace on a tie) whose p95 added
    wait stays within the budget; None if none does."""
    fitting = [r for r in results if r.wait_p95_s <= budget_s]
    if not fitting:
        return None
    return min(fitting, key=lambda r: (r.server_h, r.grace_s)).grace_s


def world_for(
    trace: Trace,
    nets: Sequence[str],
    grace_s: float | None,
    cold: ColdStart,
    timings: Mapping[str, float] | None = None,
) -> WorldSpec:
    """The simulated deployment: every net has every site the trace needs, the dispatcher's
    default timings (`timings` overrides WorldSpec fields, e.g. a deployment's own
    housekeeping_interval_s); grace None: every net always on (the baseline)."""
    sites = trace.sites()
    longest = max((j.duration_s for j in trace.jobs), default=0.0)
    specs = tuple(
        NetSpec(
            name=name,
            kind="ecs" if grace_s is not None else "static",
            idle_timeout_s=grace_s if grace_s is not None else 0.0,
            ready_timeout_s=max(float(_default("ready_timeout_s")), 3 * cold.total_s),
            sites=sites,
            cold_start=cold,
        )
        for name in nets
    )
    world = WorldSpec(
        nets=specs,
        housekeeping_interval_s=_default("housekeeping_interval_s"),
        keep_alive_interval_s=_default("keep_alive_interval_s"),
        awaited_poll_s=_default("awaited_poll_s"),
        ready_poll_s=_default("ready_poll_s"),
        retry_max=_default("retry_max"),
        retry_backoff_max_s=_default("retry_backoff_max_s"),
        stuck_after_s=_default("stuck_after_s"),
        server_lost_grace_s=_default("server_lost_grace_s"),
        # A traced job must run its traced length, not be cut by the limit.
        max_run_s=max(float(_default("max_run_s")), 2 * longest),
        abort_timeout_s=_default("abort_timeout_s"),
        max_attempts=_default("max_attempts"),
    )
    return dataclasses.replace(world, **(timings or {}))  # type: ignore[arg-type]


def workload_for(trace: Trace) -> Workload:
    """The trace's jobs as the simulation's caller submits them, and their hints as its
    prewarms: sent `hint_lead_s` before the job, for the job's net (or its sites), asking
    for the lead plus HINT_MARGIN_S. The prewarm's key is the job's (prewarms have keys of
    their own), and the job names it (`prewarm_key`), so its claim prefers the held net."""
    jobs = tuple(
        JobSpec(
            key=f"job-{i:06d}",
            arrive_s=j.submitted_at,
            duration_s=j.duration_s,
            net=j.net,
            sites=j.required_sites,
            priority=j.priority,
            prewarm_key=None if j.hint_lead_s is None else f"job-{i:06d}",
        )
        for i, j in enumerate(trace.jobs)
    )
    prewarms = tuple(
        PrewarmSpec(
            at_s=j.submitted_at - j.hint_lead_s,
            key=f"job-{i:06d}",
            within_s=min(j.hint_lead_s + HINT_MARGIN_S, PREWARM_WITHIN_MAX_S),
            net=j.net,
            sites=j.required_sites,
        )
        for i, j in enumerate(trace.jobs)
        if j.hint_lead_s is not None
    )
    return Workload(
        jobs=jobs, horizon_s=max((j.arrive_s for j in jobs), default=0.0), prewarms=prewarms
    )


def check_nets(trace: Trace, nets: Sequence[str]) -> None:
    """TraceError naming each line that asks for a net the simulation does not have."""
    known = set(nets)
    bad = [
        f"{trace.source}:{j.line}: net {j.net!r} is not one of the simulated nets"
        f" ({', '.join(nets)})"
        for j in trace.jobs
        if j.net is not None and j.net not in known
    ]
    if bad:
        raise TraceError(bad)


def replay(
    trace: Trace,
    nets: Sequence[str],
    grace_s: float | None,
    cold: ColdStart,
    *,
    seed: int = 0,
    timings: Mapping[str, float] | None = None,
) -> Replay:
    """One replay of the trace at one grace (None: always on)."""
    started = time.perf_counter()
    world = world_for(trace, nets, grace_s, cold, timings)
    workload = workload_for(trace)
    sim = Simulation(world, workload, CLEAN, seed, fast_forward=True)
    keys = {str(job_id_for(j.key)).replace("-", ""): i for i, j in enumerate(workload.jobs)}

    def read(sim: Simulation) -> tuple[dict[int, float], int, tuple[int, int, int]]:
        waits: dict[int, float] = {}
        for job_hex, state, dispatched in sim.conn.execute(
            "SELECT id, state, dispatched_at FROM jobs"
        ):
            index = keys.get(job_hex)
            if index is not None and state == "COMPLETED" and dispatched is not None:
                waits[index] = _secs(dispatched) - trace.jobs[index].submitted_at
        # Used: a job was claimed onto the held net (a hold its job ended from another net
        # is `used` too, but kept no server up for it).
        hints = sim.conn.execute(
            "SELECT coalesce(sum(NOT p.refused), 0),"
            " coalesce(sum(p.outcome = 'used' AND j.net_name = p.net_name), 0),"
            " coalesce(sum(p.refused), 0) FROM prewarms p LEFT JOIN jobs j ON j.id = p.job_id"
        ).fetchone()
        return waits, len(keys) - len(waits), tuple(hints)

    _, (waits, unfinished, (hints, used, refused)) = sim.run_then(read)
    up_s = 0.0
    cold_starts = 0
    starts: dict[str, list[float]] = {}
    end = sim.clock.t
    for name, driver in sim.cluster.drivers.items():
        starts[name] = driver.cold_starts
        if grace_s is None:
            continue
        cold_starts += len(driver.cold_starts)
        up_s += _up_seconds(driver.timeline, end)
    cold_waits = 0
    for run in sim.cluster.runs:
        index = keys.get(run.job_id.replace("-", ""))
        if index is None or index not in waits:
            continue
        arrived = trace.jobs[index].submitted_at
        times = starts[run.net]
        # A start asked for between the job's arrival and its dispatch: it waited for it.
        i = bisect.bisect_left(times, arrived)
        if i < len(times) and times[i] <= arrived + waits[index]:
            cold_waits += 1
    wall_s = time.perf_counter() - started
    return Replay(waits, up_s, cold_starts, cold_waits, unfinished, wall_s, hints, used, refused)


def _secs(stored: str) -> float:
    from datetime import datetime

    return seconds_of(datetime.fromisoformat(stored))


def _up_seconds(timeline: Sequence[tuple[float, int]], end: float) -> float:
    """Seconds with at least one replica asked for or running, from a (t, replicas) record."""
    total = 0.0
    since: float | None = None
    for t, replicas in timeline:
        if replicas > 0 and since is None:
            since = t
        elif replicas == 0 and since is not None:
            total += t - since
            since = None
    if since is not None:
        total += max(0.0, end - since)
    return total


ReplayArgs = tuple[Trace, tuple[str, ...], float | None, ColdStart]


def _replay_job(args: ReplayArgs) -> Replay:
    trace, nets, grace, cold = args
    return replay(trace, nets, grace, cold)


def simulate(
    trace: Trace,
    nets: Sequence[str],
    graces: Sequence[float] = DEFAULT_GRACES,
    cold: ColdStart = LOCAL,
    *,
    workers: int = 1,
    wait_budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Replay the trace at every grace and once always on; the figures and the
    recommendation (the cheapest grace whose p95 added wait is within `wait_budget_s`,
    default one cold start as the dispatcher sees it: `seen_cold_start_s`). A trace with
    hints is replayed at every grace without them (`results`) and with them
    (`hinted_results`); the always-on replay, without them, is the baseline of both.
    `progress` hears a line as each replay ends."""
    budget = seen_cold_start_s(cold) if wait_budget_s is None else wait_budget_s
    started = time.perf_counter()
    check_nets(trace, nets)
    plain = trace.without_hints()
    hinted = trace.hinted()
    args = [(plain, tuple(nets), g, cold) for g in (None, *graces)]
    if hinted:
        args += [(trace, tuple(nets), g, cold) for g in graces]

    def done(count: int, index: int, run: Replay) -> None:
        if progress is not None:
            what = "always on" if args[index][2] is None else f"grace {args[index][2]:g}s"
            hints = " with hints" if args[index][0].hinted() else ""
            progress(
                f"{count}/{len(args)} replayed: {what}{hints} in {run.wall_s:.1f}s"
                f" ({time.perf_counter() - started:.0f}s so far)"
            )

    if progress is not None:
        progress(
            f"{len(args)} replays of {len(trace.jobs)} jobs, {min(workers, len(args))} at a time"
        )
    template_db()  # migrated once here: the forked workers copy this one
    replays = in_processes(_replay_job, args, workers, done)
    baseline, by_grace = replays[0], replays[1 : 1 + len(graces)]
    horizon = trace.horizon_s
    always_on_h = len(nets) * horizon / 3600
    results = [
        GraceResult(**_figures(g, run, baseline, always_on_h))
        for g, run in zip(graces, by_grace, strict=True)
    ]
    hinted_jobs = {i for i, job in enumerate(trace.jobs) if job.hint_lead_s is not None}
    with_hints = [
        HintedResult(
            **_figures(g, run, baseline, always_on_h),
            hints=run.hints,
            hints_used=run.hints_used,
            hints_refused=run.hints_refused,
            hinted_p95_none_s=round(percentile(_added(plain_run, baseline, hinted_jobs), 95), 2),
            hinted_p95_s=round(percentile(_added(run, baseline, hinted_jobs), 95), 2),
        )
        for g, plain_run, run in zip(
            graces if hinted else (),
            by_grace if hinted else (),
            replays[1 + len(graces) :],
            strict=True,
        )
    ]
    return Report(
        source=trace.source,
        jobs=len(trace.jobs),
        nets=tuple(nets),
        horizon_h=round(horizon / 3600, 3),
        utilization=round(trace.utilization(len(nets)), 4),
        always_on_h=round(always_on_h, 3),
        cold_start=cold,
        wait_budget_s=budget,
        results=tuple(results),
        recommended_s=recommend(results, budget),
        wall_s=round(time.perf_counter() - started, 2),
        hinted_jobs=hinted,
        hinted_results=tuple(with_hints),
        hinted_recommended_s=recommend(with_hints, budget) if hinted else None,
    )


def _added(run: Replay, baseline: Replay, only: set[int] | None = None) -> list[float]:
    """Each completed job's wait beyond its always-on wait (of the `only` jobs, if given)."""
    return [
        max(0.0, wait - baseline.waits.get(i, wait))
        for i, wait in sorted(run.waits.items())
        if only is None or i in only
    ]


def _figures(grace: float, run: Replay, baseline: Replay, always_on_h: float) -> dict[str, Any]:
    """A GraceResult's fields: one replay's against the always-on baseline."""
    added = _added(run, baseline)
    server_h = run.up_s / 3600
    saved_h = always_on_h - server_h
    return {
        "grace_s": grace,
        "server_h": round(server_h, 3),
        "saved_h": round(saved_h, 3),
        "saved_pct": round(100 * saved_h / always_on_h, 2) if always_on_h else 0.0,
        "cold_starts": run.cold_starts,
        "wait_p50_s": round(percentile(added, 50), 2),
        "wait_p95_s": round(percentile(added, 95), 2),
        "wait_max_s": round(max(added, default=0.0), 2),
        "cold_waits": run.cold_waits,
        "unfinished": run.unfinished,
        "wall_s": round(run.wall_s, 2),
    }


__all__ = [
    "DEFAULT_GRACES",
    "FARGATE",
    "HINT_MARGIN_S",
    "LOCAL",
    "PROFILES",
    "GraceResult",
    "HintedResult",
    "Replay",
    "Report",
    "percentile",
    "recommend",
    "replay",
    "seen_cold_start_s",
    "simulate",
]
