"""FLIP's job flow on the unit tier: metadata, prepared jobs (submitted as the bundle is now,
whatever changed between attempts: content, mtimes, a linked folder, a file name that is
not UTF-8), holding the server until flip-api reports the results upload, and the report
timeout."""

from __future__ import annotations

import json
import uuid

import pytest
from pydantic import ValidationError

from app.adapters import jobdefs
from app.errors import InvalidRequest
from app.schemas import EnqueueJob, ReportedStatus, ReportJobStatus
from app.usecases import monitor, scale_down, services
from models import JobState, NetState
from tests.unit.conftest import World


@pytest.fixture
def held(world: World) -> World:
    """The world with net-a releasing its server only after flip-api's report."""
    net = world.rt.settings.net("net-a")
    object.__setattr__(net, "release_after", "reported")
    return world


def test_metadata_is_a_json_object_of_at_most_16_kib():
    ok = EnqueueJob(caller_key="k", definition="d", metadata={"model_id": "m1", "n": [1, 2]})
    assert ok.metadata == {"model_id": "m1", "n": [1, 2]}
    with pytest.raises(ValidationError):
        EnqueueJob.model_validate({"caller_key": "k", "definition": "d", "metadata": [1, 2]})
    with pytest.raises(ValidationError, match="at most 16384"):
        EnqueueJob(caller_key="k", definition="d", metadata={"blob": "x" * 16_400})


def _nested(levels: int) -> dict:
    metadata: dict = {}
    for _ in range(levels - 1):
        metadata = {"a": metadata}
    return metadata


def test_metadata_nested_past_its_depth_bound_is_refused_not_a_crash_later():
    """Refused by the payload check itself, with its bound: a few hundred levels once
    passed it and then broke the digest (pydantic's serialiser stops at its own depth
    limit), a thousand broke the check itself (RecursionError)."""
    deepest = EnqueueJob(caller_key="k", definition="d", metadata=_nested(32))
    assert len(deepest.digest()) == 64
    for levels in (33, 300, 2000):
        with pytest.raises(ValidationError, match="metadata nests deeper than 32 levels"):
            EnqueueJob(caller_key="k", definition="d", metadata=_nested(levels))


def test_metadata_is_stored_with_the_job(world):
    job_id = world.enqueue("j", net="net-a", metadata={"model_id": "m1", "project_id": "p"})
    assert world.job(job_id).metadata_ == {"model_id": "m1", "project_id": "p"}


def test_prepared_copy_deploys_to_the_required_sites_and_leaves_the_bundle_alone(world, job_root):
    bundle = job_root / "tiny-job"
    before = (bundle / "meta.json").read_text()
    job_id = uuid.uuid4()
    folder = jobdefs.prepare(
        world.rt.settings, bundle, job_id, ["site-2"], {"resource_spec": {"site-2": {"gpu": 1}}}
    )
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["deploy_map"] == {"app": ["server", "site-2"]}
    assert meta["min_clients"] == 1
    assert meta["resource_spec"] == {"site-2": {"gpu": 1}}
    assert (bundle / "meta.json").read_text() == before
    assert jobdefs.sweep_prepared(world.rt.settings, set()) == []  # not ended: kept
    assert jobdefs.sweep_prepared(world.rt.settings, {str(job_id)}) == [str(job_id)]
    assert not folder.exists()


def test_a_bundle_without_meta_json_gets_one_for_its_single_app(tmp_path):
    bundle = tmp_path / "fedavg"
    (bundle / "app_x" / "config").mkdir(parents=True)
    meta = jobdefs.prepared_meta(None, bundle, ["a", "b"], None)
    assert meta == {
        "name": "fedavg",
        "deploy_map": {"app_x": ["server", "a", "b"]},
        "min_clients": 2,
    }
    (bundle / "app_y" / "config").mkdir(parents=True)
    with pytest.raises(InvalidRequest, match="2 app folders"):
        jobdefs.prepared_meta(None, bundle, ["a"], None)


def test_server_apps_stay_on_the_server(tmp_path):
    deploy = {"deploy_map": {"srv": ["server"], "cli": ["site-1", "site-9"]}}
    meta = jobdefs.prepared_meta(deploy, tmp_path, ["site-1", "site-2"], None)
    assert meta["deploy_map"] == {"srv": ["server"], "cli": ["site-1", "site-2"]}


def test_a_bundle_changed_between_attempts_is_submitted_as_it_is_now(world, job_root):
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    first = world.server("net-a").folders[-1]
    with world.rt.sessions.begin() as session:
        services.requeue_job(session, job_id, "server restarted", world.clock())
    (job_root / "tiny-job" / "app" / "config" / "train.py").write_text("v2")
    world.run_pipeline(job_id)
    second = world.server("net-a").folders[-1]
    assert second != first
    assert (second / "app" / "config" / "train.py").read_text() == "v2"


def test_a_bundle_rebuilt_with_the_same_sizes_and_mtimes_is_submitted_as_it_is_now(world, job_root):
    # A reproducible build (or an unpacked archive) gives every version the same mtimes:
    # the simulator's sweep found the copy keyed by size and mtime reused (seed 34).
    import os

    script = job_root / "tiny-job" / "app" / "config" / "train.py"
    script.write_text("v1")
    os.utime(script, ns=(10**18, 10**18))
    job_id = world.enqueue("j", net="net-a")
    world.run_pipeline(job_id)
    with world.rt.sessions.begin() as session:
        services.requeue_job(session, job_id, "server restarted", world.clock())
    script.write_text("v2")
    os.utime(script, ns=(10**18, 10**18))
    world.run_pipeline(job_id)
    second = world.server("net-a").folders[-1]
    assert (second / "app" / "config" / "train.py").read_text() == "v2"


def _finished_run(world: World) -> uuid.UUID:
    job_id = world.enqueue("j", net="net-a", metadata={"model_id": "m"})
    world.run_pipeline(job_id)
    world.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(world.rt)
    return job_id


def test_a_completed_run_holds_the_server_until_results_are_reported(held):
    job_id = _finished_run(held)
    assert held.job(job_id).state == JobState.FINISHING
    assert held.net("net-a").state == NetState.BUSY
    held.clock.advance(10_000)
    assert scale_down.scale_down_idle_nets(held.rt) == []
    assert scale_down.keep_alive_busy_nets(held.rt) == ["net-a"]
    assert held.driver("net-a").replicas == 1
    with held.rt.sessions.begin() as session:
        report = ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED)
        assert services.report_job_status(session, report, held.clock()) == JobState.COMPLETED
    assert held.net("net-a").state == NetState.READY


def test_a_failed_upload_fails_the_job(held):
    job_id = _finished_run(held)
    with held.rt.sessions.begin() as session:
        report = ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOAD_FAILED)
        assert services.report_job_status(session, report, held.clock()) == JobState.FAILED


def test_a_report_that_never_comes_settles_the_job_after_the_timeout(held):
    job_id = _finished_run(held)
    held.clock.advance(held.rt.settings.report_timeout_s - 1)
    monitor.monitor_running_jobs(held.rt)
    assert held.job(job_id).state == JobState.FINISHING
    held.clock.advance(2)
    outcomes = monitor.monitor_running_jobs(held.rt)
    assert outcomes[str(job_id)].startswith("report timeout")
    assert held.job(job_id).state == JobState.FAILED  # REPORT_TIMEOUT_OUTCOME default
    assert held.net("net-a").state == NetState.READY


def test_release_after_finished_is_the_default(world):
    job_id = _finished_run(world)
    assert world.job(job_id).state == JobState.COMPLETED


def test_abort_of_a_finishing_job_is_immediate(held):
    job_id = _finished_run(held)
    assert held.abort(job_id) == JobState.ABORTED
    assert held.net("net-a").state == NetState.READY


def test_concurrent_prepares_of_one_job_never_pull_the_folder_from_under_a_submit(world, job_root):
    """Reconcile re-sends a DISPATCHING job's dispatch while the first may still run (the
    submit token keeps that harmless), so two workers prepare the same job at once. A folder
    one of them is submitting must never vanish or change under it (NVFLARE then rejects the
    job as invalid and it FAILs: seen in tests/e2e/test_faults.py)."""
    import threading

    bundle = job_root / "tiny-job"
    (bundle / "data.bin").write_bytes(b"x" * 200_000)  # a copy that takes a moment
    job_id = uuid.uuid4()
    first = jobdefs.prepare(world.rt.settings, bundle, job_id, ["site-1"], None)
    meta_inode = (first / "meta.json").stat().st_ino
    errors: list[BaseException] = []
    stop = threading.Event()

    def preparer() -> None:
        try:
            while not stop.is_set():
                assert jobdefs.prepare(world.rt.settings, bundle, job_id, ["site-1"], None) == first
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=preparer) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(200):  # what a submit does: read the folder it was handed
            assert (first / "meta.json").stat().st_ino == meta_inode
            assert (first / "data.bin").stat().st_size == 200_000
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert not list(first.parent.glob("*.partial*"))  # no staging copy left behind
