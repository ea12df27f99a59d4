"""Review 21b: an abort the server could not confirm once.

abort.abort_on_server promises "An abort the server could not confirm (an error it raised)
is retried by the reconciler until ABORT_TIMEOUT_S, then settled by `expire_abort`". The
reconciler re-sends it only once the job has been ABORTING for STUCK_AFTER_S, and expires
it past ABORT_TIMEOUT_S; both default to 300 s, so with the defaults an abort that met one
blip is never sent again: the run flip-api asked to stop trains on for the whole 300 s, and
the job ends ABORTED `abort_unconfirmed` (a scale-to-zero net's server taken down), where
the next round's abort would have stopped it cleanly.
"""

from __future__ import annotations

import uuid

from app import names
from app.errors import UnknownAdminError
from app.usecases import abort, intake, monitor, reconciler
from models import JobState
from tests.unit.conftest import World


def _abort_with_one_blip(world: World, job_id, net: str) -> None:
    """flip-api's abort; the server answers its first abort with an error (a blip)."""
    admin = world.admin(net)
    real = admin.abort
    blips = [UnknownAdminError("abort: the server answered garbage once")]

    def flaky(run_id: str):
        if blips:
            raise blips.pop()
        return real(run_id)

    admin.abort = flaky  # type: ignore[method-assign]
    requested = intake.request_abort(world.rt, job_id, "user")
    assert requested.decision.needs_server_abort
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING  # the blip


def _housekeeping_until(world: World, seconds: float) -> None:
    """Beat's rounds (monitor every interval, reconcile every two) for `seconds`, each
    ABORT_ON_SERVER they send carried out by a worker at once."""
    step = world.rt.settings.housekeeping_interval_s
    elapsed = 0.0
    while elapsed < seconds:
        world.clock.advance(step)
        elapsed += step
        world.outbox.sent.clear()
        monitor.monitor_running_jobs(world.rt)
        if int(elapsed / step) % 2 == 0:
            reconciler.reconcile(world.rt)
        for task, kwargs in list(world.outbox.sent):
            if task == names.ABORT_ON_SERVER:
                abort.abort_on_server(world.rt, uuid.UUID(kwargs["job_id"]))


def test_an_abort_met_by_one_blip_is_sent_again_before_it_expires(always_on: World):
    """Defaults (ABORT_TIMEOUT_S = STUCK_AFTER_S = 300 s): the first abort meets one error,
    the server answers every later call. The abort is retried before ABORT_TIMEOUT_S and the
    job ends ABORTED `aborted`, its run stopped; instead nothing sends it again, the run
    goes on for 300 s, and the job ends `abort_unconfirmed`."""
    world = always_on
    job_id = world.enqueue("j", net="fixed")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    _abort_with_one_blip(world, job_id, "fixed")

    # Well within ABORT_TIMEOUT_S: the reconciler has had many rounds to retry it.
    _housekeeping_until(world, world.rt.settings.abort_timeout_s - 30)
    assert world.server("fixed").aborted == [run], "the abort was never sent again"

    _housekeeping_until(world, 60)
    job = world.job(job_id)
    assert (job.state, job.reason_code) == (JobState.ABORTED, "aborted")


def test_an_abort_during_a_submit_whose_reply_was_lost_stops_the_run_before_it_expires(
    always_on: World,
):
    """The submit landed but its reply was lost (the step retries it); flip-api aborts the
    job meanwhile: ABORTING with no run id. The step's retry finds the job ABORTING and
    skips without re-sending its token, abort_on_server has no run to abort ("dispatch()
    sends the abort when it lands": it never will), and nothing looks the token up: the run
    flip-api asked to stop trains on until ABORT_TIMEOUT_S expires the abort (then a stray,
    found by its token). Expected: the run, findable by the attempt's token all along, is
    stopped well before ABORT_TIMEOUT_S."""
    from app.usecases import dispatch

    world = always_on
    job_id = world.enqueue("j", net="fixed")
    net, attempt = world.run_until_ready(job_id)
    world.submit_reply_lost(job_id, net, attempt)  # the task retries the step later
    (run,) = world.server(net).submitted.values()
    assert world.server(net).statuses[run] == "RUNNING"

    requested = intake.request_abort(world.rt, job_id, "user")
    assert requested.decision.state == JobState.ABORTING
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING  # no run id yet
    # The step's retry, after its countdown.
    dispatch.dispatch(world.rt, job_id, net, attempt)

    _housekeeping_until(world, world.rt.settings.abort_timeout_s - 30)
    assert world.server(net).statuses[run] != "RUNNING", (
        f"run {run} of an aborted job still running {world.rt.settings.abort_timeout_s - 30:.0f}"
        f"s after the abort; job {world.job(job_id).state}"
    )


def test_an_abort_during_a_submit_that_never_landed_waits_for_its_timeout(always_on: World):
    """The same, but the submit never reached the server: the token's lookup finds nothing,
    which proves nothing (a stalled worker's submit may land yet: tests/unit/
    test_abort_change_broken.py), so the job waits for ABORT_TIMEOUT_S as before; it is not
    ended "nothing to abort" on the lookup's word."""

    world = always_on
    job_id = world.enqueue("j", net="fixed")
    net, attempt = world.run_until_ready(job_id)
    world.submit_reply_lost(job_id, net, attempt, landed=False)
    intake.request_abort(world.rt, job_id, "user")
    _housekeeping_until(world, world.rt.settings.abort_timeout_s - 60)
    assert world.job(job_id).state == JobState.ABORTING
    _housekeeping_until(world, 90)
    job = world.job(job_id)
    assert (job.state, job.reason_code) == (JobState.ABORTED, "abort_unconfirmed")
    assert world.server(net).submitted == {}
