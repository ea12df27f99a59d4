"""Adversarial review of round 3 (871e7f6): each test here fails on that commit because of a
defect in the product code, and says which README promise it breaks."""

from __future__ import annotations

import json
import math
import os

import pytest
from pydantic import ValidationError

from app.adapters.nvflare.base import AbortOutcome, AbortResult
from app.errors import AdminMisconfigured
from app.runtime import Runtime
from app.schemas import EnqueueJob, ReportedStatus, ReportJobStatus
from app.settings import Settings
from app.usecases import abort, dispatch, intake, monitor, reconciler, services
from models import JobState, RejectedRequest, StrayRun
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of


def _strays(world: World) -> list[tuple[str, str | None, str | None]]:
    with world.rt.sessions() as session:
        return [
            (s.net_name, s.nvflare_job_id, s.submit_token) for s in session.query(StrayRun).all()
        ]


def _live_runs(world: World, net: str) -> list[str]:
    server = world.server(net)
    return sorted(run for run, status in server.statuses.items() if status == "RUNNING")


# --- 1. an overrun's abort is "confirmed" by a server that did not confirm it ------------------


@pytest.mark.parametrize("server_answer", ["unreachable for a moment", "abort accepted, not done"])
def test_an_overrun_whose_abort_is_not_confirmed_keeps_its_run_from_the_next_job(
    world, server_answer
):
    """A RUNNING job outlives MAX_RUN_S; monitor aborts it (`_stop_overrun`). The server
    either drops out for a moment (the real client answers NOTHING_TO_ABORT "server
    unavailable") or accepts the abort but the run is still RUNNING when asked. Either way
    `_stop_overrun` counts it as confirmed: job FAILED, net released, no stray, no take-down,
    so the next job is claimed onto the server that still runs the overrun.

    Breaks: "a run that no job counts (... an abort that was never confirmed) is a stray run:
    the net takes no new job until it is aborted ... or gone with its server"; the commit's own
    rule "a run is over only when its server, answering now, says so" (abort_on_server,
    settle_stray_runs) was not applied here."""
    job_id = world.enqueue("overrun", net="net-a")
    world.run_pipeline(job_id)
    run = world.job(job_id).nvflare_job_id
    server = world.server("net-a")
    if server_answer == "unreachable for a moment":
        # The start time is read, then the server drops out: status unknown, abort "nothing".
        server.on_start_time = lambda: setattr(server, "up", False)
    else:
        admin = world.admin("net-a")
        admin.abort = lambda _id: AbortResult(AbortOutcome.ABORTED)  # type: ignore[method-assign]
    world.clock.advance(world.rt.settings.max_run_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.FAILED
    server.up = True  # the blip is over: the overrun run is still there
    assert server.statuses[run] == "RUNNING"

    kept = any(nv == run for _, nv, _ in _strays(world))
    taken_down = world.driver("net-a").replicas == 0
    assert kept or taken_down, "the overrun run is neither a stray nor gone with its server"


# --- 2. declared sites are checked at enqueue but not at the claim ----------------------------


def test_an_unpinned_job_is_never_claimed_by_a_net_that_declares_it_lacks_its_sites(sited):
    """net-a declares its sites (site-1..3); net-b declares none. An unpinned job needing
    site-99 is accepted at enqueue (net-b may have it), but the claim ignores declared sites:
    net-a takes it, waits out ready_timeout_s for a site it declared it does not have, gives
    up "on sites" and stays READY, so the warm-first claim hands the job straight back to
    net-a. After max_attempts the job is FAILED without net-b ever being tried.

    Breaks: "a net may declare its `sites` and a job needing one it lacks is refused" (the
    claim must not do what enqueue refuses) and "refuse valid input / accept input that
    later fails": a job accepted because net-b may run it is failed on net-a alone."""
    world = sited
    job_id = world.enqueue("needs-site-99", required_sites=["site-99"])
    tried = []
    for _ in range(world.job(job_id).max_attempts):
        claims = [a for a in dispatch.assign_jobs(world.rt) if a.job_id == job_id]
        if not claims:
            break
        net, attempt = claims[0].net_name, claims[0].attempt
        tried.append(net)
        dispatch.scale_up(world.rt, job_id, net, attempt)
        world.clock.advance(121)
        dispatch.check_ready(world.rt, job_id, net, attempt)
    assert "net-a" not in tried, (tried, world.job(job_id).state, world.job(job_id).last_error)


# --- 3. the prepared copy's key cannot be computed for a legal file name ---------------------


def test_a_bundle_with_a_non_utf8_file_name_is_submitted_not_crashed(world, job_root):
    """A job folder holds a file whose name is not UTF-8 (Latin-1 "café.txt" unpacked from an
    old zip: Linux allows any bytes). Python sees it as a surrogate escape; `built_from`
    encodes each relative path strictly (`.encode()`), so every dispatch of the job raises
    UnicodeEncodeError (not a DispatcherError): no step handles it, the job sits DISPATCHING,
    reconcile re-sends the same crash, then abandons and requeues it until its attempts are
    spent. Before this change prepare() copied such a bundle and it was submitted.

    Breaks: "accept input that later crashes" (the definition was accepted at enqueue, and
    the crash is in the new prepared-copy keying)."""
    folder = os.fsencode(job_root / "tiny-job" / "app" / "config")
    with open(folder + b"/caf\xe9.txt", "wb") as handle:
        handle.write(b"x")
    job_id = world.enqueue("latin1", net="net-a")
    net, attempt = world.run_until_ready(job_id)
    result = dispatch.dispatch(world.rt, job_id, net, attempt)
    assert result.step == dispatch.Step.DONE
    assert world.job(job_id).state == JobState.RUNNING


# --- 4. a report on an ABORTING job whose submit is still on the wire -------------------------


def test_a_report_on_an_aborting_job_whose_submit_is_in_flight_holds_the_net(world):
    """A job is aborted while its submit is on the wire (DISPATCHING -> ABORTING, no run id
    yet), then flip-api reports it `stopped`. The report ends the job at once and records a
    stray known only by its token; the settle_stray_runs it sends asks the server for that
    token, finds nothing yet (the submit has not landed) and drops the stray. The net is free:
    the next job is claimed onto it, and then the first job's submit lands beside it.

    Breaks: "`stopped` for a DISPATCHING job (its submit may be in flight) is an abort:
    ABORTING until the server has been told" and "the net is not handed to the next job
    while this one's run may still land" (services.report_job_status), and the commit's
    item 1 "the net takes no job beside it"."""
    first = world.enqueue("first", net="net-a")
    net, attempt = world.run_until_ready(first)
    server = world.server("net-a")
    claimed: list = []

    def while_the_submit_is_on_the_wire() -> None:
        server.on_submit = None
        intake.request_abort(world.rt, first, "user")  # DISPATCHING -> ABORTING
        intake.report_status(world.rt, ReportJobStatus(job_id=first, status=ReportedStatus.STOPPED))
        abort.settle_stray_runs(world.rt, "net-a")  # the task report_status sent
        world.enqueue("next", net="net-a")
        claimed.extend(dispatch.assign_jobs(world.rt))

    server.on_submit = while_the_submit_is_on_the_wire
    dispatch.dispatch(world.rt, first, net, attempt)
    assert claimed == [], "the net was handed to the next job while the first's submit flew"


# --- 5. payloads: a value the database refuses, a refusal that does not fit its column --------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_enqueue_refuses_metadata_postgresql_cannot_store(value):
    """flip-api's JSON (Python's json, kombu's serializer) carries NaN and Infinity, and the
    payload check accepts them (it checks strings only). PostgreSQL's json type refuses them
    ('invalid input syntax for type json'), so on PostgreSQL the enqueue dies with a
    DataError that is not an InvalidRequest: no job, no rejection record, no `rejected`
    event: the request is lost without a trace. The callbacks of such a job also carry a
    body that is not JSON (`NaN`).

    Breaks: the commit's item 5 "every ... payload must be storable" and "A refused payload
    ... is recorded" (Task API); "refuse valid input / accept input that later crashes"."""
    with pytest.raises(ValidationError):
        EnqueueJob.model_validate(
            {"caller_key": "k", "definition": "tiny-job", "metadata": {"score": value}}
        )


def test_a_refused_caller_key_is_recorded_within_its_column(world):
    """The enqueue task cuts a refused payload's caller_key to 200 characters (the column's
    length, String(200)), then `record_rejection` escapes it (each NUL becomes 4 characters,
    each lone surrogate 6): up to 1200 characters go into a 200-character column. PostgreSQL
    refuses that ('value too long for type character varying(200)'), so the refusal is lost
    again: the exact DataError round 3 says it fixed.

    Breaks: the commit's item 5 "A refused enqueue whose own words cannot be stored is
    recorded escaped" and the Task API's "A refused payload ... is recorded"."""
    from app.usecases.intake import caller_key_of as _caller_key

    key = _caller_key({"caller_key": "\x00" * 300})
    intake.reject_enqueue(world.rt, key, "caller_key: invalid")
    limit = RejectedRequest.__table__.c.caller_key.type.length
    with world.rt.sessions() as session:
        stored = [r.caller_key for r in session.query(RejectedRequest).all()]
    assert len(stored) == 1
    assert stored[0] is not None and len(stored[0]) <= limit, len(stored[0] or "")


# --- 6. the DISPATCHING lease does not cover the holder's own work before its submit ----------


def test_a_live_submit_holder_is_never_taken_for_gone_and_abandoned(world, monkeypatch):
    """A job is DISPATCHING for a while (its earlier submits went unanswered); reconcile
    re-sends its dispatch. That dispatch takes its lease (`submit_try_s`: login + command +
    15 s) and then prepares the bundle copy, which for a large bundle takes longer than the
    lease (here 40 s). Reconcile, seeing the lease over and the job past its budget, takes the
    live holder for gone, finds no run for the token (it has not been sent yet) and requeues
    the job; its next attempt runs. Then the holder's submit goes out with the old token and
    a second live run of the same job lands.

    Breaks: "At most one live run per job, whatever fails" (the commit: "a worker that died
    is known gone within about 50 s": here a worker that did not die is taken for gone)."""
    job_id = world.stuck_in_dispatching("slow-prepare")
    world.clock.advance(850)  # under the abandon age (retry budget + STUCK_AFTER_S: 870 s)
    reconciler.reconcile(world.rt)  # holder gone (no lease): dispatch re-sent
    resent = {"job_id": str(job_id), "net_name": "net-a", "attempt": 0}
    assert ("fl_dispatcher.dispatch", resent) in world.outbox.sent
    real_prepare = dispatch.prepare
    seen: list = []

    def slow_prepare(*args, **kwargs):
        folder = real_prepare(*args, **kwargs)
        if not seen:
            seen.append(True)
            world.clock.advance(40)  # copying a large bundle
            reconciler.reconcile(world.rt)  # the round that runs meanwhile
            if world.job(job_id).state == JobState.QUEUED:
                world.run_pipeline(job_id)  # its next attempt, on the freed net
        return folder

    monkeypatch.setattr(dispatch, "prepare", slow_prepare)
    dispatch.dispatch(world.rt, job_id, "net-a", 0)  # the re-sent message
    runs = _live_runs(world, "net-a")
    assert len(runs) <= 1, f"two live runs of one job: {runs}"


# --- 7. a misconfiguration seen by a step whose attempt was adopted meanwhile -----------------


def test_a_misconfigured_submit_never_requeues_a_job_a_re_sent_submit_has_adopted(always_on):
    """Always-on nets. A job's first submit is on the wire when reconcile's re-sent dispatch
    (same token) lands the run: job RUNNING. The first task's own submit then fails with a
    misconfiguration (its worker's fresh login is refused: an admin certificate that expired
    under it). `dispatch()` calls `net_misconfigured` with the job, unbound to its attempt,
    and `requeue_job` takes a RUNNING job: it goes back to the queue (attempt kept, no stray)
    while its run goes on on the always-on server, and is claimed onto the other net: two
    live runs of one job.

    Breaks: "At most one live run per job, whatever fails" and the commit's item 8 "a
    failure handler moves only the attempt its step was started for" (done for exhausted
    retries only, not for a handled misconfiguration)."""
    world = always_on
    job_id = world.enqueue("adopted", required_sites=["site-1"])
    net, attempt = world.run_until_ready(job_id)
    server = world.server(net)

    def re_sent_submit_lands_then_this_one_is_refused() -> None:
        server.on_submit = None
        assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.DONE
        raise AdminMisconfigured("admin login refused: certificate expired")

    server.on_submit = re_sent_submit_lands_then_this_one_is_refused
    # The step's job moved on: it ends quietly, leaving the net to the job's owner.
    assert dispatch.dispatch(world.rt, job_id, net, attempt).step == dispatch.Step.SKIPPED
    job = world.job(job_id)
    assert job.state == JobState.RUNNING, (job.state, job.last_error)


# --- 8. a prepared copy keyed without what a linked folder holds ------------------------------


def test_a_bundle_whose_linked_folder_changed_between_attempts_is_submitted_as_it_is_now(
    world, job_root
):
    """The job folder links its code folder from a shared place under the job root
    (`app/custom -> ../../_shared/custom`, a common layout for jobs that share code; the
    prepared copy follows links, `copytree(symlinks=False)`). `built_from` walks the bundle
    with `rglob`, which does not descend into a linked folder, so the files there are not
    part of the key: after the shared code is edited between two attempts the key is the
    same, and the earlier attempt's copy, with the old code, is submitted again.

    Breaks: the commit's item 2 "a bundle replaced between attempts (... a job folder
    edited) gets a new copy and is submitted as it is now, never as an earlier attempt saw
    it"."""
    shared = job_root / "_shared" / "custom"
    shared.mkdir(parents=True)
    (shared / "train.py").write_text("v1")
    (job_root / "tiny-job" / "app" / "custom").symlink_to(shared, target_is_directory=True)
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    first = world.server("net-a").folders[-1]
    assert (first / "app" / "custom" / "train.py").read_text() == "v1"
    with world.rt.sessions.begin() as session:
        services.requeue_job(session, job_id, "server restarted", world.clock())
    (shared / "train.py").write_text("version 2")
    world.run_pipeline(job_id)
    second = world.server("net-a").folders[-1]
    assert (second / "app" / "custom" / "train.py").read_text() == "version 2"


# --- 9. "no longer declared" decided by one worker's own view of NETS -------------------------


def test_a_worker_still_on_the_previous_nets_never_fails_the_jobs_of_a_net_just_added(
    tmp_path, job_root, sqlite_factory, clock
):
    """A redeploy adds net-b to NETS. While it rolls out (ECS replaces tasks one by one), a
    worker still on the previous declaration (net-a only) runs one of beat's reconcile
    rounds. `_settle_undeclared` takes "not in my NETS" for "removed": the job RUNNING on the
    healthy new net-b is FAILED (and a QUEUED job pinned to it too), its run goes on
    unwatched, and the up-to-date workers then hand net-b, released, to the next job beside
    that run.

    Breaks: "lose a job" (a valid RUNNING job is failed by a routine redeploy) and "a run
    that no job counts ... is a stray run: the net takes no new job until it is aborted"."""
    nets = [net_decl(tmp_path, n, "ecs", ready_timeout_s=120) for n in ("net-a", "net-b")]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    running = world.enqueue("running", net="net-b")
    world.run_pipeline(running)
    run = world.job(running).nvflare_job_id
    pinned = world.enqueue("pinned", net="net-b")

    previous = Runtime(
        settings=Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path / "data",
            JOB_ROOT=job_root,
            NETS=json.dumps([nets[0]]),
            PER_JOB_FL_SERVER="true",
        ),
        engine=world.rt.engine,
        sessions=world.rt.sessions,
        clock=world.clock,
        driver_factory=lambda net, s: world.driver(net.name),
        admin_factory=lambda net, s: world.admin(net.name),
        outbox=world.outbox,
    )
    reconciler.reconcile(previous)  # beat's round, taken by the not-yet-replaced worker

    assert world.job(running).state == JobState.RUNNING, world.job(running).last_error
    assert world.job(pinned).state == JobState.QUEUED, world.job(pinned).last_error
    assert world.server("net-b").statuses[run] == "RUNNING"
