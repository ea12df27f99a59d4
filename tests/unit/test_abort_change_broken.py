"""Break-it review 21b of the abort change (each test failed on the change under review).

- An ABORTING job whose submit no worker holds (its lease lapsed) has its token looked up
  (`abort.abort_on_server`); none found, it ends ABORTED "nothing to abort" with no stray
  run, its net released at once. A worker past its lease is not always gone: one slowed or
  stalled after `hold_submit` (a submit on a reused session that times out, then a fresh
  login and the command again, takes longer than the 35 s lease) still sends the submit. If
  the lookup answers before the run lands and the submit's reply is then lost, nothing
  records the run: the step's retry finds the job ABORTED and sends nothing, no stray names
  the token, and the run trains on while the always-on net takes the next job. Before the
  change the job stayed ABORTING until ABORT_TIMEOUT_S, when `expire_abort` kept the token
  as a stray and its settling found the run and aborted it (promises: "a late submit
  landing after the job moved on is kept as a stray and aborted"; nothing lost). With no
  reply lost, a run landing between the lookup's answer and the verdict is lost the same
  way: the verdict re-reads nothing under the job's lock (`abandon_dispatch` does).
- (Not taken: the same lookup on a server that is down keeps the job ABORTING until
  ABORT_TIMEOUT_S, as before the change; "a server that is down means nothing to abort" is
  said of a run the server was told of: a submit no worker holds may still land.)
- `redact_url` now masks only what lies before the first '/': a DATABASE_URL whose password
  holds a '/' (SQLAlchemy reads it whole and connects) is printed in the clear by `config
  check`, where the code before the change masked it.
- Every duration is promised finite and at most 1e9 s, but QUEUED_POLL_S (the deprecated
  name AWAITED_POLL_S is read from) has no bound: inf is accepted and copied into
  AWAITED_POLL_S, and beat's schedule raises OverflowError; and BEAT_LOCK_TIMEOUT_S over
  131071 s is accepted while libpq refuses its keepalive, so beat never takes its lock.
- `jobs --limit` is checked to be at least 1, but not at most what the database takes: a
  huge one is a traceback (OverflowError), not an error line.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.engine import make_url

from app import names
from app.celery_app import beat_schedule
from app.errors import SettingsError
from app.settings import Settings
from app.usecases import abort, dispatch, intake, monitor, reconciler
from app.usecases.dispatch import Step
from app.usecases.retries import submit_try_s
from models import JobState, StrayRun
from tests.unit.conftest import World
from tests.unit.test_cli import _isolated_logging, cli_env, db, run  # noqa: F401


def _strays(world: World) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _rounds(world: World, seconds: float) -> None:
    """Beat's rounds for `seconds`: monitor each interval, reconcile every other one, with
    every ABORT_ON_SERVER and SETTLE_STRAY_RUNS they send carried out at once."""
    step = world.rt.settings.housekeeping_interval_s
    for n in range(int(seconds / step)):
        world.clock.advance(step)
        world.outbox.sent.clear()
        monitor.monitor_running_jobs(world.rt)
        if n % 2:
            reconciler.reconcile(world.rt)
        _carry_out(world, list(world.outbox.sent))


def _carry_out(world: World, sent: list[tuple[str, dict]]) -> None:
    """What a worker does with these ABORT_ON_SERVER and SETTLE_STRAY_RUNS messages."""
    for task, kwargs in sent:
        if task == names.ABORT_ON_SERVER:
            abort.abort_on_server(world.rt, uuid.UUID(kwargs["job_id"]))
        elif task == names.SETTLE_STRAY_RUNS:
            abort.settle_stray_runs(world.rt, kwargs["net_name"])


def test_a_stalled_submit_landing_after_nothing_to_abort_with_its_reply_lost_is_stopped(
    always_on: World,
) -> None:
    """Scenario: always-on NVFLARE net `fixed`. The job's submit passed `hold_submit` and
    its worker stalls past the submit lease; flip-api aborts; the (re-sent) ABORT_ON_SERVER
    finds no run by the token yet and ends the job ABORTED "nothing to abort". The worker
    goes on: the submit lands and its reply is lost; the step's retry finds the job ABORTED.
    Expected: the run is stopped (or at least recorded as a stray, holding the net) within
    ABORT_TIMEOUT_S and more. Broke: no stray, the run RUNNING for ever, the net READY."""
    world = always_on
    job_id = world.enqueue("j", net="fixed")
    net, attempt = world.run_until_ready(job_id)
    server = world.server(net)
    lease_s = submit_try_s(world.rt.settings)
    ended: list[JobState] = []

    def stalled_past_its_lease() -> None:
        # The worker's submit is on its way (hold_submit passed) when it stalls.
        world.clock.advance(lease_s + 1)
        requested = intake.request_abort(world.rt, job_id, "user")
        assert requested.decision.state == JobState.ABORTING
        ended.append(abort.abort_on_server(world.rt, uuid.UUID(str(job_id))))

    server.on_submit = stalled_past_its_lease
    world.submit_reply_lost(job_id, net, attempt)
    assert ended == [JobState.ABORTING]  # no run found yet: not ended on that word
    (run,) = server.submitted.values()
    # The step's retry after its countdown: the job moved on, nothing is sent.
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == Step.SKIPPED

    _rounds(world, world.rt.settings.abort_timeout_s + 120)
    assert server.statuses[run] != "RUNNING" or _strays(world), (
        f"run {run} of job {job_id} ({world.job(job_id).state}, "
        f"{world.job(job_id).reason_code}) still RUNNING with no stray run recording it; "
        f"net {net} is {world.net(net).state}"
    )


def test_a_submit_landing_between_the_token_lookup_and_its_verdict_is_stopped(
    always_on: World,
) -> None:
    """Scenario: always-on NVFLARE net `fixed`. The job's submit passed `hold_submit`, its
    worker stalls past the submit lease; flip-api aborts; ABORT_ON_SERVER (A) looks the
    token up and the server has no run yet. Before A records its verdict, the submit lands
    with its reply: dispatch finds the job ABORTING with its token, records the run id on
    the job and sends ABORT_ON_SERVER (B). A then ends the job ABORTED "nothing to abort"
    with no stray (it never re-reads the job: no lease or run-id check under the lock, as
    `unknown_submit.abandon_dispatch` makes); B finds the job ABORTED and does nothing.
    Expected: the run is stopped (or kept as a stray). Broke: it runs on, unrecorded, its
    net READY for the next job, with no reply lost at all."""
    world = always_on
    job_id = world.enqueue("j", net="fixed")
    net, attempt = world.run_until_ready(job_id)
    server = world.server(net)
    admin = world.admin(net)
    real_find = admin.find_run
    looked_up, go_on = threading.Event(), threading.Event()
    verdicts: list[JobState] = []
    threads: list[threading.Thread] = []

    def find_then_pause(token: str) -> str | None:
        found = real_find(token)
        looked_up.set()
        go_on.wait(10)  # A, between the server's answer and its verdict
        return found

    def abort_a() -> None:
        verdicts.append(abort.abort_on_server(world.rt, uuid.UUID(str(job_id))))

    def stalled_past_its_lease() -> None:
        world.clock.advance(submit_try_s(world.rt.settings) + 1)
        intake.request_abort(world.rt, job_id, "user")
        admin.find_run = find_then_pause  # type: ignore[method-assign]
        threads.append(threading.Thread(target=abort_a))
        threads[0].start()
        assert looked_up.wait(10)  # A asked the server before the run landed

    server.on_submit = stalled_past_its_lease
    try:
        landed = dispatch.dispatch(world.rt, job_id, net, attempt)
    finally:
        go_on.set()
        for thread in threads:
            thread.join(10)
        admin.find_run = real_find  # type: ignore[method-assign]
    (run,) = server.submitted.values()
    assert landed.step == Step.SKIPPED  # "landed after the job moved on": B sent
    assert verdicts == [JobState.ABORTING]  # no run found yet: not ended on that word
    _carry_out(world, list(world.outbox.sent))  # B and the settle dispatch sent, now
    _rounds(world, world.rt.settings.abort_timeout_s + 120)
    assert server.statuses[run] != "RUNNING" or _strays(world), (
        f"run {run} of job {job_id} ({world.job(job_id).state}, "
        f"{world.job(job_id).reason_code}, run id {world.job(job_id).nvflare_job_id} on the "
        f"row) still RUNNING with no stray; net {net} is {world.net(net).state}"
    )


def test_config_check_masks_a_database_password_holding_a_slash(tmp_path) -> None:
    """Scenario: DATABASE_URL=postgresql://fl:pa/ss-9c1@db:5432/fl (SQLAlchemy reads the
    password whole and connects). Promise: `config check` prints no secret. Broke: the new
    redact_url stops at the first '/' and matches nothing: the URL is printed as is (the
    regex before the change masked it)."""
    url = "postgresql://fl:pa/ss-9c1@db:5432/fl"
    assert make_url(url).password == "pa/ss-9c1"
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, DATABASE_URL=url)
    shown = settings.redacted()["DATABASE_URL"]
    assert "ss-9c1" not in shown, shown


@pytest.mark.parametrize("value", ["inf", "1e11"])
def test_the_deprecated_queued_poll_s_is_bounded_as_awaited_poll_s(tmp_path, value) -> None:
    """Scenario: QUEUED_POLL_S=inf (AWAITED_POLL_S's old name, still read). Promise: every
    duration is finite and at most 1e9 s (AWAITED_POLL_S=inf is refused). Broke: accepted,
    copied into awaited_poll_s, and beat's schedule raises OverflowError."""
    try:
        settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, QUEUED_POLL_S=value)
    except (SettingsError, ValidationError):
        return  # refused at start: fine
    assert settings.awaited_poll_s <= 1e9
    beat_schedule(settings)


def test_jobs_with_a_limit_past_the_database_integer_is_an_error_line(
    capsys,
    db,  # noqa: F811
) -> None:
    """Scenario: `fl-dispatcher jobs --limit 99999999999999999999`. Promise (review 21's
    fix: `--limit` must be at least 1; bad input is an error line, never a traceback).
    Broke: accepted by the argument check, then OverflowError out of the database driver
    ("Python int too large to convert to SQLite INTEGER")."""
    try:
        code, _, err = run(capsys, "jobs", "--limit", "99999999999999999999")
    except SystemExit as exc:  # argparse refusing the value is fine too
        assert exc.code == 2
        return
    except OverflowError as exc:
        raise AssertionError(f"jobs --limit 99999999999999999999 crashed: {exc}") from None
    assert code == 0 or "limit" in err
