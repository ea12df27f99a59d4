"""S3 job bundles: an `s3://bucket/prefix` definition (`s3_definition`), checked at enqueue
and fetched at dispatch into a per-job cache under the data folder (`s3_cache`).

`BundleFetcher.fetch` lists the prefix, checks every key and the caps BEFORE downloading
anything, then fills a staging folder and swaps it in by rename: a half-download is never
what `fetch` returns. A manifest (key -> ETag, size) next to the committed copy, and a
progress log in the staging folder, mean a retry or a requeue fetches only objects that are
new or whose ETag changed. Failures are classified once, in `s3_client`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from app.adapters import s3_client
from app.adapters.s3_cache import (
    BUNDLE,
    LOCK,
    MANIFEST,
    PROGRESS,
    STAGING,
    Entry,
    commit,
    has_size,
    link_or_copy,
    locked,
    manifest,
    progress_log,
    prune,
    read_manifest,
    read_progress,
    recover,
    write_json,
)
from app.adapters.s3_client import raise_classified
from app.adapters.s3_definition import (
    CONTROL_CHARS,
    MAX_NAME_BYTES,
    S3Definition,
    parse_s3_definition,
    shown,
)
from app.errors import BundleMissing, BundleTooLarge, BundleTransientError, BundleUnavailable

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

    from app.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_EXCLUDED_PREFIXES = ("server_checkpoints/",)
DEFAULT_MAX_BUNDLE_BYTES = 2 * 1024**3
DEFAULT_MAX_BUNDLE_FILES = 10_000
DOWNLOAD_CHUNK_BYTES = 1024 * 1024


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
            self._client = s3_client.make_s3_client(self.endpoint_url)
        return self._client

    def job_dir(self, job_id: uuid.UUID) -> Path:
        """The cache folder of one job."""
        return self.cache_root / str(job_id)

    def fetch(self, definition: S3Definition | str, job_id: uuid.UUID) -> Path:
        """The job folder of the bundle, complete and matching the current listing."""
        bundle_def = parse_s3_definition(definition) if isinstance(definition, str) else definition
        job_dir = self.job_dir(job_id)
        # One fetch per job at a time: a redelivered message waits, then finds it done.
        with locked(job_dir / LOCK):
            recover(job_dir)
            wanted = self._list(bundle_def)
            bundle = job_dir / BUNDLE
            folder = bundle / bundle_def.job_name
            committed = read_manifest(bundle / MANIFEST, bundle_def)
            if committed == wanted and all(has_size(folder / k, e.size) for k, e in wanted.items()):
                self.last_stats = FetchStats(reused=len(wanted))
                log.info(
                    "s3 bundle unchanged",
                    extra={"job": str(job_id), "bundle": bundle_def.uri, "objects": len(wanted)},
                )
                return folder
            self.last_stats = self._stage(bundle_def, wanted, job_dir, committed)
            commit(job_dir)
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
        with locked(job_dir / LOCK):
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
            raise_classified(exc, bundle_def, "ListObjectsV2")
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
        staging = job_dir / STAGING
        target = staging / bundle_def.job_name
        cached = job_dir / BUNDLE / bundle_def.job_name
        done = {
            key: entry
            for key, entry in read_progress(staging / PROGRESS, bundle_def).items()
            if wanted.get(key) == entry and has_size(target / key, entry.size)
        }
        if not done:
            shutil.rmtree(staging, ignore_errors=True)  # nothing an earlier attempt left is usable
        prune(target, keep=set(done))
        target.mkdir(parents=True, exist_ok=True)
        downloaded = reused = moved = 0
        with progress_log(staging / PROGRESS, bundle_def, done) as progress:
            for key, entry in sorted(wanted.items()):
                if key in done:
                    reused += 1
                    continue
                dest = target / key
                dest.parent.mkdir(parents=True, exist_ok=True)
                # Never write through an old name: it may be a hard link into the committed
                # copy, which must stay intact until the swap.
                dest.unlink(missing_ok=True)
                if committed.get(key) == entry and has_size(cached / key, entry.size):
                    link_or_copy(cached / key, dest)
                    reused += 1
                else:
                    moved += self._download(bundle_def, key, entry, dest)
                    downloaded += 1
                # Logged only once the file is complete, so a crash mid-file redoes it.
                progress.write(json.dumps({"key": key, "etag": entry.etag, "size": entry.size}))
                progress.write("\n")
                progress.flush()
        write_json(staging / MANIFEST, manifest(bundle_def, wanted))
        (staging / PROGRESS).unlink(missing_ok=True)
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
            raise_classified(exc, bundle_def, f"GetObject {shown(key)}")
        if written != entry.size:
            raise BundleTransientError(
                f"{bundle_def.uri}: GetObject {shown(key)}: {written} bytes read, the listing "
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
    elif CONTROL_CHARS.search(relative) or "\\" in relative:
        problem = "holds control characters or '\\'"
    elif any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        problem = f"has a path part longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise BundleUnavailable(
            f"{bundle_def.uri}: unsafe key {shown(bundle_def.list_prefix + relative)}: {problem}"
        )


def _check_tree(bundle_def: S3Definition, wanted: dict[str, Entry]) -> None:
    """Refuse a bundle in which one key is both a file and a folder ("a" and "a/b")."""
    for key in wanted:
        for parent in PurePosixPath(key).parents:
            if str(parent) in wanted:
                raise BundleUnavailable(
                    f"{bundle_def.uri}: key {shown(str(parent))} is both a file and the "
                    f"folder of {shown(key)}"
                )
