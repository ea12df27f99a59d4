"""Promises of the job pipeline that did not hold (found by round 16's reviewers; each test
failed on the code before its fix): an abort handled before its enqueue, jobs no declared net
can run any more, one bad FINISHING row, a gone bundle's landed run, a first try's stray."""

from __future__ import annotations

import json
import shutil

import pytest
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from app import names
from app.errors import ServerUnavailable
from app.handlers import HANDLERS, Verdict, on_error
from app.schemas import job_id_for
from app.settings import Settings
from app.usecases import abort, declared_nets, dispatch, monitor, reconciler, requests
from app.usecases.dispatch import Step
from models import Job, JobState
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of


def _enqueue_payload(key: str) -> dict[str, object]:
    return {"caller_key": key, "definition": "tiny-job", "net": "net-a"}


def test_an_abort_sent_after_an_enqueue_the_database_delayed_is_not_lost(world):
    """flip-api sends enqueue_job, then (the user changed their mind) abort_job for the job
    id it already knows (uuid5 of its caller_key). The enqueue meets the database down
    (a restart): its message is kept and tried again after a backoff (tasks/README.md,
    "What flip-api may rely on once send_task returned": carried out "exactly as if it had
    been handled at once, whatever the dispatcher's database does meanwhile"). The database
    comes back, the abort is handled first, finds no job and is acknowledged away as
    "rejected: not found"; then the enqueue's retry stores the job QUEUED, and it runs."""
    key = "flip-model-7"
    job_id = job_id_for(key)
    down = OperationalError("INSERT INTO jobs", {}, Exception("connection refused"))
    verdict = on_error(HANDLERS[names.ENQUEUE_JOB], down, 0, world.rt.settings)
    assert verdict is Verdict.RETRY  # the enqueue's message waits its countdown
    # Meanwhile the database is back and the abort, sent after the enqueue, runs first.
    answer = requests.abort_job(world.rt, {"job_id": str(job_id), "reason": "user cancelled"})
    # Then the enqueue's retry.
    requests.enqueue_job(world.rt, _enqueue_payload(key))
    started = [a.job_id for a in dispatch.claim_and_start(world.rt)]
    assert world.job(job_id).state == JobState.ABORTED, (answer, started)


def _sited_pair(tmp_path, job_root, sqlite_factory, clock):
    """net-a has site-1..3; `fixed` (always-on, static) has site-1 and site-2 only."""
    nets = [
        net_decl(tmp_path, "net-a", "ecs", sites=["site-1", "site-2", "site-3"]),
        net_decl(tmp_path, "fixed", "static", sites=["site-1", "site-2"]),
    ]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock)


def _redeploy_without_net_a(world, tmp_path, job_root) -> None:
    """NETS without net-a (the only net with site-3), past the grace that makes it removed."""
    world.clock.advance(declared_nets.removed_after_s(world.rt.settings) + 1)
    world.rt.settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, "fixed", "static", sites=["site-1", "site-2"])]),
        PER_JOB_FL_SERVER="true",
    )


def _housekeeping_for(world, hours: int) -> None:
    """Every loop that could move a QUEUED job, each beat interval for `hours`."""
    for _ in range(hours * 60):
        world.clock.advance(60)
        reconciler.reconcile(world.rt)
        monitor.monitor_running_jobs(world.rt)
        dispatch.claim_and_start(world.rt)


def test_a_queued_job_no_declared_net_can_run_does_not_wait_for_ever(
    tmp_path, job_root, sqlite_factory, clock
):
    """An unpinned job needing site-3, accepted while net-a had it. A redeploy removes net-a:
    no declared net has site-3 now (an enqueue of the same payload would be refused: "no net
    has every site"), so the job can never run. A QUEUED job pinned to a removed net is
    failed (`undeclared.settle_undeclared`: "it can never run"); this one, unpinned, waits
    QUEUED for ever: no loop ends it, and flip-api is never told."""
    world = _sited_pair(tmp_path, job_root, sqlite_factory, clock)
    job_id = world.enqueue("needs-site-3", required_sites=["site-3"])
    _redeploy_without_net_a(world, tmp_path, job_root)
    _housekeeping_for(world, hours=7)  # past AGING_S (6 h)
    assert world.job(job_id).state != JobState.QUEUED


def test_jobs_no_declared_net_can_run_do_not_block_a_free_net_for_ever(
    tmp_path, job_root, sqlite_factory, clock
):
    """As above, with 50 such jobs (a project's burst, all needing site-3): they are first in
    the claim's order (the oldest, soon aged) and never leave the queue; a claim that looked
    through `fixed`'s next 50 jobs found none that fits, for ever: a job that fits `fixed`
    (free, idle) was never claimed, though its place in line said it was next."""
    world = _sited_pair(tmp_path, job_root, sqlite_factory, clock)
    for i in range(50):
        world.enqueue(f"needs-site-3-{i}", required_sites=["site-3"])
    _redeploy_without_net_a(world, tmp_path, job_root)
    fits = world.enqueue("fits-fixed", required_sites=["site-1"])
    _housekeeping_for(world, hours=1)
    assert world.job(fits).state != JobState.QUEUED


def test_one_finishing_job_with_no_net_does_not_stop_the_monitor_for_every_net(world):
    """app/usecases/README.md: "Every housekeeping loop handles each net on its own: one
    net's failure ... never stops the other nets." One bad FINISHING row (its net_name NULL:
    a hand edit, a restore) overdue for its report makes `expire_report_waits` raise its
    `assert net_name is not None` outside the per-net isolation, before the round watches
    any run: every net's finished run is left RUNNING (its server up), every round."""
    bad = world.enqueue("bad-row", net="net-a")
    world.run_pipeline(bad)
    with world.rt.sessions.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id == bad)
            .values(state=JobState.FINISHING, net_name=None, state_changed_at=world.clock())
        )
    good = world.enqueue("good", net="fixed")
    world.run_pipeline(good)
    world.server("fixed").statuses["nv-1"] = "FINISHED:COMPLETED"
    world.clock.advance(world.rt.settings.report_timeout_s + 1)
    monitor.monitor_running_jobs(world.rt)
    assert world.job(good).state == JobState.COMPLETED
    assert world.job(bad).state == JobState.FAILED  # REPORT_TIMEOUT_OUTCOME's default


def test_a_resent_submit_that_finds_its_bundle_gone_leaves_no_run_uncounted(world, job_root):
    """The submit lands (NVFLARE runs nv-1) and its reply is lost: the step retries with the
    same token, which would adopt nv-1 (app/usecases/README.md, Guarantees: "a submit whose
    reply was lost keeps its attempt and token"). Before the retry the job's folder is
    removed from the job root (FLIP deleted the model). The retry's `materialize` raises
    BundleMissing and `refused_definitions.fail_job` FAILS the DISPATCHING job and frees its
    net with no stray run: nv-1 runs on, counted by nobody, and the next job is submitted
    beside it on the same server."""
    first = world.enqueue("first", net="net-a")
    net, attempt = world.run_until_ready(first)
    admin = world.admin("net-a")
    submit = admin.submit

    def reply_lost(*args, **kwargs):
        submit(*args, **kwargs)  # the run starts on the server
        raise ServerUnavailable("connection reset before the reply")

    admin.submit = reply_lost  # type: ignore[method-assign]
    with pytest.raises(ServerUnavailable):
        dispatch.dispatch(world.rt, first, net, attempt)
    del admin.submit
    shutil.rmtree(job_root / "tiny-job")
    dispatch.dispatch(world.rt, first, net, attempt)  # the step's retry
    assert world.job(first).state == JobState.FAILED  # its bundle is gone for good
    [(_, kwargs)] = [m for m in world.outbox.sent if m[0] == names.SETTLE_STRAY_RUNS]
    assert abort.settle_stray_runs(world.rt, **kwargs) == 0  # nv-1 looked up and aborted
    (job_root / "tiny-job" / "app").mkdir(parents=True)  # the next job's bundle
    (job_root / "tiny-job" / "meta.json").write_text('{"deploy_map": {"app": ["@ALL"]}}')
    second = world.enqueue("second", net="net-a")
    for assignment in dispatch.claim_and_start(world.rt):
        got = dispatch.start(world.rt, assignment.job_id, assignment.net_name, assignment.attempt)
        if got.step == Step.DONE:
            dispatch.dispatch(world.rt, assignment.job_id, assignment.net_name, assignment.attempt)
    server = world.server("net-a")
    live = sorted(run for run, status in server.statuses.items() if status == "RUNNING")
    assert len(live) <= 1, (live, world.job(first).state, world.job(second).state)


def test_a_first_submit_try_that_finds_its_bundle_gone_records_no_stray(world, job_root):
    """refused_definitions.fail_job keeps the attempt's token as a stray because "an
    earlier try's submit may have landed". On the first try there is no earlier one: the
    token is stored (start_dispatch) before the bundle is copied, so a bundle removed
    before any submit was sent still leaves a stray, and the net takes no job until a
    lookup on its server settles a run that never existed (kept while the server does not
    answer; on a net whose runs revive, a stopped net is started again to settle it)."""
    from sqlalchemy import func, select

    from models import StrayRun

    first = world.enqueue("first", net="net-a")
    net, attempt = world.run_until_ready(first)
    shutil.rmtree(job_root / "tiny-job")
    dispatch.dispatch(world.rt, first, net, attempt)  # the first try: nothing is sent
    assert world.job(first).state == JobState.FAILED
    assert world.server("net-a").statuses == {}
    with world.rt.sessions() as session:
        assert session.scalar(select(func.count()).select_from(StrayRun)) == 0
