"""Review of 7656796 (a run aborted before nvflare's job runner started it is held as a stray
run for RUN_START_WINDOW_S; a fresh before-start answer to the settle's own abort pushes the
window on; expire_stray_runs ignores strays inside their window).

The tests named test_defect_* failed on 7656796 and pass since expire_stray_runs counts from
when a stray was recorded (a held one no sooner than its window) and the simulator marks a
SUBMITTED run whatever its deafness; test_holds_* pin what withstood the review."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.adapters.nvflare.base import AbortOutcome, AbortResult
from app.errors import ServerUnavailable
from app.usecases import abort, dispatch, intake, monitor, reconciler
from models import JobState, StrayRun
from tests.unit.abort_replies import reply_unclassified_after_the_server_acted

WINDOW = timedelta(seconds=abort.RUN_START_WINDOW_S)


def _strays(world) -> list[StrayRun]:
    with world.rt.sessions() as session:
        return list(session.scalars(select(StrayRun)))


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


# --- DEFECT ---------------------------------------------------------------------------------


def test_defect_a_stray_whose_aborts_keep_answering_before_start_never_expires(world):
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


# --- HOLDS ----------------------------------------------------------------------------------


def test_holds_the_same_stray_without_pushes_expires_after_its_window(world):
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


def test_holds_operator_abort_while_queued_in_nvflare_holds_then_frees_the_net(world):
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
        assert dispatch.assign_jobs(world.rt) == []
    world.clock.advance(abort.RUN_START_WINDOW_S / 4)
    assert abort.settle_stray_runs(world.rt, "net-a") == 0
    assert [a.job_id for a in dispatch.assign_jobs(world.rt)] == [other]


def test_holds_settle_finished_with_an_unreadable_status_is_bounded(always_on):
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
    assert [a.job_id for a in dispatch.assign_jobs(world.rt)] == [other]


def test_holds_report_of_an_aborting_job_whose_abort_marked_the_run(world):
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
    assert dispatch.assign_jobs(world.rt) == []
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

    def scales_to_zero(self, net: str) -> bool:
        return self._scales


class _Server:
    kit_broken = False

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


def test_defect_sim_deaf_waiting_run_answers_before_start_but_keeps_submitted():
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
