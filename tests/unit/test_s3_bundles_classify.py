"""BundleFetcher at the botocore boundary, for what moto's server cannot produce.

STUBBED, NOT A SERVER: throttling, 5xx, expired credentials, archived objects and a bundle
that changes under the download are fed to a real botocore S3 client through
`botocore.stub.Stubber` (which validates each response against the S3 service model).
Connection failures are raised from the client's own `before-send` hook, so they travel
through botocore's retry handler exactly as a refused socket does. The real-server tests
are tests/integration/test_s3_bundles.py.
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from botocore.response import StreamingBody
from botocore.stub import Stubber

from app.adapters import s3_bundles, s3_client
from app.adapters.s3_bundles import BundleFetcher
from app.adapters.s3_client import make_s3_client
from app.errors import BundleTransientError, BundleUnavailable, TransientError

URI = "s3://flip-jobs/jobs/fedavg"
LIST = {"Bucket": "flip-jobs", "Prefix": "jobs/fedavg/"}
SECRET_LOOKING = "AKIAABCDEFGHIJKLMNOP signature=deadbeef x-amz-security-token=tok"
# One botocore session for the module: it caches the S3 service model between clients.
_SESSION = botocore.session.get_session()


def _client() -> Any:
    # Explicit dummy keys: Stubber answers before signing, this client never sends.
    return _SESSION.create_client(
        "s3",
        region_name="eu-west-2",
        aws_access_key_id="stub",
        aws_secret_access_key="stub",
        config=Config(retries={"mode": "standard", "max_attempts": 0}),
    )


def _fetcher(tmp_path: Path) -> tuple[BundleFetcher, Stubber]:
    client = _client()
    return BundleFetcher(tmp_path / "cache", client=client), Stubber(client)


def _listing(objects: dict[str, tuple[str, bytes]]) -> dict[str, Any]:
    return {
        "IsTruncated": False,
        "KeyCount": len(objects),
        "Contents": [
            {"Key": "jobs/fedavg/" + key, "ETag": etag, "Size": len(body)}
            for key, (etag, body) in objects.items()
        ],
    }


def _body(data: bytes) -> dict[str, Any]:
    return {"Body": StreamingBody(io.BytesIO(data), len(data)), "ContentLength": len(data)}


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("SlowDown", 503),
        ("ServiceUnavailable", 503),
        ("InternalError", 500),
        ("SomethingNew", 502),  # any 5xx
        ("TooManyRequests", 429),
        ("Throttling", 400),
        ("RequestTimeout", 400),
        ("ExpiredToken", 400),  # boto3's chain refreshes; the retry signs anew
        ("RequestExpired", 400),
    ],
)
def test_throttling_5xx_and_expired_credentials_are_transient(tmp_path, code, status):
    fetcher, stub = _fetcher(tmp_path)
    stub.add_client_error("list_objects_v2", code, SECRET_LOOKING, status, expected_params=LIST)
    with stub, pytest.raises(BundleTransientError) as caught:
        fetcher.fetch(URI, uuid.uuid4())
    assert isinstance(caught.value, TransientError)
    assert f"{URI}: ListObjectsV2: {code} (HTTP {status})" in str(caught.value)
    assert "AKIA" not in str(caught.value) and "deadbeef" not in str(caught.value)


@pytest.mark.parametrize(
    ("code", "status", "hint"),
    [
        ("AccessDenied", 403, "may not read this bucket/prefix"),
        ("NoSuchBucket", 404, "the bucket does not exist"),
        ("AllAccessDisabled", 403, "disabled"),
        ("InvalidAccessKeyId", 403, "not known to S3"),
        ("SignatureDoesNotMatch", 403, "does not match"),
        ("SomethingNew", 400, ""),  # any other 4xx: a retry would get the same answer
    ],
)
def test_missing_or_denied_fails_the_job(tmp_path, code, status, hint):
    fetcher, stub = _fetcher(tmp_path)
    stub.add_client_error("list_objects_v2", code, SECRET_LOOKING, status)
    with stub, pytest.raises(BundleUnavailable) as caught:
        fetcher.fetch(URI, uuid.uuid4())
    assert not isinstance(caught.value, TransientError)
    message = str(caught.value)
    assert message.startswith(f"{URI}: ListObjectsV2: {code} (HTTP {status})")
    assert hint in message
    assert "AKIA" not in message and "deadbeef" not in message and "tok" not in message


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("NoSuchKey", 404, BundleTransientError),  # deleted after the listing: list again
        ("PreconditionFailed", 412, BundleTransientError),  # replaced after the listing
        ("InvalidObjectState", 403, BundleUnavailable),  # archived: restore it first
        ("AccessDenied", 403, BundleUnavailable),  # may list but not read
    ],
)
def test_get_errors(tmp_path, code, status, error):
    fetcher, stub = _fetcher(tmp_path)
    stub.add_response("list_objects_v2", _listing({"meta.json": ('"e1"', b"{}")}), LIST)
    stub.add_client_error(
        "get_object",
        code,
        "",
        status,
        expected_params={"Bucket": "flip-jobs", "Key": "jobs/fedavg/meta.json", "IfMatch": '"e1"'},
    )
    with stub, pytest.raises(error) as caught:
        fetcher.fetch(URI, uuid.uuid4())
    assert f"GetObject 'meta.json': {code}" in str(caught.value)


def test_a_stream_shorter_than_the_listing_is_transient(tmp_path):
    fetcher, stub = _fetcher(tmp_path)
    stub.add_response("list_objects_v2", _listing({"meta.json": ('"e1"', b"{...}")}), LIST)
    stub.add_response("get_object", _body(b"{"))
    job_id = uuid.uuid4()
    with stub, pytest.raises(BundleTransientError, match="1 bytes read, the listing said 5"):
        fetcher.fetch(URI, job_id)
    assert not (fetcher.job_dir(job_id) / "bundle").exists()


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url="https://flip-jobs.s3.eu-west-2.amazonaws.com/"),
        ReadTimeoutError(endpoint_url="https://flip-jobs.s3.eu-west-2.amazonaws.com/"),
    ],
)
def test_connection_errors_and_timeouts_are_transient(tmp_path, exc):
    client = _client()
    sent = []

    def fail(**_: Any) -> None:
        sent.append(1)
        raise exc

    client.meta.events.register("before-send.s3.ListObjectsV2", fail)
    fetcher = BundleFetcher(tmp_path, client=client)
    with pytest.raises(BundleTransientError, match=f"ListObjectsV2: {type(exc).__name__}"):
        fetcher.fetch(URI, uuid.uuid4())
    assert sent


def test_no_credentials_in_the_default_chain_fails_the_job(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-2")
    # Port 9 (discard) on loopback: nothing is ever sent, signing fails first.
    fetcher = BundleFetcher(tmp_path, client=make_s3_client("http://127.0.0.1:9"))
    with pytest.raises(BundleUnavailable, match="NoCredentialsError: boto3's default chain"):
        fetcher.fetch(URI, uuid.uuid4())


def test_default_client_uses_standard_retries_and_the_endpoint_setting():
    client = make_s3_client("http://127.0.0.1:9")
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client.meta.config.retries["mode"] == "standard"
    # botocore stores retries-after-the-first as total attempts.
    assert client.meta.config.retries["total_max_attempts"] == s3_client.S3_MAX_ATTEMPTS + 1


def test_a_swap_cut_short_by_a_crash_is_finished_without_downloading_again(tmp_path, monkeypatch):
    fetcher, stub = _fetcher(tmp_path)
    job_id = uuid.uuid4()
    v1 = {"meta.json": ('"e1"', b"{1}"), "app/a.py": ('"a1"', b"a")}
    v2 = {"meta.json": ('"e2"', b"{22}"), "app/a.py": ('"a1"', b"a")}
    with stub:
        stub.add_response("list_objects_v2", _listing(v1), LIST)
        stub.add_response("get_object", _body(b"a"))
        stub.add_response("get_object", _body(b"{1}"))
        folder = fetcher.fetch(URI, job_id)
        stub.assert_no_pending_responses()

    real_commit = s3_bundles.commit

    def crash_between_renames(job_dir: Path) -> None:
        (job_dir / "bundle").rename(job_dir / "retired")
        raise KeyboardInterrupt  # the worker dies here

    monkeypatch.setattr(s3_bundles, "commit", crash_between_renames)
    with stub:
        stub.add_response("list_objects_v2", _listing(v2), LIST)
        stub.add_response("get_object", _body(b"{22}"))  # only the changed object
        with pytest.raises(KeyboardInterrupt):
            fetcher.fetch(URI, job_id)
        stub.assert_no_pending_responses()
    assert not folder.exists()  # nothing to submit at this moment, and nothing half

    monkeypatch.setattr(s3_bundles, "commit", real_commit)
    with stub:
        stub.add_response("list_objects_v2", _listing(v2), LIST)  # and no GET at all
        assert fetcher.fetch(URI, job_id) == folder
        stub.assert_no_pending_responses()
    assert (folder / "meta.json").read_bytes() == b"{22}"
    assert (folder / "app" / "a.py").read_bytes() == b"a"
    assert sorted(p.name for p in fetcher.job_dir(job_id).iterdir()) == [".lock", "bundle"]


def test_an_interrupted_staging_from_an_older_listing_keeps_only_what_still_matches(tmp_path):
    fetcher, stub = _fetcher(tmp_path)
    job_id = uuid.uuid4()
    v1 = {"a.py": ('"a1"', b"a"), "b.py": ('"b1"', b"b"), "old.py": ('"o1"', b"o")}
    with stub:
        stub.add_response("list_objects_v2", _listing(v1), LIST)
        stub.add_response("get_object", _body(b"a"))
        stub.add_client_error("get_object", "SlowDown", "", 503)  # b.py fails; a.py is staged
        with pytest.raises(BundleTransientError):
            fetcher.fetch(URI, job_id)

    v2 = {"a.py": ('"a2"', b"A2"), "b.py": ('"b1"', b"b")}  # a.py changed, old.py deleted
    with stub:
        stub.add_response("list_objects_v2", _listing(v2), LIST)
        stub.add_response("get_object", _body(b"A2"))
        stub.add_response("get_object", _body(b"b"))
        folder = fetcher.fetch(URI, job_id)
        stub.assert_no_pending_responses()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {"a.py": b"A2", "b.py": b"b"}
