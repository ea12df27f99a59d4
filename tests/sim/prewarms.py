"""The random sweep's prewarms: flip-api's hints (app.usecases.prewarm) and their cancels at
any moment, drawn on a stream of their own (`f"{seed}/prewarm"`) in about a third of the
worlds, so a world that draws none runs exactly as it did before prewarms were swept.

A hint may come shortly before its job, long before it (past PREWARM_MAX_S), with no job
at all, for a net in a given state (armed: sent the moment the net is STOPPED, STARTING,
READY, BUSY, STOPPING, UNHEALTHY or MISCONFIGURED), for a net NETS declares only after a
redeploy (or never), by sites instead of a net (also sites no net has), again under the same
caller_key (the same body, or another: a conflict), or malformed. A job a hint is sent for
(shortly or long before it) names it (`prewarm_key`, no draw of its own), so the claim's
preference for its held net and the hold's end wherever the job goes are swept; the other
hints are named by no job, as a caller that sends no key. A cancel may come before
its hint, while its server warms, while it is held, after a job used it, twice, or for a key
never sent. Some worlds keep PREWARM_MAX_S short, so holds expire inside the run."""

from __future__ import annotations

import dataclasses
import random

from app.sim.workload import SITES, BurstSpec, JobSpec, PrewarmSpec, Workload, WorldSpec

PREWARM_SHARE = 1 / 3  # the share of worlds that draw prewarms
# Of those, on a stream of their own (f"{seed}/burst"): the share whose hints for unpinned
# jobs may name a net, and the share that draw a burst (tests.sim.bursts).
NAMED_NET_SHARE = 0.5
BURST_SHARE = 0.5
# The states an armed hint may wait for (app.models.NetState values).
NET_STATES = ("STOPPED", "STARTING", "READY", "BUSY", "STOPPING", "UNHEALTHY", "MISCONFIGURED")


def with_prewarms(
    seed: int, world: WorldSpec, workload: Workload, *, always: bool = False
) -> tuple[WorldSpec, Workload]:
    """The seed's world and workload, with prewarms if its own stream draws them (`always`:
    whatever it draws, tests.sim.stale_starts' worlds, whose hints the checks then read)."""
    rng = random.Random(f"{seed}/prewarm")
    if rng.random() >= PREWARM_SHARE and not always:
        return world, workload
    max_s = rng.choice((20.0, 45.0, 90.0, 900.0))
    world = dataclasses.replace(world, prewarm_max_s=max_s)
    named: dict[str, str] = {}
    hints = random_prewarms(rng, world, workload, named)
    jobs = tuple(
        dataclasses.replace(j, prewarm_key=named[j.key]) if j.key in named else j
        for j in workload.jobs
    )
    workload = dataclasses.replace(workload, jobs=jobs, prewarms=hints)
    return world, _placements(random.Random(f"{seed}/burst"), world, workload, named)


def _placements(
    rng: random.Random, world: WorldSpec, workload: Workload, named: dict[str, str]
) -> Workload:
    """On the stream's own draws: hints sent for unpinned jobs that name a net (the hold
    then ends `used` wherever the job goes, often on another net), and a burst: a more
    urgent job naming no hint and a hinted one, sent together while two READY nets are free
    (the claim must leave the held one to the hinted job: `held-net-taken`)."""
    names = [n.name for n in world.nets]
    hints = list(workload.prewarms)
    if rng.random() < NAMED_NET_SHARE:
        keys = set(named.values())
        hints = [
            dataclasses.replace(h, net=rng.choice(names), sites=())
            if h.key in keys and h.net is None and not h.cancel and rng.random() < 0.7
            else h
            for h in hints
        ]
    jobs = workload.jobs
    bursts: tuple[BurstSpec, ...] = ()
    if rng.random() < BURST_SHARE:
        at = round(rng.uniform(10.0, workload.horizon_s - 40.0), 1)
        plain = JobSpec("burst-plain", at, round(rng.uniform(15, 40), 1), priority=1)
        hinted = JobSpec("burst-hinted", at, round(rng.uniform(15, 40), 1), prewarm_key="pw-b")
        jobs += (plain, hinted)
        within = float(rng.choice((30, 120, 600)))
        bursts = (BurstSpec(at, plain.key, hinted.key, "pw-b", within, rng.random()),)
    return dataclasses.replace(workload, jobs=jobs, prewarms=tuple(hints), bursts=bursts)


def random_prewarms(
    rng: random.Random,
    world: WorldSpec,
    workload: Workload,
    named: dict[str, str] | None = None,
) -> tuple[PrewarmSpec, ...]:
    """1 to 6 hints (with their repeats and cancels), all sent by the horizon; `named`
    gets, per job a hint is sent for, the key of its first such hint."""
    horizon = workload.horizon_s
    names = [n.name for n in world.nets]
    # A net NETS may declare only after a redeploy, and one it never declares.
    elsewhere = [n.name for n in world.spare] + ["net-q"]
    out: list[PrewarmSpec] = []
    for i in range(rng.randint(1, 6)):
        job = rng.choice(workload.jobs) if workload.jobs else None
        kind = rng.choice(("before", "before", "long-before", "no-job", "armed", "sites", "odd"))
        key = f"pw-{i}"
        if job is not None and rng.random() < 0.3:
            key = job.key  # prewarms have keys of their own: the job's key is allowed
        within = float(rng.choice((5, 30, 60, 120, 600, 2000)))
        net: str | None = rng.choice(names)
        sites: tuple[str, ...] = ()
        on_state: str | None = None
        at = rng.uniform(0.0, horizon)
        if kind in ("before", "long-before") and job is not None:
            net = job.net if job.net is not None or rng.random() < 0.5 else None
            sites = job.sites if net is None else ()
            lead = rng.uniform(1.0, 40.0)
            if kind == "long-before":
                lead += world.prewarm_max_s
            at = max(0.0, job.arrive_s - lead)
            if named is not None:
                named.setdefault(job.key, key)
        elif kind == "armed":
            on_state = rng.choice(NET_STATES)
            at = rng.uniform(0.0, horizon / 2)
        elif kind == "sites":
            net = None
            sites = rng.choice((SITES, ("site-1",), ("site-2", "site-1"), ("site-9",)))
        elif kind == "odd":
            odd = rng.choice(("elsewhere", "no-net-no-sites", "bad-within", "lacking-site"))
            if odd == "elsewhere":
                net = rng.choice(elsewhere)
            elif odd == "no-net-no-sites":
                net = None
            elif odd == "bad-within":
                within = rng.choice((0.0, -5.0, 86401.0))
            else:
                sites = ("site-9",)
        hint = PrewarmSpec(round(at, 1), key, within, net, sites, on_state=on_state)
        out.append(hint)
        if rng.random() < 0.3:
            # The same caller_key again: the same request (a retry), or another body.
            later = round(min(horizon, at + rng.uniform(0.0, 60.0)), 1)
            body = hint if rng.random() < 0.6 else dataclasses.replace(hint, within_s=within + 7)
            out.append(dataclasses.replace(body, at_s=later, on_state=None))
        if rng.random() < 0.45:
            out += _cancels(rng, hint, job.arrive_s if job is not None else None, horizon)
    if rng.random() < 0.2:
        out.append(PrewarmSpec(round(rng.uniform(0.0, horizon), 1), "pw-never", 1.0, cancel=True))
    out.sort(key=lambda h: (h.at_s, h.cancel))
    return tuple(out)


def _cancels(
    rng: random.Random, hint: PrewarmSpec, job_at: float | None, horizon: float
) -> list[PrewarmSpec]:
    """One or two cancels of a hint: before it, as it lands, while its server warms, while
    it is held, after its job came."""
    when = rng.choice(("before", "same", "warming", "held", "after-job"))
    at = {
        "before": hint.at_s - rng.uniform(0.1, 10.0),
        "same": hint.at_s,
        "warming": hint.at_s + rng.uniform(0.5, 6.0),
        "held": hint.at_s + rng.uniform(10.0, 80.0),
        "after-job": (job_at if job_at is not None else hint.at_s) + rng.uniform(5.0, 90.0),
    }[when]
    at = round(min(horizon, max(0.0, at)), 1)
    cancel = PrewarmSpec(at, hint.key, 1.0, cancel=True)
    if rng.random() < 0.25:
        return [cancel, dataclasses.replace(cancel, at_s=round(min(horizon, at + 3.0), 1))]
    return [cancel]
