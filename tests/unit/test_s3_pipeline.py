"""S3 bundles inside the pipeline: dispatch fails the job for an unusable bundle, retries
(raises) on a transient S3 error, and reconcile deletes the bundles of jobs that ended.

S3 here is STUBBED at the botocore boundary (`Stubber` on a real S3 client handed to the
fetcher in place of the default-chain client); the real-server tests are
tests/integration/test_s3_bundles.py.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import botocore.session
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from sqlalchemy import select

from app.adapters import s3_bundles, s3_client
from app.errors import BundleTransientError
from app.schemas import EnqueueJob
from app.usecases import dispatch, enqueue, reconciler, records
from app.usecases.dispatch import Step
from models import JobState, NetEvent, NetState, ReasonCode

URI = "s3://flip-jobs/jobs/fedavg"


@pytest.fixture
def stub(monkeypatch):
    client = botocore.session.get_session().create_client(
        "s3", region_name="eu-west-2", aws_access_key_id="stub", aws_secret_access_key="stub"
    )
    monkeypatch.setattr(s3_client, "make_s3_client", lambda *a, **k: client)
    with Stubber(client) as stubber:
        yield stubber


def _dispatching(world) -> tuple[uuid.UUID, int]:
    """An S3 job claimed by the always-on net, ready for the dispatch step, and its attempt."""
    with world.rt.sessions.begin() as session:
        job_id = enqueue.enqueue_job(
            session,
            world.rt.settings,
            EnqueueJob(caller_key="s3-job", definition=URI, net="fixed", required_sites=["s"]),
            world.clock(),
        ).job_id
    world.server("fixed").sites = ["s"]
    assignment = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    ready = dispatch.check_ready(world.rt, job_id, "fixed", assignment.attempt)
    assert ready.step == Step.DONE
    return job_id, assignment.attempt


def test_an_unavailable_bundle_fails_the_job_at_once(world, stub):
    job_id, attempt = _dispatching(world)
    stub.add_client_error("list_objects_v2", "NoSuchBucket", "", 404)

    result = dispatch.dispatch(world.rt, job_id, "fixed", attempt)

    assert result.step == Step.GAVE_UP
    job = world.job(job_id)
    assert (job.state, job.reason_code) == (JobState.FAILED, ReasonCode.BUNDLE_MISSING)
    assert "s3://flip-jobs/jobs/fedavg: ListObjectsV2: NoSuchBucket" in (job.last_error or "")
    assert world.server("fixed").submitted == {}


def test_a_transient_s3_error_is_raised_for_the_task_to_retry(world, stub):
    job_id, attempt = _dispatching(world)
    stub.add_client_error("list_objects_v2", "SlowDown", "", 503)

    with pytest.raises(BundleTransientError):
        dispatch.dispatch(world.rt, job_id, "fixed", attempt)

    assert world.job(job_id).state == JobState.DISPATCHING  # not failed, not requeued
    assert world.server("fixed").submitted == {}


def test_the_fetched_bundle_is_submitted(world, stub):
    job_id, attempt = _dispatching(world)
    meta = b'{"name": "fedavg", "deploy_map": {"app": ["@ALL"]}}'
    stub.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": "jobs/fedavg/meta.json", "ETag": '"e"', "Size": len(meta)}]},
    )
    stub.add_response("get_object", {"Body": StreamingBody(io.BytesIO(meta), len(meta))})

    assert dispatch.dispatch(world.rt, job_id, "fixed", attempt).step == Step.DONE

    assert world.job(job_id).state == JobState.RUNNING
    folder = world.rt.settings.data_dir.resolve() / "job-cache" / str(job_id) / "bundle"
    assert (folder / "fedavg" / "meta.json").read_bytes() == meta  # the cache is never edited


def _cache(world, job_id) -> Path:
    folder = world.rt.settings.data_dir.resolve() / "job-cache" / str(job_id)
    (folder / "bundle" / "fedavg").mkdir(parents=True)
    (folder / "bundle" / "fedavg" / "meta.json").write_text("{}")
    return folder


def test_reconcile_discards_bundles_of_ended_and_unknown_jobs_only(world):
    queued = world.enqueue("still-queued", required_sites=["s"])
    failed = world.enqueue("failed", required_sites=["s"])
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, failed, JobState.FAILED, "test", world.clock(), code=ReasonCode.REPORTED_ERROR
        )
    unknown = uuid.uuid4()  # e.g. a database reset under an old data folder
    keep, drop, orphan = _cache(world, queued), _cache(world, failed), _cache(world, unknown)
    stranger = keep.parent / "not-a-job"
    stranger.mkdir()

    reconciler.reconcile(world.rt)

    assert keep.is_dir()  # a requeue fetches only what changed
    assert not drop.exists()
    assert not orphan.exists()
    assert stranger.is_dir()  # not ours to delete


def test_reconcile_without_a_cache_folder_is_fine(world):
    assert not (world.rt.settings.data_dir / "job-cache").exists()
    reconciler.reconcile(world.rt)


def _claimed_on_scaling_net(world) -> tuple[uuid.UUID, int]:
    with world.rt.sessions.begin() as session:
        job_id = enqueue.enqueue_job(
            session,
            world.rt.settings,
            EnqueueJob(caller_key="s3-cold", definition=URI, net="net-a", required_sites=["s"]),
            world.clock(),
        ).job_id
    assignment = next(a for a in dispatch.claim_and_start(world.rt) if a.job_id == job_id)
    return job_id, assignment.attempt


def test_a_missing_bundle_fails_the_job_before_any_scale_up(world, stub):
    job_id, attempt = _claimed_on_scaling_net(world)
    stub.add_response("list_objects_v2", {"KeyCount": 0, "IsTruncated": False})

    result = dispatch.scale_up(world.rt, job_id, "net-a", attempt)

    assert result.step == Step.GAVE_UP
    job = world.job(job_id)
    assert job.state == JobState.FAILED and "flip-jobs" in (job.last_error or "")
    assert world.driver("net-a").calls == []  # no scale-up wasted on it
    # The claim had moved the net to STARTING; nothing started, so it is STOPPED again now
    # rather than after reconcile's ready_timeout_s.
    net = world.net("net-a")
    assert net.state == NetState.STOPPED
    with world.rt.sessions() as session:
        last = session.scalars(
            select(NetEvent).where(NetEvent.net_name == "net-a").order_by(NetEvent.id.desc())
        ).first()
    assert (last.from_state, last.to_state) == (NetState.STARTING, NetState.STOPPED)
    assert str(job_id) in last.reason


def test_a_net_whose_driver_was_asked_is_not_marked_stopped_when_the_download_fails(world, stub):
    job_id, attempt = _claimed_on_scaling_net(world)
    listing = {
        "KeyCount": 1,
        "IsTruncated": False,
        "Contents": [{"Key": "jobs/fedavg/meta.json", "ETag": '"e1"', "Size": 2}],
    }
    stub.add_response("list_objects_v2", listing)  # the check passes: the net is scaled
    stub.add_client_error("list_objects_v2", "NoSuchBucket", "", 404)  # then it is gone

    assert dispatch.scale_up(world.rt, job_id, "net-a", attempt).step == Step.GAVE_UP

    assert world.job(job_id).state == JobState.FAILED
    assert world.driver("net-a").calls == [1]
    assert world.net("net-a").state == NetState.STARTING  # a server is coming: reconcile's


def test_a_net_claimed_by_another_job_meanwhile_stays_starting(world, stub):
    job_id, attempt = _claimed_on_scaling_net(world)
    stub.add_response("list_objects_v2", {"KeyCount": 0, "IsTruncated": False})
    other = world.enqueue("next-job", net="net-a", required_sites=["s"])
    real_observe = world.driver("net-a").observe

    def claimed_while_observed():  # the failed job freed the net; the next one takes it
        assert [a.job_id for a in dispatch.claim_and_start(world.rt)] == [other]
        return real_observe()

    world.driver("net-a").observe = claimed_while_observed
    dispatch.scale_up(world.rt, job_id, "net-a", attempt)

    assert world.net("net-a").state == NetState.STARTING
    assert world.job(other).state == JobState.ASSIGNED


def test_the_bundle_is_downloaded_while_the_server_boots(world, stub):
    job_id, attempt = _claimed_on_scaling_net(world)
    listing = {
        "KeyCount": 1,
        "IsTruncated": False,
        "Contents": [{"Key": "jobs/fedavg/meta.json", "ETag": '"e1"', "Size": 2}],
    }
    stub.add_response("list_objects_v2", listing)  # the check before scaling up
    stub.add_response("list_objects_v2", listing)  # the fetch after it
    stub.add_response(
        "get_object",
        {"Body": StreamingBody(io.BytesIO(b"{}"), 2), "ETag": '"e1"', "ContentLength": 2},
    )

    assert dispatch.scale_up(world.rt, job_id, "net-a", attempt).step == Step.DONE

    assert world.driver("net-a").calls == [1]
    assert job_id in s3_bundles.BundleFetcher.from_settings(world.rt.settings).cached_jobs()
    stub.assert_no_pending_responses()
