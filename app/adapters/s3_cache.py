"""One job's bundle cache folder on disk: the committed copy and its manifest (key -> ETag,
size), the staging folder and its progress log, the swap of one for the other by rename
(finished or undone after a crash), and the lock that lets one fetch of a job run at a time
across processes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.adapters.s3_definition import S3Definition

# Layout of one job's cache folder.
BUNDLE = "bundle"  # the committed copy: manifest.json and the job folder
STAGING = "staging"  # the download in progress: progress.jsonl and the job folder
RETIRED = "retired"  # the previous committed copy, for the moment of the swap
MANIFEST = "manifest.json"
PROGRESS = "progress.jsonl"
LOCK = ".lock"


@dataclass(frozen=True)
class Entry:
    """One object of a bundle as the listing saw it."""

    etag: str
    size: int


def manifest(bundle_def: S3Definition, objects: dict[str, Entry]) -> dict[str, Any]:
    """The manifest of a complete copy: which bundle, and each object's ETag and size."""
    return {
        "bucket": bundle_def.bucket,
        "prefix": bundle_def.prefix,
        "objects": {k: {"etag": e.etag, "size": e.size} for k, e in sorted(objects.items())},
    }


def read_manifest(path: Path, bundle_def: S3Definition) -> dict[str, Entry]:
    """The committed copy's objects; empty if none, unreadable, or for another bundle."""
    try:
        data = json.loads(path.read_text())
        if data["bucket"] != bundle_def.bucket or data["prefix"] != bundle_def.prefix:
            return {}
        return {k: Entry(str(v["etag"]), int(v["size"])) for k, v in data["objects"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def read_progress(path: Path, bundle_def: S3Definition) -> dict[str, Entry]:
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
def progress_log(path: Path, bundle_def: S3Definition, done: dict[str, Entry]) -> Iterator[IO[str]]:
    """The staging folder's progress log, rewritten to what is still valid, then appended."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"bucket": bundle_def.bucket, "prefix": bundle_def.prefix})
    lines = [header] + [
        json.dumps({"key": k, "etag": e.etag, "size": e.size}) for k, e in done.items()
    ]
    _write_text(path, "\n".join(lines) + "\n")
    with path.open("a") as log_file:
        yield log_file


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a JSON file whole or not at all."""
    _write_text(path, json.dumps(data, indent=1))


def _write_text(path: Path, text: str) -> None:
    # Written aside and renamed: a reader sees the old file or the new one, never half.
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)


def has_size(path: Path, size: int) -> bool:
    """True if `path` is a file of exactly `size` bytes."""
    try:
        return path.is_file() and path.stat().st_size == size
    except OSError:
        return False


def link_or_copy(source: Path, dest: Path) -> None:
    """Give `dest` the content of `source`, by hard link where the filesystem allows."""
    # A hard link costs no space or time; files are never modified in place, only replaced.
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def prune(folder: Path, keep: set[str]) -> None:
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


def commit(job_dir: Path) -> None:
    """Swap a complete staging folder in as the committed copy."""
    bundle, staging, retired = job_dir / BUNDLE, job_dir / STAGING, job_dir / RETIRED
    shutil.rmtree(retired, ignore_errors=True)
    # Two renames, because rename cannot replace a non-empty folder; `recover` finishes
    # the swap if the process dies between them.
    if bundle.exists():
        bundle.rename(retired)
    staging.rename(bundle)
    shutil.rmtree(retired, ignore_errors=True)


def recover(job_dir: Path) -> None:
    """Finish or undo a swap a crash interrupted, so the committed copy is whole."""
    if (job_dir / STAGING / MANIFEST).is_file():
        commit(job_dir)  # the staging was complete: the swap itself was cut short
    elif not (job_dir / BUNDLE).exists() and (job_dir / RETIRED).is_dir():
        (job_dir / RETIRED).rename(job_dir / BUNDLE)
    shutil.rmtree(job_dir / RETIRED, ignore_errors=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
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
