"""Job bundles as the simulation's world holds them: a folder under JOB_ROOT and an S3 prefix
(a fake S3 client the real `BundleFetcher` talks to), each carrying a VERSION file, and
their contents replaced while jobs wait or run. Each keeps the TRUE history of its versions,
so the invariants can tell which content a submit carried against which it should have.

Replacements keep every file's size (v1 -> v2); in half the worlds the local folder is
written as a reproducible build writes it (every mtime the same fixed time): what a bundle
unpacked from a zip or a tar made with a fixed --mtime looks like.

The S3 prefix also holds what the S3 console creates: an empty "folder" object for the job
folder itself (its key is the prefix with a slash) and one for a sub-folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.adapters import s3_client
from app.sim.clock import EPOCH_S
from app.sim.host import Host

BUCKET = "sim-bundles"
S3_PREFIX = "jobs/fedavg"
S3_DEFINITION = f"s3://{BUCKET}/{S3_PREFIX}"
LOCAL_DEFINITION = "job"
VERSION_FILE = "VERSION"
FIXED_MTIME_NS = 315_532_800 * 10**9  # 1980-01-01, as zip archives store it
EPOCH_NS = int(EPOCH_S) * 10**9
META = '{"name": "job", "deploy_map": {"app": ["@ALL"]}, "min_clients": 2}'
CONFIG = '{"format_version": 2, "workflows": []}'


@dataclass
class Bundle:
    """One definition's content over time: (since, version) pairs, oldest first."""

    definition: str
    history: list[tuple[float, int]] = field(default_factory=lambda: [(-1.0, 0)])

    @property
    def version(self) -> int:
        return self.history[-1][1]

    def version_at(self, t: float) -> int:
        current = self.history[0][1]
        for since, version in self.history:
            if since <= t:
                current = version
        return current


def version_text(version: int) -> str:
    return f"v{version % 10}\n"  # one digit: every replacement keeps the file's size


def version_of(folder: Path) -> int | None:
    """The version a submitted folder carries (None: no VERSION file, or no folder)."""
    try:
        return int((folder / VERSION_FILE).read_text().strip()[1:])
    except (OSError, ValueError):
        return None


class LocalBundle:
    """The job folder under JOB_ROOT, rewritten in place by a reproducible build."""

    def __init__(self, job_root: Path, host: Host, *, reproducible: bool = True) -> None:
        self.folder = job_root / LOCAL_DEFINITION
        self.host = host
        # A reproducible build writes every mtime as the same fixed time; any other copy
        # writes the time it ran (the simulated time here, so a seed replays exactly).
        self.reproducible = reproducible
        self.bundle = Bundle(LOCAL_DEFINITION)
        (self.folder / "app" / "config").mkdir(parents=True, exist_ok=True)
        self._write(0)

    def _write(self, version: int) -> None:
        # (The folder may be gone: tests.sim.gone_bundle removes it; a build writes it anew.)
        (self.folder / "app" / "config").mkdir(parents=True, exist_ok=True)
        files = {
            self.folder / "meta.json": META,
            self.folder / "app" / "config" / "config_fed_server.json": CONFIG,
            self.folder / VERSION_FILE: version_text(version),
        }
        for path, text in files.items():
            partial = path.with_name(path.name + ".new")
            partial.write_text(text)
            os.replace(partial, path)  # as an unpack replaces a file: a new inode
            stamp = FIXED_MTIME_NS if self.reproducible else int(EPOCH_NS + self.host.clock.t * 1e9)
            os.utime(path, ns=(stamp, stamp))

    def rewrite(self) -> None:
        """The folder written again as it is now (put back after an operator removed it)."""
        self._write(self.bundle.version)

    def replace(self) -> None:
        version = self.bundle.version + 1
        self._write(version)
        self.bundle.history.append((self.host.clock.t, version))


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def iter_chunks(self, size: int) -> Iterator[bytes]:
        for i in range(0, len(self._data), size):
            yield self._data[i : i + size]

    def close(self) -> None:
        """Nothing to release."""


class _Paginator:
    def __init__(self, s3: FakeS3) -> None:
        self.s3 = s3

    def paginate(self, Bucket: str, Prefix: str) -> Iterator[dict[str, Any]]:  # noqa: N803 (boto3's names)
        self.s3.host.hook("s3.list", None)
        objects = self.s3.objects if Bucket == BUCKET else {}
        contents = [
            {"Key": key, "Size": len(data), "ETag": _etag(data)}
            for key, data in sorted(objects.items())
            if key.startswith(Prefix)
        ]
        yield {"Contents": contents} if contents else {}


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


class FakeS3:
    """The two calls BundleFetcher makes (a listing, a conditional GET), on one bucket."""

    def __init__(self, host: Host, placeholders: bool) -> None:
        self.host = host
        self.bundle = Bundle(S3_DEFINITION)
        self.objects: dict[str, bytes] = {}
        if placeholders:
            # The S3 console's "Create folder": empty objects named like the folders.
            self.objects[f"{S3_PREFIX}/"] = b""
            self.objects[f"{S3_PREFIX}/app/"] = b""
        self._write(0)

    def _write(self, version: int) -> None:
        self.objects[f"{S3_PREFIX}/meta.json"] = META.encode()
        self.objects[f"{S3_PREFIX}/app/config/config_fed_server.json"] = CONFIG.encode()
        self.objects[f"{S3_PREFIX}/{VERSION_FILE}"] = version_text(version).encode()

    def replace(self) -> None:
        version = self.bundle.version + 1
        self._write(version)
        self.bundle.history.append((self.host.clock.t, version))

    def get_paginator(self, name: str) -> _Paginator:
        assert name == "list_objects_v2"
        return _Paginator(self)

    def get_object(self, Bucket: str, Key: str, IfMatch: str) -> dict[str, Any]:  # noqa: N803
        self.host.hook("s3.get", None)
        data = self.objects.get(Key) if Bucket == BUCKET else None
        if data is None:
            raise _error("NoSuchKey", 404)
        if _etag(data) != IfMatch:
            raise _error("PreconditionFailed", 412)  # replaced since the listing
        return {"Body": _Body(data)}


def _error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "GetObject")


@contextlib.contextmanager
def serving(s3: FakeS3) -> Iterator[None]:
    """Every BundleFetcher built meanwhile talks to `s3` (the fetcher builds its client
    with `make_s3_client`; a simulation runs alone in its process)."""
    original = s3_client.make_s3_client
    s3_client.make_s3_client = lambda *_a, **_kw: s3  # type: ignore[assignment]
    try:
        yield
    finally:
        s3_client.make_s3_client = original


def remove_tree(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


# A Flower App's pyproject.toml gone wrong (tests/unit/test_flower_bad_bundles.py): valid TOML
# whose `tool`, `flwr` or `app` is no table, or bytes that are not UTF-8. Each crashed the
# dispatch step unclassified before b97bb2e; now the submit refuses it (definition_invalid).
_COMPONENTS = b'[tool.flwr.app.components]\nserverapp = "a.server:app"\n'
MALFORMED_FLOWER_APPS: dict[str, bytes] = {
    "tool is a string": b'tool = "x"\n',
    "flwr is a string": b'[tool]\nflwr = "x"\n',
    "app is a number": b"[tool.flwr]\napp = 3\n",
    "not UTF-8": b"\xff\xfe" + _COMPONENTS,
}


def write_malformed_flower_app(folder: Path, kind: str) -> None:
    """Write a Flower App whose pyproject.toml is malformed (`MALFORMED_FLOWER_APPS[kind]`)
    into `folder`, as a caller's broken upload leaves it: no meta.json, no VERSION."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_bytes(MALFORMED_FLOWER_APPS[kind])
    (folder / "server.py").write_text("app = None\n")
