"""An abort answered "aborted before running it" (the run was SUBMITTED or DISPATCHED) is
never proof the run is over: nvflare 2.9's job runner, if it was starting the run, sets it
RUNNING over the mark. The run is kept as a stray run, which holds its net, until a status
read after RUN_START_WINDOW_S says it is over (CI saw such an abort not take; the sweep's
racy seeds 21 and 192 ran the next job beside it). The mark itself (FINISHED:ABORTED with no
start time) holds the net the same way when the abort is learnt of otherwise: its reply lost
or garbled after the server acted, a retried abort, a stray's settle, the monitor. A stray
whose window keeps being pushed on is still bounded by ABORT_TIMEOUT_S, and the simulator's
servers mark an aborted SUBMITTED run as nvflare 2.9 does."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.adapters.backend import AbortOutcome, AbortResult
from app.db import unit_of_work
from app.errors import ServerUnavailable
from app.usecases import abort, dispatch, intake, monitor, reconciler, records
from models import JobEvent, JobState, ReasonCode, StrayRun
from tests.unit.abort_replies import (
    held_for_one_window,
    reply_lost_after_the_server_acted,
    reply_unclassified_after_the_server_acted,
)

WINDOW = timedelta(seconds=abort.RUN_START_WINDOW_S)


def _strays(world) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


def _aborted_while_starting(world, status: str = "DISPATCHED"):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = status
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    return job_id


def _record_nv1_again(world, job_id, reason: str) -> None:
    """Record run nv-1 of the job on net-a as a stray, held for one window from now."""
    with unit_of_work(world.rt.sessions) as session:
        records.add_stray_run(
            session,
            net_name="net-a",
            job_id=job_id,
            nvflare_job_id="nv-1",
            submit_token=None,
            reason=reason,
            now=world.clock(),
            settle_after=world.clock() + WINDOW,
        )


def _dispatched(world, status: str = "DISPATCHED") -> str:
    """A job the dispatcher ran on net-a whose nvflare run the job runner is still starting."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = status
    return job_id


def _moved_on_with_a_stray(world, job_id) -> None:
    """The job moved on (flip-api ended it) while its run stayed: a stray known by id and
    token, recorded with no window (as dispatch's "submit landed after the job moved on")."""
    world.add_stray(job_id, "net-a", "nv-1", token=world.job(job_id).submit_token)
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session,
            job_id,
            JobState.FAILED,
            "moved on",
            world.clock(),
            code=ReasonCode.REPORTED_ERROR,
        )


def _runner_overwrites_the_mark(world) -> None:
    """nvflare 2.9's job runner is done starting the run: RUNNING over FINISHED:ABORTED."""
    assert world.server("net-a").statuses["nv-1"] == "FINISHED:ABORTED"
    world.server("net-a").statuses["nv-1"] = "RUNNING"


def _net_takes_no_new_job(world) -> None:
    other = world.enqueue("next", net="net-a")
    assert dispatch.claim_and_start(world.rt) == [], "net-a took a job beside a run it may start"
    assert world.job(other).state == JobState.QUEUED


def _aborts_never_take_before_start(world, net: str = "net-a") -> None:
    """The server answers every abort of a SUBMITTED run "before running it" but the run
    stays SUBMITTED: what app/sim/admin.py does with a deaf run that waits for its sites on
    a net that scales to zero (`before_start = run.starting(t) or run.waiting`, then no
    mark: `not (run.deaf and scales_to_zero)`). (nvflare 2.9 itself always writes the mark,
    so there it can only come back by its job runner's DISPATCHED/RUNNING overwrite.)"""
    admin = world.admin(net)
    server = world.server(net)

    def before_start_no_mark(nvflare_job_id: str) -> AbortResult:
        if not server.alive():
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, "server down")
        server.aborted.append(nvflare_job_id)
        return AbortResult(AbortOutcome.ABORTED_BEFORE_START, "aborted before running it")

    admin.abort = before_start_no_mark  # type: ignore[method-assign]


def test_the_run_is_kept_as_a_stray_until_the_runner_cannot_start_it(world):
    job_id = _aborted_while_starting(world)
    with world.rt.sessions() as session:
        reason = session.scalars(select(JobEvent.reason).where(JobEvent.job_id == job_id)).all()
    assert reason[-1] == "aborted on the server before it started"
    [stray] = _strays(world)
    assert stray.nvflare_job_id == "nv-1"
    assert stray.settle_after == world.clock() + WINDOW
    # The status reads over at once (FINISHED:ABORTED), yet the stray holds its net...
    assert world.server("net-a").statuses["nv-1"] == "FINISHED:ABORTED"
    world.clock.advance(abort.RUN_START_WINDOW_S - 1)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    other = world.enqueue("next", net="net-a")
    assert dispatch.claim_and_start(world.rt) == []
    assert world.job(other).state == JobState.QUEUED
    # ...until the window has passed and the server still says it is over.
    world.clock.advance(1)
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert _strays(world) == []
    assert [c.job_id for c in dispatch.claim_and_start(world.rt)] == [other]


def test_a_job_that_was_only_submitted_is_held_the_same(world):
    _aborted_while_starting(world, "SUBMITTED")
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW


def test_a_run_the_runner_started_over_the_mark_is_aborted_again(world):
    _aborted_while_starting(world)
    world.server("net-a").statuses["nv-1"] = "RUNNING"  # the runner overwrote the mark
    world.clock.advance(abort.RUN_START_WINDOW_S)
    abort.settle_stray_runs(world.rt, "net-a")
    assert world.server("net-a").aborted == ["nv-1", "nv-1"]
    assert world.server("net-a").statuses["nv-1"] == "FINISHED:ABORTED"
    assert _strays(world) == []  # the second abort hit a RUNNING run: proof once over


def test_a_repeated_answer_before_start_pushes_the_window_on(world):
    _aborted_while_starting(world)
    world.clock.advance(30)
    world.server("net-a").statuses["nv-1"] = "SUBMITTED"  # the runner set it back again
    held_for_one_window(world)  # from this second answer, not the first


def test_an_earlier_window_never_shortens_a_later_one(world):
    job_id = _aborted_while_starting(world)
    [stray] = _strays(world)
    later = stray.settle_after
    world.clock.advance(-10)
    _record_nv1_again(world, job_id, "again")
    [stray] = _strays(world)
    assert stray.settle_after == later


def test_a_window_given_to_a_stray_recorded_without_one_holds_it(world):
    """A run first recorded with no window (an unconfirmed abort), then answered "aborted
    before it started": the same stray takes the window and is not settled before it ends."""
    job_id = world.enqueue("j", net="net-a")
    world.add_stray(job_id, "net-a", "nv-1")
    _record_nv1_again(world, job_id, "aborted before start")
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW


def test_a_window_pushed_meanwhile_by_another_round_is_kept(world):
    """Two settle rounds at once (a kick and beat's): the later window either of them set
    stands, never the earlier one this round read."""
    _aborted_while_starting(world)
    admin = world.admin("net-a")
    real = admin.abort
    pushed = []

    def abort_while_another_round_pushes(run_id: str):
        # The other round's window: from its own now, so at most a window from this one's.
        pushed.append(world.clock() + WINDOW / 2)
        with unit_of_work(world.rt.sessions) as session:
            [stray] = session.scalars(select(StrayRun)).all()
            stray.settle_after = pushed[0]
        return real(run_id)

    admin.abort = abort_while_another_round_pushes  # type: ignore[method-assign]
    world.clock.advance(abort.RUN_START_WINDOW_S)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    [stray] = _strays(world)
    assert stray.settle_after == pushed[0]


def test_a_window_ends_at_most_its_length_from_now_after_a_clock_stepped_back(world):
    """Review 21b: a clock stepped back an hour held the window (and the net) an hour and a
    minute; a window is never further than its length from the round's now."""
    _aborted_while_starting(world)
    world.clock.advance(-3600)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW


# --- a before-start abort learnt of other than by its own answer ------------------------
# Each docstring tells what the code did on f31b5cd, before the mark itself was read.


def test_an_abort_whose_reply_is_lost_after_a_before_start_mark_keeps_the_net(world):
    """abort_on_server: the abort marks the DISPATCHED run, its reply is lost; the status
    read that follows finds FINISHED:ABORTED (the mark) and settles the job with no stray,
    no window: the net takes the next job while the runner starts the aborted one."""
    job_id = _dispatched(world)
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    reply_lost_after_the_server_acted(world)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_an_abort_retried_after_an_unclassified_reply_never_takes_the_mark_for_the_end(world):
    """abort_on_server: the first abort marks the DISPATCHED run but its reply is an error
    (the job stays ABORTING, retried by the reconciler); the retry's status read finds
    FINISHED:ABORTED, ALREADY_FINISHED, and `_settle_finished` ends the job with no stray."""
    job_id = _dispatched(world)
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    reply_unclassified_after_the_server_acted(world)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING
    world.clock.advance(5)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_a_stray_settle_whose_reply_is_lost_never_takes_the_mark_for_the_end(world):
    """settle_stray_runs: a stray recorded without a window (dispatch's "submit landed after
    the job moved on", which counts on the settle's abort answering before-start) is
    aborted while the runner starts it; the reply is lost, the status read finds the mark,
    and the stray is forgotten in the same round."""
    job_id = _dispatched(world, "SUBMITTED")
    _moved_on_with_a_stray(world, job_id)
    reply_lost_after_the_server_acted(world)
    abort.settle_stray_runs(world.rt, "net-a")  # on f31b5cd: 0 left, the stray forgotten
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_an_overrun_abort_whose_reply_is_lost_keeps_an_always_on_net_from_the_next_job(always_on):
    """monitor._stop_overrun on an always-on net (nothing takes it down): a run the job
    runner is only now starting (it stayed SUBMITTED until its sites came) is aborted as
    overrun; the reply is lost, the status read finds the mark: confirmed, no stray."""
    world = always_on
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "DISPATCHED"
    world.clock.advance(world.rt.settings.max_run_s + 1)
    reply_lost_after_the_server_acted(world)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "failed: overran"
    assert world.job(job_id).state == JobState.FAILED
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_the_monitor_never_reads_the_mark_of_an_unconfirmed_abort_as_the_end(world):
    """The abort marks the DISPATCHED run but its reply is an error (the job stays
    ABORTING); the monitor, which watches ABORTING jobs (every AWAITED_POLL_S while a queued
    job waits for the net), reads FINISHED:ABORTED and gives the abort's verdict: ABORTED,
    net free, no stray, while the job runner starts the run."""
    job_id = _dispatched(world)
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    reply_unclassified_after_the_server_acted(world)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING
    world.enqueue("waiting", net="net-a")
    monitor.monitor_awaited_runs(world.rt)
    assert world.job(job_id).state == JobState.ABORTED  # the verdict f31b5cd gives
    _runner_overwrites_the_mark(world)
    assert dispatch.claim_and_start(world.rt) == [], "net-a took a job beside a run it may start"


def test_the_servers_profiles_seed_222_which_loses_a_reply_after_a_mark_stays_clean():
    """The simulator reaches the settle_stray_runs case above on its own: profile
    "servers" (slow_start 0.3, lost_reply 0.1), seed 222. At t=103.2 s the settle's abort
    marks nv-net-a-3 while its job runner starts it, the reply is lost (NOTHING_TO_ABORT),
    job_status reads FINISHED:ABORTED, the stray is forgotten; at 105.5 s the next job is
    dispatched on net-a and at 108 s both runs are live. (The default sweep, profiles by
    seed, did not reach it in seeds 0-399; the servers profile alone, once in 800 seeds.)"""
    from tests.sim.profiles import PROFILES
    from tests.sim.seeds import run_seed

    servers = next(p for p in PROFILES if p.name == "servers")
    result = run_seed(222, servers)
    assert result.ok, result.summary()


# --- strays held for a window: kept, pushed on, and bounded -------------------------------


def test_a_before_start_stray_survives_an_unreachable_server_until_it_answers(world):
    """An abort answered before-start, then the server unreachable past the window: the
    stray is kept (nothing said the run is over), and settled once the server answers."""
    job_id = _dispatched(world)
    assert world.abort(job_id) == JobState.ABORTED
    world.server("net-a").up = False
    world.clock.advance(abort.RUN_START_WINDOW_S + 1)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    world.server("net-a").up = True
    assert abort.settle_stray_runs(world.rt, "net-a") == 0


def test_a_stray_known_by_its_token_only_and_answered_before_start_keeps_the_window(world):
    """A stray known by its token only (a submit whose reply was lost) whose settle finds
    the run SUBMITTED: the abort answers before-start and the window holds the net."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    token = world.job(job_id).submit_token
    world.server("net-a").statuses["nv-1"] = "SUBMITTED"
    world.add_stray(job_id, "net-a", None, token=token)
    held_for_one_window(world)


def test_an_overrun_abort_answered_before_start_holds_an_always_on_net(always_on):
    """monitor._stop_overrun whose abort is answered before-start: the run is kept as a
    stray with the window, and the always-on net takes no job beside it."""
    world = always_on
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "DISPATCHED"
    world.clock.advance(world.rt.settings.max_run_s + 1)
    assert monitor.monitor_running_jobs(world.rt)[str(job_id)] == "failed: overran"
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_a_moved_on_stray_whose_settle_is_answered_before_start_gets_the_window(world):
    """dispatch's "submit landed after the job moved on" stray (no window of its own): the
    settle's abort is answered before-start, which sets the window in the same round."""
    job_id = _dispatched(world, "SUBMITTED")
    _moved_on_with_a_stray(world, job_id)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW
    _runner_overwrites_the_mark(world)
    _net_takes_no_new_job(world)


def test_a_stray_whose_aborts_keep_answering_before_start_still_expires(world):
    """A stray whose every settle round's abort is answered before-start has its window
    pushed on each round, so `expire_stray_runs` (which now skips strays inside their
    window) never sees it overdue: the ABORT_TIMEOUT_S bound on a stray that cannot be
    settled is gone. On a scale-to-zero net a job waiting for that net keeps its server up
    (idle scale-down spares a net a claimable job fits) while the stray keeps the job off
    it: the net is blocked, its server up, for ever. Before the change the same abort was
    answered ABORTED, the status read SUBMITTED (GOING), and the net was taken down after
    ABORT_TIMEOUT_S. The simulator's deaf waiting runs on scale-to-zero nets behave exactly
    so (app/sim/admin.py abort)."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "SUBMITTED"  # its sites never connect
    _aborts_never_take_before_start(world)
    assert world.abort(job_id) == JobState.ABORTED
    assert len(_strays(world)) == 1
    waiting = world.enqueue("next", net="net-a")
    limit = world.rt.settings.abort_timeout_s + 3 * abort.RUN_START_WINDOW_S
    elapsed = 0.0
    while elapsed < limit:
        world.clock.advance(30)
        elapsed += 30
        reconciler.reconcile(world.rt)
        if not _strays(world) or world.driver("net-a").replicas == 0:
            break
    assert world.driver("net-a").replicas == 0 or not _strays(world), (
        f"after {elapsed:.0f}s (ABORT_TIMEOUT_S={world.rt.settings.abort_timeout_s:.0f}) the "
        f"stray still holds net-a, its server up, settle_after pushed to "
        f"{_strays(world)[0].settle_after}; job {world.job(waiting).state}"
    )


def test_a_stray_whose_window_is_never_pushed_expires_after_it(world):
    """Control for the defect above: a stray held by a window that is never pushed, whose
    run the server keeps reading as going (an abort that does not take), is overdue once
    the window has passed and ABORT_TIMEOUT_S since it was recorded: the net is taken
    down."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "DISPATCHED"
    assert world.abort(job_id) == JobState.ABORTED  # before-start: a window
    world.server("net-a").statuses["nv-1"] = "RUNNING"  # the runner started it over the mark
    world.server("net-a").killed.discard("nv-1")
    admin = world.admin("net-a")
    admin.abort = lambda _id: AbortResult(AbortOutcome.ABORTED, "deaf")  # type: ignore[method-assign]
    world.enqueue("next", net="net-a")
    limit = world.rt.settings.abort_timeout_s + 3 * abort.RUN_START_WINDOW_S
    elapsed = 0.0
    while elapsed < limit and world.driver("net-a").replicas > 0:
        world.clock.advance(30)
        elapsed += 30
        reconciler.reconcile(world.rt)
    assert world.driver("net-a").replicas == 0


def test_an_operator_abort_while_nvflare_queues_the_run_holds_then_frees_the_net(world):
    """An operator aborts the run by hand while nvflare still has it SUBMITTED (its sites
    not connected): FINISHED:ABORTED with no start time. The monitor gives the job its
    verdict (RUN_ABORTED) and keeps the run as a stray for the window, anchored once; the
    net takes the next job once it has passed. Counted once: the job is over when the
    stray is recorded."""
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    server = world.server("net-a")
    server.statuses["nv-1"] = "FINISHED:ABORTED"
    server.unstarted.add("nv-1")
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.ABORTED
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW
    other = world.enqueue("next", net="net-a")
    for _ in range(3):  # a mere UNSTARTED reading never pushes the window
        world.clock.advance(abort.RUN_START_WINDOW_S / 4)
        assert abort.settle_stray_runs(world.rt, "net-a") == 1
        assert dispatch.claim_and_start(world.rt) == []
    world.clock.advance(abort.RUN_START_WINDOW_S / 4)
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [other]


def test_a_finished_run_whose_status_then_cannot_be_read_is_held_for_the_window_only(always_on):
    """_settle_finished: the abort found the run finished (FINISHED:COMPLETED), the status
    read that follows fails (a blip). The run is now kept as a stray with a window even
    though it completed; on an always-on net that holds it only until the server answers
    and the window has passed (not for ever)."""
    world = always_on
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    admin = world.admin("net-a")
    real = admin.job_status

    def blip(nvflare_job_id: str):
        admin.job_status = real  # type: ignore[method-assign]
        raise ServerUnavailable("blip")

    admin.job_status = blip  # type: ignore[method-assign]
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTED
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW
    other = world.enqueue("next", net="net-a")
    world.clock.advance(abort.RUN_START_WINDOW_S)
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [other]


def test_a_report_of_an_aborting_job_whose_abort_marked_the_run_holds_the_net(world):
    """flip-api reports an ABORTING job (its before-start abort acted, the reply was an
    error) as failed: report_job_status records the run as a stray with no window; the
    settle's abort finds the mark (ALREADY_FINISHED), reads it unstarted and anchors the
    window from then; the runner's overwrite within it is caught."""
    from app.schemas import ReportJobStatus

    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "DISPATCHED"
    assert intake.request_abort(world.rt, job_id, "user").decision.state == JobState.ABORTING
    reply_unclassified_after_the_server_acted(world)
    assert abort.abort_on_server(world.rt, job_id) == JobState.ABORTING
    report = ReportJobStatus(job_id=job_id, status="error", detail="site crashed")
    intake.report_status(world.rt, report)
    assert world.job(job_id).state in (JobState.FAILED, JobState.ABORTED)
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    [stray] = _strays(world)
    assert stray.settle_after == world.clock() + WINDOW
    world.server("net-a").statuses["nv-1"] = "RUNNING"  # the runner overwrites the mark
    world.clock.advance(10)
    other = world.enqueue("next", net="net-a")
    assert abort.settle_stray_runs(world.rt, "net-a") == 1
    assert dispatch.claim_and_start(world.rt) == []
    assert world.job(other).state == JobState.QUEUED
    assert world.server("net-a").aborted.count("nv-1") == 2


# --- the simulator's model against nvflare 2.9 ----------------------------------------------


class _Clock:
    t = 100.0


class _Host:
    """Just what SimAdmin.abort reads of its host: no fault fires."""

    def __init__(self, scales_to_zero: bool) -> None:
        import random

        from app.sim.faults import FaultProfile

        self.clock = _Clock()
        self.rng = random.Random(0)
        self.faults = FaultProfile(name="quiet")
        self._scales = scales_to_zero

    def hook(self, point: str, net: str | None) -> None:
        pass

    def reader(self) -> int | None:
        return None

    def scales_to_zero(self, net: str) -> bool:
        return self._scales


class _Server:
    kit_broken = False
    kit_elsewhere = None
    kit_answer = "unreachable"
    kit_other = None

    def __init__(self) -> None:
        self.store: dict = {}
        self.finished_seen: set[str] = set()

    def answering(self, t: float) -> bool:
        return True


class _Cluster:
    def __init__(self, host: _Host) -> None:
        self.host = host
        self.servers = {"net-a": _Server()}

    def advance(self, t: float) -> None:
        pass


def test_the_simulators_deaf_waiting_run_is_marked_aborted_as_nvflare_marks_it():
    """nvflare 2.9's abort_job marks a SUBMITTED job FINISHED:ABORTED whatever its sites
    do (job_cmds.py: set_status(FINISHED_ABORTED) before any process is involved), so a
    second abort finds it finished. The simulator's deaf run that waits for its sites, on a
    net that scales to zero, answers "before running it" and stays SUBMITTED, so every
    settle round's abort is answered before-start again (the never-expiring stray of the
    defect above, which nvflare 2.9 itself bounds at two pushes: DISPATCHED, then RUNNING,
    written over the mark by its job runner)."""
    from app.sim.admin import SimAdmin
    from app.sim.servers import Run

    host = _Host(scales_to_zero=True)
    cluster = _Cluster(host)
    run = Run(
        net="net-a",
        nvflare_id="nv-1",
        token="t",
        job_id="j",
        attempt=0,
        incarnation=0,
        submitted_at=0.0,
        end_at=None,
        outcome="FINISHED:COMPLETED",
        poisoned=False,
        waiting=True,
    )
    run.deaf = True
    cluster.servers["net-a"].store["nv-1"] = run
    admin = SimAdmin(cluster, "net-a")  # type: ignore[arg-type]
    first = admin.abort("nv-1")
    assert first.outcome == AbortOutcome.ABORTED_BEFORE_START
    assert run.status(host.clock.t) == "FINISHED:ABORTED", "nvflare marks a SUBMITTED job"
    assert admin.abort("nv-1").outcome == AbortOutcome.ALREADY_FINISHED
