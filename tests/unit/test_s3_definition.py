"""parse_s3_definition: what enqueue can check about an s3:// definition without a network."""

from __future__ import annotations

import re

import pytest

from app.adapters.s3_definition import S3Definition, parse_s3_definition
from app.errors import InvalidRequest


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://flip-jobs/fedavg", S3Definition("flip-jobs", "fedavg", "fedavg")),
        ("s3://flip-jobs/a/b/fedavg-ct", S3Definition("flip-jobs", "a/b/fedavg-ct", "fedavg-ct")),
        # One trailing slash names the same folder; the stored form drops it.
        ("s3://flip-jobs/a/Job_1.v2/", S3Definition("flip-jobs", "a/Job_1.v2", "Job_1.v2")),
        ("s3://my.bucket.eu/x/j", S3Definition("my.bucket.eu", "x/j", "j")),
        ("s3://abc/j", S3Definition("abc", "j", "j")),
        ("s3://" + "b" * 63 + "/j", S3Definition("b" * 63, "j", "j")),
        # Only the job folder's name is restricted; parent parts may hold what S3 allows.
        ("s3://flip-jobs/site A (2026)/j", S3Definition("flip-jobs", "site A (2026)/j", "j")),
    ],
)
def test_valid_definitions(uri: str, expected: S3Definition) -> None:
    parsed = parse_s3_definition(uri)
    assert parsed == expected
    assert parsed.list_prefix == expected.prefix + "/"
    assert parse_s3_definition(parsed.uri) == parsed  # the stored form parses to itself


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        ("flip-jobs/fedavg", "not an s3://bucket/prefix URI"),
        ("S3://flip-jobs/fedavg", "not an s3://bucket/prefix URI"),
        ("s3:/flip-jobs/fedavg", "not an s3://bucket/prefix URI"),
        # bucket naming rules
        ("s3://Flip-Jobs/fedavg", "invalid bucket name"),
        ("s3://flip_jobs/fedavg", "invalid bucket name"),
        ("s3://ab/fedavg", "invalid bucket name"),
        ("s3://" + "b" * 64 + "/fedavg", "invalid bucket name"),
        ("s3://-flip/fedavg", "invalid bucket name"),
        ("s3://flip-/fedavg", "invalid bucket name"),
        ("s3://flip..jobs/fedavg", "adjacent periods"),
        ("s3://192.168.1.10/fedavg", "IP address"),
        ("s3://xn--flip/fedavg", "reserves"),
        ("s3://flip-s3alias/fedavg", "reserves"),
        ("s3://flip--ol-s3/fedavg", "reserves"),
        ("s3:///fedavg", "invalid bucket name"),
        ("s3:// flip-jobs/fedavg", "invalid bucket name"),
        ("s3://user:pw@flip-jobs/fedavg", "invalid bucket name"),
        # a prefix is required: its last part is the job folder
        ("s3://flip-jobs", "names no job folder"),
        ("s3://flip-jobs/", "names no job folder"),
        # no empty, '.' or '..' parts
        ("s3://flip-jobs//fedavg", "empty, '.' or '..'"),
        ("s3://flip-jobs/a//fedavg", "empty, '.' or '..'"),
        ("s3://flip-jobs/fedavg//", "empty, '.' or '..'"),
        ("s3://flip-jobs/a/../fedavg", "empty, '.' or '..'"),
        ("s3://flip-jobs/a/./fedavg", "empty, '.' or '..'"),
        ("s3://flip-jobs/..", "empty, '.' or '..'"),
        ("s3://flip-jobs/a/..", "empty, '.' or '..'"),
        ("s3://flip-jobs/a\nb/fedavg", "control characters"),
        ("s3://flip-jobs/a\\b/fedavg", "control characters or"),
        ("s3://flip-jobs/a\x00/fedavg", "control characters"),
        # the job-name rule NVFLARE applies to the folder name
        ("s3://flip-jobs/a/fed avg", "job folder name"),
        ("s3://flip-jobs/a/fedavg?x=1", "job folder name"),
        ("s3://flip-jobs/a/fédavg", "job folder name"),
        ("s3://flip-jobs/a/" + "j" * 256, "job folder name"),
        ("s3://flip-jobs/" + "a/" * 520 + "j", "longer than 1022 bytes"),
    ],
)
def test_invalid_definitions_say_why(uri: str, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(needle)):
        parse_s3_definition(uri)


def test_a_huge_definition_is_quoted_shortened() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_s3_definition("s3://Bad/" + "x" * 5000)
    assert len(str(caught.value)) < 400
