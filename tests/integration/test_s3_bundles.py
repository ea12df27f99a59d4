"""BundleFetcher against moto's S3 server over real HTTP on loopback (tests/fixtures/aws.py).

Requests are counted at the client's `before-send` hook, once per HTTP request that leaves
the process (botocore's own retries included). AccessDenied is produced by moto itself:
its IAM enforcement is switched on (`/moto-api/reset-auth`) for a user whose policy does
not cover the bucket. Throttling, 5xx and expired credentials cannot be produced by moto;
they are covered at the botocore boundary in tests/unit/test_s3_bundles_classify.py.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from app.adapters import jobdefs
from app.adapters.s3_bundles import BundleFetcher
from app.adapters.s3_client import make_s3_client
from app.errors import BundleTransientError, BundleUnavailable, TransientError
from app.settings import Settings
from tests.fixtures.aws import MOTO_REGION

pytestmark = pytest.mark.integration

BUCKET = "flip-jobs"
PREFIX = "projects/p1/fedavg"
URI = f"s3://{BUCKET}/{PREFIX}"
BUNDLE = {
    "meta.json": b'{"name": "fedavg", "deploy_map": {"app": ["@ALL"]}}',
    "app/config/config_fed_server.json": b'{"format_version": 2, "workflows": []}',
    "app/config/config_fed_client.json": b'{"format_version": 2, "executors": []}',
    "app/custom/train.py": b"print('training')\n" * 50,
}


class Requests(Counter[str]):
    """HTTP requests sent by one client, by operation name."""

    def __call__(self, event_name: str, **_: Any) -> None:
        self[event_name.rsplit(".", 1)[-1]] += 1


def _client(endpoint: str, max_attempts: int = 2) -> Any:
    # Fewer botocore retries (after the first attempt) than production keeps the "S3 down"
    # test to about a second; the fetcher code path is the same.
    return make_s3_client(
        endpoint,
        Config(
            retries={"mode": "standard", "max_attempts": max_attempts},
            connect_timeout=2,
            read_timeout=5,
        ),
    )


def _fetcher(cache: Path, endpoint: str, **options: Any) -> tuple[BundleFetcher, Requests]:
    client = _client(endpoint)
    requests = Requests()
    client.meta.events.register("before-send.s3.*", requests)
    return BundleFetcher(cache, client=client, **options), requests


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    """A plain client for arranging state, with the bundle uploaded and some decoys."""
    client = boto3.session.Session().client(
        "s3", region_name=MOTO_REGION, endpoint_url=moto_endpoint
    )
    client.create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": MOTO_REGION}
    )
    for key, body in BUNDLE.items():
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=body)
    # Not part of the job: excluded by default, the console's "folder" placeholders (of a
    # sub-folder and of the job folder itself), and a sibling prefix that shares the job
    # folder's name as a string prefix.
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/server_checkpoints/model.pt", Body=b"x" * 999)
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/app/", Body=b"")
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/", Body=b"")  # the job folder's own
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}-old/meta.json", Body=b"{}")
    return client


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "job-cache"


def test_fetch_downloads_exactly_the_job_folder(s3, moto_endpoint, cache):
    fetcher, requests = _fetcher(cache, moto_endpoint)
    job_id = uuid.uuid4()

    folder = fetcher.fetch(URI, job_id)

    assert folder.name == "fedavg"  # NVFLARE takes the job name from the folder
    assert folder.is_relative_to(cache / str(job_id))
    assert _files(folder) == BUNDLE  # no checkpoints, no placeholder, no sibling prefix
    assert requests["GetObject"] == len(BUNDLE)
    manifest = json.loads((folder.parent / "manifest.json").read_text())
    etags = {
        o["Key"].removeprefix(PREFIX + "/"): o["ETag"]
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX + "/")["Contents"]
    }
    assert manifest["objects"] == {
        key: {"etag": etags[key], "size": len(body)} for key, body in BUNDLE.items()
    }
    # Nothing half-done is left next to the committed copy.
    assert sorted(p.name for p in (cache / str(job_id)).iterdir()) == [".lock", "bundle"]


def test_second_fetch_only_lists_and_a_changed_object_is_fetched_again(s3, moto_endpoint, cache):
    fetcher, requests = _fetcher(cache, moto_endpoint)
    job_id = uuid.uuid4()
    folder = fetcher.fetch(URI, job_id)
    requests.clear()

    # A retry or a requeue of the same job: nothing has changed in S3.
    assert fetcher.fetch(URI, job_id) == folder
    assert requests == {"ListObjectsV2": 1}
    assert _files(folder) == BUNDLE

    # One object changed, one deleted, one added: only the changed and new ones are fetched.
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/app/custom/train.py", Body=b"print('v2')\n")
    s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/app/config/config_fed_client.json")
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/app/custom/net.py", Body=b"import torch\n")
    requests.clear()
    assert fetcher.fetch(URI, job_id) == folder
    assert requests == {"ListObjectsV2": 1, "GetObject": 2}
    expected = dict(BUNDLE)
    expected["app/custom/train.py"] = b"print('v2')\n"
    del expected["app/config/config_fed_client.json"]
    expected["app/custom/net.py"] = b"import torch\n"
    assert _files(folder) == expected
    assert fetcher.last_stats.reused == 2


def test_a_locally_damaged_copy_is_repaired(s3, moto_endpoint, cache):
    fetcher, requests = _fetcher(cache, moto_endpoint)
    job_id = uuid.uuid4()
    folder = fetcher.fetch(URI, job_id)
    (folder / "meta.json").write_bytes(b"")  # e.g. truncated by a power cut
    requests.clear()

    fetcher.fetch(URI, job_id)

    assert requests == {"ListObjectsV2": 1, "GetObject": 1}
    assert _files(folder) == BUNDLE


def test_materialize_and_discard_use_the_settings(s3, moto_endpoint, tmp_path):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        S3_ENDPOINT_URL=moto_endpoint,
        S3_EXCLUDED_PREFIXES="app/custom/, app/config/",
    )
    job_id = uuid.uuid4()

    folder = jobdefs.materialize(settings, URI + "/", job_id)

    assert folder.is_relative_to((tmp_path / "data" / "job-cache").resolve())
    assert _files(folder) == {
        "meta.json": BUNDLE["meta.json"],
        "server_checkpoints/model.pt": b"x" * 999,  # no longer excluded by these settings
    }
    assert jobdefs.discard(settings, job_id) is True
    assert not (tmp_path / "data" / "job-cache" / str(job_id)).exists()
    assert jobdefs.discard(settings, job_id) is False


def test_a_requeued_job_is_submitted_from_the_bundle_as_s3_now_has_it(s3, moto_endpoint, tmp_path):
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", S3_ENDPOINT_URL=moto_endpoint)
    job_id = uuid.uuid4()
    first = jobdefs.prepare(
        settings, jobdefs.materialize(settings, URI, job_id), job_id, ["site-1"], None
    )
    # Between two attempts, flip-api uploads a new training script under the same prefix.
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/app/custom/train.py", Body=b"print('v2')\n")
    second = jobdefs.prepare(
        settings, jobdefs.materialize(settings, URI, job_id), job_id, ["site-1"], None
    )
    assert (second / "app/custom/train.py").read_bytes() == b"print('v2')\n"
    assert (first / "app/custom/train.py").read_bytes() == BUNDLE["app/custom/train.py"]


@pytest.mark.parametrize(
    "bad_key",
    ["../evil.py", "app/../../evil.py", "/etc/evil.py", "app//evil.py", "./evil.py"],
)
def test_a_key_outside_the_job_folder_fails_the_job(s3, moto_endpoint, cache, bad_key):
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{bad_key}", Body=b"import os")
    fetcher, requests = _fetcher(cache, moto_endpoint)
    job_id = uuid.uuid4()

    with pytest.raises(BundleUnavailable, match="unsafe key") as caught:
        fetcher.fetch(URI, job_id)

    assert not isinstance(caught.value, TransientError)
    assert f"{PREFIX}/{bad_key}" in str(caught.value)
    assert requests["GetObject"] == 0  # checked on the listing, before any download
    assert not list(cache.rglob("evil.py"))
    assert not (cache / str(job_id) / "bundle").exists()


def test_a_key_that_is_both_file_and_folder_fails_the_job(s3, moto_endpoint, cache):
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/app/custom", Body=b"a file")
    fetcher, _ = _fetcher(cache, moto_endpoint)
    with pytest.raises(BundleUnavailable, match="both a file and the folder"):
        fetcher.fetch(URI, uuid.uuid4())


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (
            {"max_files": len(BUNDLE) - 1},
            f"more than {len(BUNDLE) - 1} files (S3_MAX_BUNDLE_FILES)",
        ),
        ({"max_bytes": 100}, "more than 100 bytes (S3_MAX_BUNDLE_BYTES)"),
    ],
)
def test_caps_fail_the_job_before_any_download(s3, moto_endpoint, cache, options, needle):
    fetcher, requests = _fetcher(cache, moto_endpoint, **options)
    with pytest.raises(BundleUnavailable) as caught:
        fetcher.fetch(URI, uuid.uuid4())
    assert needle in str(caught.value)
    assert URI in str(caught.value)
    assert requests == {"ListObjectsV2": 1}


def test_caps_count_only_what_is_downloaded(s3, moto_endpoint, cache):
    # The excluded checkpoint (999 bytes) and the placeholder do not count.
    size = sum(len(b) for b in BUNDLE.values())
    fetcher, _ = _fetcher(cache, moto_endpoint, max_files=len(BUNDLE), max_bytes=size)
    assert _files(fetcher.fetch(URI, uuid.uuid4())) == BUNDLE


def test_no_such_bucket_fails_the_job_naming_bucket_and_prefix(
    moto_endpoint, aws_credentials, cache
):
    fetcher, requests = _fetcher(cache, moto_endpoint)
    with pytest.raises(BundleUnavailable) as caught:
        fetcher.fetch("s3://no-such-bucket/jobs/fedavg", uuid.uuid4())
    message = str(caught.value)
    assert "s3://no-such-bucket/jobs/fedavg" in message
    assert "NoSuchBucket (HTTP 404)" in message
    assert requests == {"ListObjectsV2": 1}  # not retried: it will not appear by itself


@pytest.mark.parametrize(
    ("uri", "setup_key"),
    [
        (f"s3://{BUCKET}/projects/p1/missing", None),
        # Only excluded objects under the prefix is as good as nothing.
        (f"s3://{BUCKET}/projects/p1/ckpt-only", "projects/p1/ckpt-only/server_checkpoints/m.pt"),
    ],
)
def test_missing_or_empty_prefix_fails_the_job(s3, moto_endpoint, cache, uri, setup_key):
    if setup_key:
        s3.put_object(Bucket=BUCKET, Key=setup_key, Body=b"x")
    fetcher, _ = _fetcher(cache, moto_endpoint)
    with pytest.raises(BundleUnavailable, match="no objects under") as caught:
        fetcher.fetch(uri, uuid.uuid4())
    assert uri.removeprefix("s3://") in str(caught.value)


@pytest.fixture
def iam_enforced(moto_endpoint: str) -> Iterator[None]:
    """moto checks signatures and IAM policies on every request until the test ends."""

    def reset_auth(value: str) -> None:
        request = urllib.request.Request(
            f"{moto_endpoint}/moto-api/reset-auth",
            data=value.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},  # a form body would hide the value
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    reset_auth("0")
    try:
        yield
    finally:
        reset_auth("inf")


def test_access_denied_fails_the_job(s3, moto_endpoint, cache, monkeypatch, request):
    iam = boto3.session.Session().client("iam", region_name=MOTO_REGION, endpoint_url=moto_endpoint)
    iam.create_user(UserName="dispatcher")
    iam.put_user_policy(
        UserName="dispatcher",
        PolicyName="other-bucket-only",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": ["s3:ListBucket", "s3:GetObject"],
                        "Resource": ["arn:aws:s3:::other", "arn:aws:s3:::other/*"],
                    }
                ],
            }
        ),
    )
    key = iam.create_access_key(UserName="dispatcher")["AccessKey"]
    # The worker's identity, through the default chain (env) as in production.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    request.getfixturevalue("iam_enforced")
    fetcher, requests = _fetcher(cache, moto_endpoint)

    with pytest.raises(BundleUnavailable) as caught:
        fetcher.fetch(URI, uuid.uuid4())

    message = str(caught.value)
    assert URI in message
    assert "AccessDenied (HTTP 403)" in message
    assert key["AccessKeyId"] not in message
    assert key["SecretAccessKey"] not in message
    assert requests == {"ListObjectsV2": 1}


def test_unknown_access_key_fails_the_job_without_echoing_it(
    s3, moto_endpoint, cache, monkeypatch, request
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY123456")
    request.getfixturevalue("iam_enforced")
    fetcher, _ = _fetcher(cache, moto_endpoint)
    with pytest.raises(BundleUnavailable, match="InvalidAccessKeyId") as caught:
        fetcher.fetch(URI, uuid.uuid4())
    assert "AKIAUNKNOWNKEY123456" not in str(caught.value)


def test_an_object_replaced_during_the_download_is_fetched_as_the_listing_saw_it_or_retried(
    s3, moto_endpoint, cache
):
    fetcher, requests = _fetcher(cache, moto_endpoint)

    def replace_after_listing(**_: Any) -> None:
        if requests["ListObjectsV2"] == 1:
            s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/meta.json", Body=b'{"v": 2}')

    fetcher.client.meta.events.register("after-call.s3.ListObjectsV2", replace_after_listing)
    job_id = uuid.uuid4()

    # If-Match: the GET refuses the new version, so the bundle is never a mix of two.
    with pytest.raises(BundleTransientError, match="changed while downloading"):
        fetcher.fetch(URI, job_id)
    assert not (cache / str(job_id) / "bundle").exists()

    folder = fetcher.fetch(URI, job_id)  # the retry lists again
    assert _files(folder)["meta.json"] == b'{"v": 2}'


def test_s3_down_mid_download_is_transient_and_the_retry_completes_the_bundle(
    s3, moto_endpoint, cache
):
    from moto.server import ThreadedMotoServer

    # A server of our own over the same in-process moto state, so it can go down and come
    # back on the same port without touching the session's server.
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    fetcher, requests = _fetcher(cache, f"http://{host}:{port}")
    stopped = []

    def stop_before_the_second_object(**_: Any) -> None:
        if requests["GetObject"] == 1 and not stopped:
            server.stop()
            stopped.append(True)

    fetcher.client.meta.events.register("before-call.s3.GetObject", stop_before_the_second_object)
    job_id = uuid.uuid4()
    try:
        with pytest.raises(BundleTransientError, match="EndpointConnectionError") as caught:
            fetcher.fetch(URI, job_id)
        assert isinstance(caught.value, TransientError)  # the task retries; the job stays
        assert stopped
        # One object done, then botocore's first attempt and its 2 retries, all refused.
        assert requests["GetObject"] == 1 + 3
        assert not (cache / str(job_id) / "bundle").exists()  # nothing half-done to submit

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        requests.clear()
        folder = fetcher.fetch(URI, job_id)

        assert _files(folder) == BUNDLE
        # The object completed before the outage is not fetched again.
        assert requests == {"ListObjectsV2": 1, "GetObject": len(BUNDLE) - 1}
    finally:
        server.stop()


def test_remove_deletes_the_cached_copy(s3, moto_endpoint, cache):
    fetcher, _ = _fetcher(cache, moto_endpoint)
    job_id, other = uuid.uuid4(), uuid.uuid4()
    fetcher.fetch(URI, job_id)
    fetcher.fetch(URI, other)
    assert fetcher.cached_jobs() == {job_id, other}

    assert fetcher.remove(job_id) is True

    assert not (cache / str(job_id)).exists()
    assert fetcher.cached_jobs() == {other}
    assert fetcher.remove(job_id) is False
