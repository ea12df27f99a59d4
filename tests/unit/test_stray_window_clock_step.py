"""Review 21b: a stray run held for its start window, and the wall clock stepped back.

A run aborted before it started (NVFLARE's "before running it") is kept as a stray until
RUN_START_WINDOW_S (60 s) after the abort, by the wall clock (`stray_runs.settle_after`),
and the net takes no job while it is kept. A clock stepped back (an NTP correction, a VM
restored) by an hour keeps it an hour and a minute: the net takes no job that long, though
the window is long over, and `expire_stray_runs` (which counts from when the stray was
recorded, by the same clock) cannot end it either. Elsewhere the code reads a clock behind
its stamps as "no rest" (`net_repairs._start_to_settle`); this window has no such guard.
"""

from __future__ import annotations

from app.usecases import abort, dispatch, intake, reconciler
from models import JobState
from tests.unit.conftest import World


def test_a_start_window_outlives_a_clock_stepped_back_by_an_hour(always_on: World):
    world = always_on
    first = world.enqueue("first", net="fixed")
    world.run_pipeline(first)
    run = world.job(first).nvflare_job_id
    world.server("fixed").statuses[run] = "DISPATCHED"  # its runner has not started it yet
    intake.request_abort(world.rt, first, "user")
    assert abort.abort_on_server(world.rt, first) == JobState.ABORTED  # stray, held 60 s

    world.clock.advance(-3600)  # the wall clock is stepped back an hour
    second = world.enqueue("second", net="fixed")
    # Five minutes of reconcile rounds (every 30 s): the window (60 s) is long over.
    for _ in range(10):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)
        dispatch.claim_and_start(world.rt)
    assert world.job(second).state != JobState.QUEUED, (
        "the net still holds back the next job behind a stray whose 60 s window ended "
        "5 minutes ago (the clock was stepped back an hour)"
    )
