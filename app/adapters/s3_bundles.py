"""S3 job bundles: an `s3://bucket/prefix` definition, checked at enqueue and fetched at
dispatch into a per-job cache under the data folder.

- `parse_s3_definition` validates all that can be known without a network call, so a bad
  URI is rejected at enqueue and never scales a net up.
- `BundleFetcher.fetch` lists the prefix, checks every key and the caps BEFORE downloading
  anything, then fills a staging folder and swaps it in by rename: a half-download is never
  what `fetch` returns. A manifest (key -> ETag, size) next to the committed copy, and a
  progress log in the staging folder, mean a retry or a requeue fetches only objects that
  are new or whose ETag changed.
- Failures are classified once (`_classify`): throttling, 5xx, connection problems and
  expired credentials are `BundleTransientError` (the task retries); a missing bucket or
  prefix, access denied or an unusable bundle is `BundleUnavailable` (the job fails at once).

Credentials come only from boto3's default chain; error messages carry the S3 error code,
the operation and the bucket/prefix, never a credential or a response body.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any, NoReturn

from app.errors import (
    BundleMissing,
    BundleTooLarge,
    BundleTransientError,
    BundleUnavailable,
    InvalidRequest,
)

if TYPE_CHECKING:
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
    from mypy_boto3_s3.client import S3Client

    from app.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_EXCLUDED_PREFIXES = ("server_checkpoints/",)
DEFAULT_MAX_BUNDLE_BYTES = 2 * 1024**3
DEFAULT_MAX_BUNDLE_FILES = 10_000

# botocore retries each call up to this many times after the first attempt ("standard"
# mode: throttling, 5xx, connection errors, with backoff and jitter); the Celery task's
# retry adds the long tail.
S3_MAX_ATTEMPTS = 4
S3_CONNECT_TIMEOUT_S = 5.0
S3_READ_TIMEOUT_S = 30.0
DOWNLOAD_CHUNK_BYTES = 1024 * 1024

# An S3 key is at most 1024 bytes; the prefix needs room for "/" and at least one file.
MAX_PREFIX_BYTES = 1022
MAX_NAME_BYTES = 255  # one path part must fit a file name on Linux filesystems

# NVFLARE 2.9 accepts only these characters in a job folder's name.
_JOB_NAME = re.compile(r"[A-Za-z0-9._-]+")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"\d{1,3}(\.\d{1,3}){3}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Reserved by AWS for access points, Object Lambda, multi-region access points, table buckets.
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--table-s3")

# Layout of one job's cache folder.
_BUNDLE = "bundle"  # the committed copy: manifest.json and the job folder
_STAGING = "staging"  # the download in progress: progress.jsonl and the job folder
_RETIRED = "retired"  # the previous committed copy, for the moment of the swap
_MANIFEST = "manifest.json"
_PROGRESS = "progress.jsonl"
_LOCK = ".lock"

# S3 error codes worth a retry should they survive botocore's own retries. Expired
# credentials are here because boto3's chain refreshes them: the next attempt signs anew.
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "TokenRefreshRequired",
    }
)
# Answers to a GET of a key the listing just returned: the bundle changed under us. The
# next attempt lists again and decides on the new content (a deleted bundle then fails).
_CHANGED_CODES = frozenset({"NoSuchKey", "PreconditionFailed"})
_HINTS = {
    "NoSuchBucket": "the bucket does not exist",
    "AccessDenied": "the worker's AWS identity may not read this bucket/prefix",
    "AllAccessDisabled": "all access to this bucket is disabled",
    "InvalidAccessKeyId": "the worker's AWS access key is not known to S3",
    "SignatureDoesNotMatch": "the worker's AWS secret key does not match its access key",
    "InvalidObjectState": "an object is archived (Glacier); restore it first",
}


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


def _shown(text: str) -> str:
    # Messages quote the caller's input; a huge one must not flood logs and job rows.
    return repr(text if len(text) <= 200 else text[:200] + "...")


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
        raise InvalidRequest(f"definition {_shown(uri)}: invalid bucket name: {problem}")


def parse_s3_definition(uri: str) -> S3Definition:
    """Validate an `s3://bucket/prefix` job definition without any network call."""
    if not uri.startswith("s3://"):
        raise InvalidRequest(f"definition {_shown(uri)} is not an s3://bucket/prefix URI")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    _check_bucket(uri, bucket)
    # One trailing slash names the same folder ("s3://b/jobs/fedavg/"); more is an empty part.
    prefix = prefix.removesuffix("/")
    if not prefix:
        raise InvalidRequest(
            f"definition {_shown(uri)} names no job folder: use s3://bucket/path/to/job-folder"
        )
    parts = prefix.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidRequest(
            f"definition {_shown(uri)}: the prefix may not have empty, '.' or '..' parts"
        )
    if _CONTROL.search(prefix) or "\\" in prefix:
        raise InvalidRequest(
            f"definition {_shown(uri)}: the prefix may not hold control characters or '\\'"
        )
    if len(prefix.encode()) > MAX_PREFIX_BYTES:
        raise InvalidRequest(
            f"definition {_shown(uri)}: the prefix is longer than {MAX_PREFIX_BYTES} bytes"
        )
    job_name = parts[-1]
    if not _JOB_NAME.fullmatch(job_name) or len(job_name) > MAX_NAME_BYTES:
        # NVFLARE's submit refuses other characters in the job folder's name.
        raise InvalidRequest(
            f"definition {_shown(uri)}: the job folder name {_shown(job_name)} may hold only "
            f"letters, digits, '.', '_', '-' (at most {MAX_NAME_BYTES})"
        )
    return S3Definition(bucket=bucket, prefix=prefix, job_name=job_name)


def default_botocore_config() -> Config:
    """Timeouts and botocore's "standard" retry mode for every S3 call."""
    from botocore.config import Config

    return Config(
        retries={"mode": "standard", "max_attempts": S3_MAX_ATTEMPTS},
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=S3_READ_TIMEOUT_S,
    )


def make_s3_client(
    endpoint_url: str | None = None, botocore_config: Config | None = None
) -> S3Client:
    """An S3 client with credentials and region from boto3's default chain only."""
    import boto3

    # A session of our own: boto3's default session is shared module state and creating
    # clients from it is not thread-safe; the client itself is.
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, config=botocore_config or default_botocore_config()
    )


@dataclass(frozen=True)
class Entry:
    """One object of a bundle as the listing saw it."""

    etag: str
    size: int


@dataclass(frozen=True)
class FetchStats:
    """What the last `fetch` did: objects downloaded, reused from the cache, bytes moved."""

    downloaded: int = 0
    reused: int = 0
    bytes_downloaded: int = 0


class BundleFetcher:
    """Fetches S3 job bundles into `<cache_root>/<job id>/`, reusing unchanged objects."""

    def __init__(
        self,
        cache_root: Path,
        *,
        endpoint_url: str | None = None,
        excluded_prefixes: Iterable[str] = DEFAULT_EXCLUDED_PREFIXES,
        max_bytes: int = DEFAULT_MAX_BUNDLE_BYTES,
        max_files: int = DEFAULT_MAX_BUNDLE_FILES,
        client: S3Client | None = None,
    ) -> None:
        self.cache_root = cache_root
        self.endpoint_url = endpoint_url
        self.excluded_prefixes = tuple(excluded_prefixes)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self._client = client
        self.last_stats = FetchStats()

    @classmethod
    def from_settings(cls, settings: Settings, *, client: S3Client | None = None) -> BundleFetcher:
        """A fetcher configured by the S3_* settings, caching under the data folder."""
        return cls(
            settings.data_dir.resolve() / "job-cache",
            endpoint_url=settings.s3_endpoint_url,
            excluded_prefixes=settings.s3_excluded_prefixes,
            max_bytes=settings.s3_max_bundle_bytes,
            max_files=settings.s3_max_bundle_files,
            client=client,
        )

    @property
    def client(self) -> S3Client:
        """The S3 client, built on first use (`remove` never needs one)."""
        if self._client is None:
            self._client = make_s3_client(self.endpoint_url)
        return self._client

    def job_dir(self, job_id: uuid.UUID) -> Path:
        """The cache folder of one job."""
        return self.cache_root / str(job_id)

    def fetch(self, definition: S3Definition | str, job_id: uuid.UUID) -> Path:
        """The job folder of the bundle, complete and matching the current listing."""
        bundle_def = parse_s3_definition(definition) if isinstance(definition, str) else definition
        job_dir = self.job_dir(job_id)
        # One fetch per job at a time: a redelivered message waits, then finds it done.
        with _locked(job_dir / _LOCK):
            _recover(job_dir)
            wanted = self._list(bundle_def)
            bundle = job_dir / _BUNDLE
            folder = bundle / bundle_def.job_name
            committed = _read_manifest(bundle / _MANIFEST, bundle_def)
            if committed == wanted and all(
                _has_size(folder / k, e.size) for k, e in wanted.items()
            ):
                self.last_stats = FetchStats(reused=len(wanted))
                log.info(
                    "s3 bundle unchanged",
                    extra={"job": str(job_id), "bundle": bundle_def.uri, "objects": len(wanted)},
                )
                return folder
            self.last_stats = self._stage(bundle_def, wanted, job_dir, committed)
            _commit(job_dir)
        log.info(
            "s3 bundle fetched",
            extra={
                "job": str(job_id),
                "bundle": bundle_def.uri,
                "downloaded": self.last_stats.downloaded,
                "reused": self.last_stats.reused,
                "bytes": self.last_stats.bytes_downloaded,
            },
        )
        return folder

    def check(self, definition: S3Definition | str) -> int:
        """List the bundle and check it (exists, keys, caps) without downloading: what makes
        a missing prefix fail a job before its net is scaled up. Returns its object count."""
        bundle_def = parse_s3_definition(definition) if isinstance(definition, str) else definition
        return len(self._list(bundle_def))

    def remove(self, job_id: uuid.UUID) -> bool:
        """Delete the job's cached bundle; False if it had none."""
        job_dir = self.job_dir(job_id)
        if not job_dir.is_dir():
            return False
        with _locked(job_dir / _LOCK):
            shutil.rmtree(job_dir, ignore_errors=True)
        return True

    def cached_jobs(self) -> set[uuid.UUID]:
        """The ids of the jobs that have a cache folder."""
        if not self.cache_root.is_dir():
            return set()
        found = set()
        for child in self.cache_root.iterdir():
            with contextlib.suppress(ValueError):
                found.add(uuid.UUID(child.name))
        return found

    def _list(self, bundle_def: S3Definition) -> dict[str, Entry]:
        """Every object to download, keyed by its path in the job folder; caps checked."""
        from botocore.exceptions import BotoCoreError, ClientError

        wanted: dict[str, Entry] = {}
        total_bytes = 0
        start = len(bundle_def.list_prefix)
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bundle_def.bucket, Prefix=bundle_def.list_prefix):
                for item in page.get("Contents", []):
                    relative = item["Key"][start:]
                    size = int(item.get("Size", 0))
                    if relative == "" or (relative.endswith("/") and size == 0):
                        # A "folder" placeholder (the S3 console makes these), for a
                        # sub-folder or for the job folder itself (the key is the prefix).
                        continue
                    if relative.startswith(self.excluded_prefixes):
                        continue
                    _check_key(bundle_def, relative)
                    wanted[relative] = Entry(etag=item["ETag"], size=size)
                    total_bytes += size
                    # Checked while listing: a prefix with a million objects fails early.
                    if len(wanted) > self.max_files:
                        raise BundleTooLarge(
                            f"{bundle_def.uri}: more than {self.max_files} files "
                            "(S3_MAX_BUNDLE_FILES)"
                        )
                    if total_bytes > self.max_bytes:
                        raise BundleTooLarge(
                            f"{bundle_def.uri}: more than {self.max_bytes} bytes "
                            "(S3_MAX_BUNDLE_BYTES)"
                        )
        except (ClientError, BotoCoreError) as exc:
            _classify(exc, bundle_def, "ListObjectsV2")
        if not wanted:
            excluded = f" outside {list(self.excluded_prefixes)}" if self.excluded_prefixes else ""
            raise BundleMissing(
                f"{bundle_def.uri}: no objects under s3://{bundle_def.bucket}/"
                f"{bundle_def.list_prefix}{excluded} (missing or empty prefix)"
            )
        _check_tree(bundle_def, wanted)
        return wanted

    def _stage(
        self,
        bundle_def: S3Definition,
        wanted: dict[str, Entry],
        job_dir: Path,
        committed: dict[str, Entry],
    ) -> FetchStats:
        """Fill the staging folder: link what the cache or an earlier attempt already has,
        download the rest, and write the manifest last (it marks the staging complete)."""
        staging = job_dir / _STAGING
        target = staging / bundle_def.job_name
        cached = job_dir / _BUNDLE / bundle_def.job_name
        done = {
            key: entry
            for key, entry in _read_progress(staging / _PROGRESS, bundle_def).items()
            if wanted.get(key) == entry and _has_size(target / key, entry.size)
        }
        if not done:
            shutil.rmtree(staging, ignore_errors=True)  # nothing an earlier attempt left is usable
        _prune(target, keep=set(done))
        target.mkdir(parents=True, exist_ok=True)
        downloaded = reused = moved = 0
        with _progress_log(staging / _PROGRESS, bundle_def, done) as progress:
            for key, entry in sorted(wanted.items()):
                if key in done:
                    reused += 1
                    continue
                dest = target / key
                dest.parent.mkdir(parents=True, exist_ok=True)
                # Never write through an old name: it may be a hard link into the committed
                # copy, which must stay intact until the swap.
                dest.unlink(missing_ok=True)
                if committed.get(key) == entry and _has_size(cached / key, entry.size):
                    _link_or_copy(cached / key, dest)
                    reused += 1
                else:
                    moved += self._download(bundle_def, key, entry, dest)
                    downloaded += 1
                # Logged only once the file is complete, so a crash mid-file redoes it.
                progress.write(json.dumps({"key": key, "etag": entry.etag, "size": entry.size}))
                progress.write("\n")
                progress.flush()
        _write_json(staging / _MANIFEST, _manifest(bundle_def, wanted))
        (staging / _PROGRESS).unlink(missing_ok=True)
        return FetchStats(downloaded=downloaded, reused=reused, bytes_downloaded=moved)

    def _download(self, bundle_def: S3Definition, key: str, entry: Entry, dest: Path) -> int:
        """GET one object into `dest`, exactly the version the listing saw (If-Match)."""
        from botocore.exceptions import BotoCoreError, ClientError

        written = 0
        try:
            response = self.client.get_object(
                Bucket=bundle_def.bucket, Key=bundle_def.list_prefix + key, IfMatch=entry.etag
            )
            with contextlib.closing(response["Body"]) as body, dest.open("wb") as out:
                for chunk in body.iter_chunks(DOWNLOAD_CHUNK_BYTES):
                    written += len(chunk)
                    if written > entry.size:
                        break
                    out.write(chunk)
        except (ClientError, BotoCoreError) as exc:
            _classify(exc, bundle_def, f"GetObject {_shown(key)}")
        if written != entry.size:
            raise BundleTransientError(
                f"{bundle_def.uri}: GetObject {_shown(key)}: {written} bytes read, the listing "
                f"said {entry.size}; will retry"
            )
        return written


def _check_key(bundle_def: S3Definition, relative: str) -> None:
    """Refuse a key that would land outside the job folder or cannot be a file name."""
    parts = relative.split("/")
    problem = None
    # An empty part is "//" or a leading "/" (an absolute path once joined).
    if any(part in ("", ".", "..") for part in parts):
        problem = "has an empty, '.' or '..' path part (it would land outside the job folder)"
    elif _CONTROL.search(relative) or "\\" in relative:
        problem = "holds control characters or '\\'"
    elif any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        problem = f"has a path part longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise BundleUnavailable(
            f"{bundle_def.uri}: unsafe key {_shown(bundle_def.list_prefix + relative)}: {problem}"
        )


def _check_tree(bundle_def: S3Definition, wanted: dict[str, Entry]) -> None:
    """Refuse a bundle in which one key is both a file and a folder ("a" and "a/b")."""
    for key in wanted:
        for parent in PurePosixPath(key).parents:
            if str(parent) in wanted:
                raise BundleUnavailable(
                    f"{bundle_def.uri}: key {_shown(str(parent))} is both a file and the "
                    f"folder of {_shown(key)}"
                )


def _classify(
    exc: ClientError | BotoCoreError, bundle_def: S3Definition, operation: str
) -> NoReturn:
    """Raise BundleTransientError or BundleUnavailable for a botocore failure."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        CredentialRetrievalError,
        HTTPClientError,
        IncompleteReadError,
        NoCredentialsError,
        ParamValidationError,
        PartialCredentialsError,
    )
    from botocore.exceptions import ConnectionError as BotocoreConnectionError

    where = f"{bundle_def.uri}: {operation}"
    if isinstance(exc, ClientError):
        # Only the code and the status: S3 error bodies can echo the access key id or the
        # string that was signed.
        code = str(exc.response.get("Error", {}).get("Code", "Unknown"))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if operation.startswith("GetObject") and code in _CHANGED_CODES:
            raise BundleTransientError(
                f"{where}: {code}: the bundle changed while downloading; will list again"
            ) from exc
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            raise BundleTransientError(f"{where}: {code} (HTTP {status}); will retry") from exc
        hint = f": {_HINTS[code]}" if code in _HINTS else ""
        missing = BundleMissing if code in ("NoSuchBucket", "NoSuchKey") else BundleUnavailable
        raise missing(f"{where}: {code} (HTTP {status}){hint}") from exc
    kind = type(exc).__name__
    if isinstance(
        exc,
        BotocoreConnectionError
        | HTTPClientError
        | ConnectionClosedError
        | IncompleteReadError
        | CredentialRetrievalError,
    ):
        # Endpoint unreachable, timeouts, a stream cut short, a credential provider (IMDS,
        # container endpoint) not answering: botocore already retried what it could.
        raise BundleTransientError(f"{where}: {kind}; will retry") from exc
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        raise BundleUnavailable(
            f"{where}: {kind}: boto3's default chain found no usable AWS credentials"
        ) from exc
    if isinstance(exc, ParamValidationError):
        raise BundleUnavailable(f"{where}: {kind}: the request is invalid") from exc
    # Nobody classified it: retried (the task's retries are capped), and logged by type so
    # it gets a class.
    log.warning("unclassified botocore error %s in %s", kind, where)
    raise BundleTransientError(f"{where}: {kind}; will retry") from exc


def _manifest(bundle_def: S3Definition, objects: dict[str, Entry]) -> dict[str, Any]:
    return {
        "bucket": bundle_def.bucket,
        "prefix": bundle_def.prefix,
        "objects": {k: {"etag": e.etag, "size": e.size} for k, e in sorted(objects.items())},
    }


def _read_manifest(path: Path, bundle_def: S3Definition) -> dict[str, Entry]:
    """The committed copy's objects; empty if none, unreadable, or for another bundle."""
    try:
        data = json.loads(path.read_text())
        if data["bucket"] != bundle_def.bucket or data["prefix"] != bundle_def.prefix:
            return {}
        return {k: Entry(str(v["etag"]), int(v["size"])) for k, v in data["objects"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _read_progress(path: Path, bundle_def: S3Definition) -> dict[str, Entry]:
    """Objects an earlier, interrupted attempt completed in the staging folder."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    done: dict[str, Entry] = {}
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
            if number == 0:
                if record != {"bucket": bundle_def.bucket, "prefix": bundle_def.prefix}:
                    return {}
                continue
            done[str(record["key"])] = Entry(str(record["etag"]), int(record["size"]))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash: that file is simply fetched again
    return done


@contextlib.contextmanager
def _progress_log(
    path: Path, bundle_def: S3Definition, done: dict[str, Entry]
) -> Iterator[IO[str]]:
    """The staging folder's progress log, rewritten to what is still valid, then appended."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"bucket": bundle_def.bucket, "prefix": bundle_def.prefix})
    lines = [header] + [
        json.dumps({"key": k, "etag": e.etag, "size": e.size}) for k, e in done.items()
    ]
    _write_text(path, "\n".join(lines) + "\n")
    with path.open("a") as log_file:
        yield log_file


def _write_json(path: Path, data: dict[str, Any]) -> None:
    _write_text(path, json.dumps(data, indent=1))


def _write_text(path: Path, text: str) -> None:
    # Written aside and renamed: a reader sees the old file or the new one, never half.
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.is_file() and path.stat().st_size == size
    except OSError:
        return False


def _link_or_copy(source: Path, dest: Path) -> None:
    # A hard link costs no space or time; files are never modified in place, only replaced.
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def _prune(folder: Path, keep: set[str]) -> None:
    """Delete every file under `folder` not in `keep`, then the folders left empty."""
    if not folder.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(folder, topdown=False):
        here = Path(dirpath)
        for name in filenames:
            if (here / name).relative_to(folder).as_posix() not in keep:
                (here / name).unlink()
        for name in dirnames:
            with contextlib.suppress(OSError):  # not empty: it holds kept files
                (here / name).rmdir()


def _commit(job_dir: Path) -> None:
    """Swap a complete staging folder in as the committed copy."""
    bundle, staging, retired = job_dir / _BUNDLE, job_dir / _STAGING, job_dir / _RETIRED
    shutil.rmtree(retired, ignore_errors=True)
    # Two renames, because rename cannot replace a non-empty folder; `_recover` finishes
    # the swap if the process dies between them.
    if bundle.exists():
        bundle.rename(retired)
    staging.rename(bundle)
    shutil.rmtree(retired, ignore_errors=True)


def _recover(job_dir: Path) -> None:
    """Finish or undo a swap a crash interrupted, so the committed copy is whole."""
    if (job_dir / _STAGING / _MANIFEST).is_file():
        _commit(job_dir)  # the staging was complete: the swap itself was cut short
    elif not (job_dir / _BUNDLE).exists() and (job_dir / _RETIRED).is_dir():
        (job_dir / _RETIRED).rename(job_dir / _BUNDLE)
    shutil.rmtree(job_dir / _RETIRED, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` across processes (flock), held for the block."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            continue  # `remove` deleted the folder between mkdir and open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # `remove` may have deleted the lock file while we waited: a lock on a deleted
            # file excludes nobody, so take the new one instead.
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield
                return
        finally:
            os.close(fd)  # also releases the lock
