"""Job definitions: where a job's folder comes from (a folder under JOB_ROOT, or an s3://
prefix downloaded into the data folder), and the prepared copy that is submitted (its
NVFLARE meta.json made to match the job; a Flower App as it is)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.adapters import bundle_copy
from app.adapters.s3_bundles import BundleFetcher
from app.errors import BundleMissing, InvalidRequest
from app.settings import Settings
from app.usecases.records import job_folder


def materialize(settings: Settings, definition: str, job_id: uuid.UUID) -> Path:
    """A local folder holding the job definition, ready for NVFLARE's submit."""
    if not definition.startswith("s3://"):
        folder = _folder_in_root(settings, definition)
        if not folder.is_dir():
            raise BundleMissing(f"job folder {definition!r} disappeared from the job root")
        return folder
    return BundleFetcher.from_settings(settings).fetch(definition, job_id)


def check_available(settings: Settings, definition: str) -> None:
    """Fail fast, before a net is scaled up for it: the definition's folder exists, or its
    S3 bundle is listed and checked (BundleUnavailable / BundleTransientError)."""
    if definition.startswith("s3://"):
        BundleFetcher.from_settings(settings).check(definition)
    elif not _folder_in_root(settings, definition).is_dir():
        raise BundleMissing(f"job folder {definition!r} disappeared from the job root")


def _folder_in_root(settings: Settings, definition: str) -> Path:
    # Checked at enqueue (resolve_definition), and again whenever the folder is used: one
    # replaced by a link out of the root while its job waited is not taken from there.
    folder = job_folder(settings, definition)
    if not folder.is_relative_to(settings.job_root.resolve()):
        raise InvalidRequest(f"job folder {definition!r} now escapes the job root")
    return folder


def _confined_root(settings: Settings, bundle: Path) -> Path:
    """Where every file of a bundle must lie: JOB_ROOT for a job folder (code shared by
    links inside the root is fine), the downloaded folder itself for an S3 bundle."""
    root = settings.job_root.resolve()
    real = bundle.resolve()
    return root if real.is_relative_to(root) else real


def discard(settings: Settings, job_id: uuid.UUID) -> bool:
    """Delete the job's cached S3 bundle, if it has one (the job has ended)."""
    return BundleFetcher.from_settings(settings).remove(job_id)


PREPARED_DIR = "prepared"


def prepare(
    settings: Settings,
    bundle: Path,
    job_id: uuid.UUID,
    required_sites: Sequence[str],
    metadata: Mapping[str, Any] | None,
) -> Path:
    """A copy of the bundle whose NVFLARE `meta.json` matches the job: the deploy map sends
    the client apps to exactly the job's required sites (and the server app to the server),
    `min_clients` is their number, and a `resource_spec` in the metadata is passed through.
    The original bundle is never changed. InvalidRequest when no deploy map can be made.

    A copy is keyed by what it is built from (`built_from`: every file's path and content,
    the sites and the resource spec), so a bundle replaced between two
    attempts (an S3 object changed, a job folder edited) gets a new copy and is submitted as
    it is now, never as an earlier attempt saw it.

    Two workers may prepare one job at once (reconcile re-sends the dispatch of a job stuck
    in DISPATCHING while the first may still run): each builds in a staging folder of its
    own, and a complete copy, once in place, is never replaced, and removed only once its
    job has ended (`sweep_prepared`), since another worker may be submitting it. Only a
    rename puts it there, so an existing copy is complete and built from the same inputs.

    Only regular files and folders inside the bundle's root are copied (`bundle_copy`: a
    link out of JOB_ROOT refuses the bundle). A Flower App (a `pyproject.toml` declaring
    `[tool.flwr.app]`) is copied as it is, no meta.json made: the Flower client packs the
    copy into a FAB, so what it packs is what was checked."""
    found = bundle_copy.entries(bundle, _confined_root(settings, bundle))
    flower = is_flower_app(bundle)
    key = built_from(found, required_sites, metadata)
    target = settings.data_dir.resolve() / PREPARED_DIR / str(job_id) / key / bundle.name
    if target.is_dir():
        return target
    meta = None if flower else prepared_meta(_meta(bundle), bundle, required_sites, metadata)
    staging = target.with_name(f"{bundle.name}.partial-{uuid.uuid4().hex}")
    try:
        bundle_copy.copy(found, staging)
        if meta is not None:
            (staging / "meta.json").write_text(json.dumps(meta, indent=2))
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            # Another worker put its complete copy in place first: use that one.
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _meta(bundle: Path) -> dict[str, Any] | None:
    """The bundle's own meta.json (None without one); InvalidRequest if it is no object."""
    meta_path = bundle / "meta.json"
    try:
        original = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"{bundle.name}/meta.json is not readable JSON: {exc}") from None
    except RecursionError:  # valid JSON nested past the interpreter's recursion limit
        raise InvalidRequest(f"{bundle.name}/meta.json is nested too deeply to read") from None
    if original is not None and not isinstance(original, dict):
        raise InvalidRequest(f"{bundle.name}/meta.json is not a JSON object")
    return original


def is_flower_app(bundle: Path) -> bool:
    """True for a Flower App folder: its `pyproject.toml` declares `[tool.flwr.app]`."""
    try:
        document: Any = tomllib.loads((bundle / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return False
    for key in ("tool", "flwr", "app"):
        # A key on the way that is no table (valid TOML): no Flower App either.
        document = document.get(key) if isinstance(document, dict) else None
    return isinstance(document, dict)


def built_from(
    found: bundle_copy.Entries, required_sites: Sequence[str], metadata: Mapping[str, Any] | None
) -> str:
    """A short digest of everything a prepared copy is made from."""
    digest = hashlib.sha256()
    for relative, real in found.files:
        # The content itself, not the size and mtime: a reproducible build or an unpacked
        # archive gives every version the same mtimes. Reading it costs about what the
        # copy it keys costs.
        with open(real, "rb") as handle:
            content = hashlib.file_digest(handle, "sha256").hexdigest()
        digest.update(os.fsencode(relative) + f"\0{content}\n".encode())
    spec = (metadata or {}).get("resource_spec")
    digest.update(json.dumps([list(required_sites), spec], sort_keys=True).encode())
    return digest.hexdigest()[:16]


def prepared_meta(
    original: Mapping[str, Any] | None,
    bundle: Path,
    required_sites: Sequence[str],
    metadata: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The `meta.json` a prepared job is submitted with (see `prepare`)."""
    meta = dict(original or {})
    meta["name"] = meta.get("name") or bundle.name
    deploy = meta.get("deploy_map")
    if not deploy:
        apps = sorted(d.name for d in bundle.iterdir() if d.is_dir() and (d / "config").is_dir())
        if len(apps) != 1:
            raise InvalidRequest(
                f"{bundle.name} has no meta.json deploy map and {len(apps)} app folders "
                "(folders with config/): cannot tell where each app goes"
            )
        deploy = {apps[0]: ["@ALL"]}
    if not isinstance(deploy, Mapping):
        raise InvalidRequest(f"{bundle.name}/meta.json deploy_map is not an object")
    sites = list(required_sites)
    prepared: dict[str, list[str]] = {}
    for app_name, targets in deploy.items():
        names = [str(t) for t in targets] if isinstance(targets, list) else []
        to_server = "server" in names or "@ALL" in names
        to_clients = "@ALL" in names or any(t != "server" for t in names)
        prepared[str(app_name)] = (["server"] if to_server else []) + (sites if to_clients else [])
    meta["deploy_map"] = prepared
    meta["min_clients"] = len(sites)
    resource_spec = (metadata or {}).get("resource_spec")
    if resource_spec is not None:
        meta["resource_spec"] = resource_spec
    return meta


def prepared_jobs(settings: Settings) -> set[str]:
    """The ids (folder names) of the jobs that have prepared copies."""
    root = settings.data_dir.resolve() / PREPARED_DIR
    return {folder.name for folder in root.iterdir()} if root.is_dir() else set()


def sweep_prepared(settings: Settings, ended_job_ids: set[str]) -> list[str]:
    """Remove the prepared copies of jobs that have ended (the data folder must not grow
    without bound); returns the job ids removed. Only an ended job's: a job that ended
    never runs again, while one merely not active now (QUEUED) may be claimed and
    submitting its copy by the time this runs."""
    root = settings.data_dir.resolve() / PREPARED_DIR
    removed = []
    for name in sorted(ended_job_ids & prepared_jobs(settings)):
        shutil.rmtree(root / name, ignore_errors=True)
        removed.append(name)
    return removed


def cached_bundle_jobs(settings: Settings) -> set[uuid.UUID]:
    """The ids of the jobs that have a cached S3 bundle."""
    return BundleFetcher.from_settings(settings).cached_jobs()
