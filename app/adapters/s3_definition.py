"""An `s3://bucket/prefix` job definition, validated without any network call: a bad URI is
rejected at enqueue and never scales a net up."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.errors import InvalidRequest, quoted

# An S3 key is at most 1024 bytes; the prefix needs room for "/" and at least one file.
MAX_PREFIX_BYTES = 1022
MAX_NAME_BYTES = 255  # one path part must fit a file name on Linux filesystems

# NVFLARE 2.9 accepts only these characters in a job folder's name.
_JOB_NAME = re.compile(r"[A-Za-z0-9._-]+")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
# Reserved by AWS for access points, Object Lambda, multi-region access points, table buckets.
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--table-s3")


@dataclass(frozen=True)
class S3Definition:
    """A validated `s3://bucket/prefix`; the prefix's last part is the job folder's name."""

    bucket: str
    prefix: str  # no leading or trailing "/"
    job_name: str

    @property
    def uri(self) -> str:
        """The normalised URI, as stored on the job."""
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def list_prefix(self) -> str:
        """The key prefix of the bundle's objects (the "folder" with its slash)."""
        return f"{self.prefix}/"


def shown(text: str) -> str:
    """The caller's text as an error message quotes it: short and escaped (`quoted`)."""
    # Messages quote the caller's input; a huge one must not flood logs and job rows, nor
    # markup reach a page that shows the refusal.
    return quoted(text)


def _check_bucket(uri: str, bucket: str) -> None:
    problem = None
    if not _BUCKET.fullmatch(bucket):
        problem = "3-63 characters: lowercase letters, digits, '.', '-', starting and ending "
        problem += "with a letter or digit"
    elif ".." in bucket:
        problem = "no two adjacent periods"
    elif _IPV4.fullmatch(bucket):
        problem = "not formatted as an IP address"
    elif bucket.startswith(_RESERVED_BUCKET_PREFIXES) or bucket.endswith(_RESERVED_BUCKET_SUFFIXES):
        problem = "not a prefix or suffix AWS reserves (xn--, sthree-, -s3alias, --ol-s3, ...)"
    if problem:
        raise InvalidRequest(f"definition {shown(uri)}: invalid bucket name: {problem}")


def parse_s3_definition(uri: str) -> S3Definition:
    """Validate an `s3://bucket/prefix` job definition without any network call."""
    if not uri.startswith("s3://"):
        raise InvalidRequest(f"definition {shown(uri)} is not an s3://bucket/prefix URI")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    _check_bucket(uri, bucket)
    # One trailing slash names the same folder ("s3://b/jobs/fedavg/"); more is an empty part.
    prefix = prefix.removesuffix("/")
    if not prefix:
        raise InvalidRequest(
            f"definition {shown(uri)} names no job folder: use s3://bucket/path/to/job-folder"
        )
    parts = prefix.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidRequest(
            f"definition {shown(uri)}: the prefix may not have empty, '.' or '..' parts"
        )
    if CONTROL_CHARS.search(prefix) or "\\" in prefix:
        raise InvalidRequest(
            f"definition {shown(uri)}: the prefix may not hold control characters or '\\'"
        )
    if len(prefix.encode()) > MAX_PREFIX_BYTES:
        raise InvalidRequest(
            f"definition {shown(uri)}: the prefix is longer than {MAX_PREFIX_BYTES} bytes"
        )
    job_name = parts[-1]
    if not _JOB_NAME.fullmatch(job_name) or len(job_name) > MAX_NAME_BYTES:
        # NVFLARE's submit refuses other characters in the job folder's name.
        raise InvalidRequest(
            f"definition {shown(uri)}: the job folder name {shown(job_name)} may hold only "
            f"letters, digits, '.', '_', '-' (at most {MAX_NAME_BYTES})"
        )
    return S3Definition(bucket=bucket, prefix=prefix, job_name=job_name)
