"""FLIP's job flow on the unit tier: metadata, prepared jobs (submitted as the bundle is now,
whatever changed between attempts: content, mtimes, a linked folder, a file name that is
not UTF-8), holding the server until flip-api reports the results upload, and the report
timeout."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from pydantic import ValidationError

from app.adapters import jobdefs
from app.errors import InvalidRequest
from app.schemas import EnqueueJob, ReportedStatus, ReportJobStatus
from app.settings import Settings
from app.usecases import dispatch, monitor, records, scale_down
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


def test_metadata_is_measured_in_utf_8_bytes_not_ascii_escapes():
    """16 KiB of metadata as stored (UTF-8): a site's name in another script is 3 bytes a
    character, and was counted as its 6-byte `\\uXXXX` escape (12 for an emoji), so 3,000
    characters of Japanese (9,000 bytes) were refused as 18,000."""
    text = "\u75c5\u9662" * 1500  # "hospital", 3,000 characters, 9,000 bytes in UTF-8
    ok = EnqueueJob(caller_key="k", definition="d", metadata={"site": text})
    assert ok.metadata == {"site": text}
    with pytest.raises(ValidationError, match="at most 16384"):
        EnqueueJob(caller_key="k", definition="d", metadata={"site": "\u75c5" * 5500})


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
        records.requeue_job(session, job_id, "server restarted", world.clock())
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
        records.requeue_job(session, job_id, "server restarted", world.clock())
    script.write_text("v2")
    os.utime(script, ns=(10**18, 10**18))
    world.run_pipeline(job_id)
    second = world.server("net-a").folders[-1]
    assert (second / "app" / "config" / "train.py").read_text() == "v2"


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
        records.requeue_job(session, job_id, "server restarted", world.clock())
    (shared / "train.py").write_text("version 2")
    world.run_pipeline(job_id)
    second = world.server("net-a").folders[-1]
    assert (second / "app" / "custom" / "train.py").read_text() == "version 2"


def test_a_bundle_rebuilt_with_fixed_mtimes_is_prepared_afresh(tmp_path):
    """A job folder unpacked from a zip (every mtime 1980-01-01) or built with a fixed
    `tar --mtime` is replaced between two attempts by one whose config differs by a digit:
    the second attempt must submit the new content (fix 2's promise), not the first copy."""
    import os
    import uuid

    from app.adapters.jobdefs import prepare

    bundle = tmp_path / "jobs" / "fedavg"
    (bundle / "app" / "config").mkdir(parents=True)
    config = bundle / "app" / "config" / "config_fed_server.json"
    fixed_ns = 315_532_800 * 10**9

    def build(rounds: int) -> None:
        (bundle / "meta.json").write_text('{"deploy_map": {"app": ["@ALL"]}}')
        config.write_text(f'{{"num_rounds": {rounds}}}')
        for path in (bundle / "meta.json", config):
            os.utime(path, ns=(fixed_ns, fixed_ns))

    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=tmp_path / "jobs")
    job_id = uuid.uuid4()
    build(5)
    first = prepare(settings, bundle, job_id, ["site-1"], None)
    build(6)  # the next attempt's bundle: one digit changed, same size, same mtimes
    second = prepare(settings, bundle, job_id, ["site-1"], None)

    assert (second / "app" / "config" / "config_fed_server.json").read_text() == (
        '{"num_rounds": 6}'
    ), f"submitted from {first}"


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
        assert records.report_job_status(session, report, held.clock()) == JobState.COMPLETED
    assert held.net("net-a").state == NetState.READY


def test_a_failed_upload_fails_the_job(held):
    job_id = _finished_run(held)
    with held.rt.sessions.begin() as session:
        report = ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOAD_FAILED)
        assert records.report_job_status(session, report, held.clock()) == JobState.FAILED


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
