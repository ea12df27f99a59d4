"""`fl-dispatcher simulate` checked against reality once: a tiny trace replayed on the real
local stack (a real Celery worker and a separate beat, a private Redis, PostgreSQL, the local
driver and a real NVFLARE server with two sites) and on the simulator, whose server-up time
must agree within 10%.

The real side's server-up time comes from the dispatcher's own net history (net_events:
from leaving STOPPED to being STOPPED again). The simulator replays the same submissions
(the times the real jobs were created) with the stack's own timings; a job's traced
duration is how long it really ran (RUNNING to COMPLETED in its history), since NVFLARE's
run time for a FedAvg job is not set by a trace. Each stretch of server-up time (from a
cold start to scale-down) is replayed with that stretch's own measured cold start
(STARTING to READY): a local cold start is about 4-11 s or about 19-40 s (a site
re-registers on its own retry timer; a busy machine), so draws of it, not the model, would
decide a comparison with one mean (once, a 9.8 s and a 27 s start averaged to 18.4 s kept
the simulated server up past the third job, one cold start instead of two); the comparison
with the `local` profile's mean is printed, not asserted. What is checked is everything
else: queueing, readiness, dispatch, monitoring, the grace, scale-down.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest
from sqlalchemy import func, select

from app.local.stack import NET, LocalStack, StackOptions
from app.sim import savings
from app.sim.trace import Trace, TraceJob
from app.sim.workload import ColdStart
from models import JobEvent, JobState, NetEvent, NetState
from tests.fixtures.db import fresh_pg_database
from tests.fixtures.services import PrivateRedis

pytestmark = [pytest.mark.e2e, pytest.mark.nvflare]

EXPECTED_S = 110  # seconds on the 2-core CI machine (tests/tools/schedule.py)

GRACE_S = 15.0
HOUSEKEEPING_S = 1.5
# Submission offsets (s): two back to back (the second waits for the first on the one net,
# warm), then one AFTER_STOP_S after the server has gone (a second cold start). The third is
# sent once the net is seen STOPPED, not at a fixed offset: a first cold start slowed by a
# busy machine (40 s seen with four test workers) once kept the server up past a fixed one.
PLAN = (("sim-a", 0.0), ("sim-b", 1.0))
AFTER_STOP_S = 5.0
# Rounds of each job: runs of about 10 s. (They were twice that while one mean cold start
# was replayed for both stretches, so that a cold start's own spread was not most of the
# server-up time; each stretch now has its own.)
ROUNDS = 2
RUN_S = 240.0
TOLERANCE = 0.10


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[LocalStack]:
    with fresh_pg_database("fld_e2e_sim") as url:
        redis = PrivateRedis(tmp_path_factory.mktemp("redis"))
        redis.start()
        try:
            options = StackOptions(
                workdir=tmp_path_factory.mktemp("e2e-sim"),
                database_url=url,
                broker_url=redis.url(),
                idle_timeout_s=GRACE_S,
                ready_timeout_s=90,
                housekeeping_interval_s=HOUSEKEEPING_S,
                embedded_beat=False,
            )
            with LocalStack(options) as running:
                yield running
        finally:
            redis.stop()


def wait_done(stack: LocalStack, job_id: uuid.UUID) -> None:
    job = stack.wait_for(
        f"job {job_id} done",
        lambda: (
            j
            if (j := stack.job(job_id)) is not None
            and j.state in (JobState.COMPLETED, JobState.FAILED)
            else None
        ),
        RUN_S,
    )
    assert job.state == JobState.COMPLETED, job.last_error


def wait_stopped(stack: LocalStack) -> None:
    stack.wait_for(
        "the net STOPPED and its server process gone",
        lambda: stack.net().state == NetState.STOPPED and stack.driver().observe().running == 0,
        RUN_S,
    )


def _seconds(at: datetime, since: datetime) -> float:
    return (at - since).total_seconds()


def real_cold_starts(events: list[tuple[str, str, datetime]]) -> list[float]:
    """Seconds from leaving STOPPED to READY, per start."""
    starts, since = [], None
    for src, dst, at in events:
        if src == NetState.STOPPED:
            since = at
        elif dst == NetState.READY and since is not None:
            starts.append(_seconds(at, since))
            since = None
    return starts


def real_up_s(events: list[tuple[str, str, datetime]]) -> tuple[float, int]:
    """Server-up seconds and cold starts from a net's history: each stretch from leaving
    STOPPED to entering STOPPED again."""
    total, starts, since = 0.0, 0, None
    for src, dst, at in events:
        if src == NetState.STOPPED and since is None:
            since, starts = at, starts + 1
        elif dst == NetState.STOPPED and since is not None:
            total += _seconds(at, since)
            since = None
    assert since is None, "the net did not end STOPPED"
    return total, starts


def test_server_up_time_of_a_tiny_trace_agrees_with_the_simulator(stack: LocalStack) -> None:
    assert stack.net().state == NetState.STOPPED
    # No warm-up job: the very first server start is quicker than the later ones (the sites
    # are fresh and connect at once, while later they re-register on their retry timer), but
    # each stretch is replayed with its own measured cold start, so which kind it was does
    # not matter.
    net_after, job_after = stack.read(
        lambda s: (
            s.scalar(select(func.max(NetEvent.id))) or 0,
            s.scalar(select(func.max(JobEvent.id))) or 0,
        )
    )
    definition = stack.add_job_definition("sim-fedavg", num_rounds=ROUNDS)
    started = time.monotonic()
    ids = []
    for key, offset in PLAN:
        time.sleep(max(0.0, started + offset - time.monotonic()))
        ids.append(stack.enqueue(key, definition))
    for job_id in ids:
        wait_done(stack, job_id)
    wait_stopped(stack)
    time.sleep(AFTER_STOP_S)
    ids.append(stack.enqueue("sim-c", definition))
    wait_done(stack, ids[-1])
    wait_stopped(stack)

    jobs = [stack.job(job_id) for job_id in ids]
    history = stack.read(
        lambda s: [
            (e.job_id, str(e.to_state), e.at)
            for e in s.scalars(
                select(JobEvent).where(JobEvent.id > job_after).order_by(JobEvent.id)
            )
        ]
    )
    net_history = stack.read(
        lambda s: [
            (str(e.from_state), str(e.to_state), e.at)
            for e in s.scalars(
                select(NetEvent)
                .where(NetEvent.net_name == NET, NetEvent.id > net_after)
                .order_by(NetEvent.id)
            )
        ]
    )
    real_s, real_starts = real_up_s(net_history)

    traced = []
    for job in jobs:
        assert job is not None
        ran = [at for job_id, state, at in history if job_id == job.id and state == "RUNNING"]
        ended = [at for job_id, state, at in history if job_id == job.id and state == "COMPLETED"]
        traced.append((job.created_at, _seconds(ended[-1], ran[-1])))
    assert stack.settings is not None
    settings = stack.settings
    timings = {
        "housekeeping_interval_s": settings.housekeeping_interval_s,
        "ready_poll_s": settings.ready_poll_s,
        "stuck_after_s": settings.stuck_after_s,
        "server_lost_grace_s": settings.server_lost_grace_s,
        "keep_alive_interval_s": settings.keep_alive_interval_s,
    }
    colds = real_cold_starts(net_history)
    assert len(colds) == 2, colds
    local = savings.LOCAL
    # The two stretches: the back-to-back pair, then the job sent after scale-down.
    stretches = [(traced[: len(PLAN)], colds[0]), (traced[len(PLAN) :], colds[1])]
    sims, profiles = [], []
    for stretch, cold_s in stretches:
        first = stretch[0][0]
        trace = Trace(
            tuple(TraceJob(_seconds(at, first), run_s) for at, run_s in stretch), source="e2e"
        )
        measured = ColdStart(
            "this stretch",
            provision_s=0.0,
            login_s=local.login_s,
            sites_s=max(0.0, cold_s - local.login_s),
            stop_s=local.stop_s,
        )
        sims.append(savings.replay(trace, [NET], GRACE_S, measured, timings=timings))
        profiles.append(savings.replay(trace, [NET], GRACE_S, local, timings=timings))
    sim_up_s = sum(s.up_s for s in sims)
    profile_up_s = sum(p.up_s for p in profiles)
    difference = abs(sim_up_s - real_s) / real_s
    origin = net_history[0][2]
    print(
        "\nnet history:",
        [(src, dst, round(_seconds(at, origin), 1)) for src, dst, at in net_history],
    )
    print(
        "job history:",
        [(str(job_id)[:4], state, round(_seconds(at, origin), 1)) for job_id, state, at in history],
    )
    print(
        f"\nserver up: real {real_s:.1f}s ({real_starts} cold starts of"
        f" {', '.join(f'{c:.1f}s' for c in colds)}), simulated {sim_up_s:.1f}s"
        f" ({' + '.join(f'{s.up_s:.1f}s' for s in sims)}): {100 * difference:.1f}% apart;"
        f" with the local profile ({local.total_s:.1f}s): {profile_up_s:.1f}s,"
        f" {100 * abs(profile_up_s - real_s) / real_s:.1f}% apart;"
        f" trace {[(round(_seconds(at, traced[0][0]), 1), round(d, 1)) for at, d in traced]}"
    )
    assert real_starts == 2
    for one in sims:
        assert one.unfinished == 0
        assert one.cold_starts == 1, one
    assert difference <= TOLERANCE, f"real {real_s:.1f}s vs simulated {sim_up_s:.1f}s"
