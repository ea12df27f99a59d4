"""A Flower App Bundle (FAB) from a job's folder, carrying the dispatcher's submit token.

Flower has no submit token: a start-run whose reply was lost cannot be asked about by a key
of ours. So the dispatcher sets one in the run's config (`TOKEN_KEY`, an override the
SuperLink stores with the run and lists in ListRuns), and finds the run again by it; the
job's required sites and resource spec go in beside it (`SITES_KEY`, `RESOURCE_SPEC_KEY`),
for the ServerApp to read in `context.run_config`. The SuperLink refuses an override for a
key the app does not declare, so the FAB built here declares the three (default "") in the
app's `[tool.flwr.app.config]`.

The bundle is what `flwr build` (flwr 1.42) makes, without flwr: a zip of `pyproject.toml`
and the app's files of the kinds flwr packs (`INCLUDED_SUFFIXES`, `LICENSE`), without the
folders and test files flwr leaves out, plus the `.info/CONTENT` manifest (path, sha256,
size in bits) the SuperExec checks before it installs the app. Entries are sorted and
dated like flwr's, so one folder always gives the same bytes (and FAB hash).
"""

from __future__ import annotations

import copy
import hashlib
import io
import re
import tomllib
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.errors import InvalidRequest

TOKEN_KEY = "fl-dispatcher-submit-token"  # noqa: S105  (a config key, no secret)
# The job's sites (a JSON list of SuperNode names) and resource spec (a JSON object, "" for
# none), so a ServerApp can know which SuperNodes the job needs (`client.submit`).
SITES_KEY = "fl-dispatcher-required-sites"
RESOURCE_SPEC_KEY = "fl-dispatcher-resource-spec"
DISPATCHER_KEYS = (TOKEN_KEY, SITES_KEY, RESOURCE_SPEC_KEY)
CONFIG_FILE = "pyproject.toml"
MANIFEST = ".info/CONTENT"
FAB_DATE = (2024, 10, 1, 0, 0, 0)  # flwr's own (flwr.common.constant.FAB_DATE)
FAB_MAX_BYTES = 10 * 1024 * 1024  # what the SuperLink accepts (FAB_MAX_SIZE)
READ_CHUNK = 1024 * 1024  # bytes of an app file read at a time
INCLUDED_SUFFIXES = frozenset({".py", ".toml", ".md", ".yaml", ".yml", ".json", ".jsonl"})
# Folders flwr never packs (its FAB_EXCLUDE_PATTERNS), at any depth.
EXCLUDED_DIRS = frozenset(
    {".flwr", "__pycache__", ".venv", "venv", ".git", "build", "dist", ".eggs", "lib", "lib64"}
)
_CONFIG_HEADER = re.compile(
    r"^[ \t]*\[[ \t]*tool[ \t]*\.[ \t]*flwr[ \t]*\.[ \t]*app[ \t]*\.[ \t]*config[ \t]*\]"
    r"[ \t]*(#.*)?$",
    re.MULTILINE,
)


def _app(document: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The document's [tool.flwr.app] table ({} when absent); InvalidRequest when a key on
    its way, or the app's config, is something else than a table (valid TOML all the same)."""
    table: dict[str, Any] = document
    for key in ("tool", "flwr", "app"):
        table = table.get(key, {})
        if not isinstance(table, dict):
            raise InvalidRequest(f"{folder / CONFIG_FILE}: {key} is not a table")
    if not isinstance(table.get("config", {}), dict):
        raise InvalidRequest(f"{folder / CONFIG_FILE}: [tool.flwr.app.config] is not a table")
    return table


def _parse(text: str, folder: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"{folder / CONFIG_FILE} is not valid TOML: {exc}") from exc
    except RecursionError:  # valid TOML nested past the interpreter's recursion limit
        raise InvalidRequest(f"{folder / CONFIG_FILE} is nested too deeply to read") from None


def declare_keys(text: str, folder: Path = Path(".")) -> str:
    """`pyproject.toml`'s text with DISPATCHER_KEYS declared in the app's config (default "").

    The lines are added under the config table's header, or in a new table at the end; the
    result is parsed again, and refused if anything but those keys changed (a config
    written as dotted keys or an inline table, where a line cannot be added safely).
    """
    document = _parse(text, folder)
    app = _app(document, folder)
    components = app.get("components")
    if not isinstance(components, dict) or not components:
        raise InvalidRequest(
            f"{folder / CONFIG_FILE} is not a Flower App: no [tool.flwr.app.components]"
        )
    config = app.get("config", {})
    missing = [key for key in DISPATCHER_KEYS if key not in config]
    if not missing:
        return text
    lines = "".join(f'{key} = ""\n' for key in missing)
    header = _CONFIG_HEADER.search(text)
    if header is not None:
        cut = text.find("\n", header.end())
        cut = len(text) if cut < 0 else cut + 1
        head = text[:cut] if text[:cut].endswith("\n") else text[:cut] + "\n"
        changed = head + lines + text[cut:]
    else:
        tail = "" if text.endswith("\n") or not text else "\n"
        changed = f"{text}{tail}\n[tool.flwr.app.config]\n{lines}"
    if _parse_or_none(changed) != _with_keys(document, missing):
        raise InvalidRequest(
            f"{folder / CONFIG_FILE}: cannot declare the run config keys "
            f"{', '.join(map(repr, missing))} (write the app's config as a "
            '[tool.flwr.app.config] table, or declare the keys there with the default "")'
        )
    return changed


def _parse_or_none(text: str) -> dict[str, Any] | None:
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return None


def _with_keys(document: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """What the document must read once the keys are declared: itself plus those keys."""
    expected = copy.deepcopy(document)
    app = expected.setdefault("tool", {}).setdefault("flwr", {}).setdefault("app", {})
    config = app.setdefault("config", {})
    for key in keys:
        config[key] = ""
    return expected


def _packed(relative: Path) -> bool:
    """Whether flwr packs this file of the app's folder into its FAB."""
    if any(part in EXCLUDED_DIRS for part in relative.parts[:-1]):
        return False
    name = relative.name
    if (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"):
        return False
    if relative.as_posix() == CONFIG_FILE:
        return False  # written first, with the dispatcher's keys declared
    return relative.suffix in INCLUDED_SUFFIXES or relative.as_posix() == "LICENSE"


def app_files(folder: Path) -> list[str]:
    """The app's files the FAB carries besides pyproject.toml (POSIX paths, sorted)."""
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and _packed(path.relative_to(folder))
    )


def build_fab(folder: Path) -> bytes:
    """The FAB of the Flower App in `folder`, with DISPATCHER_KEYS declared in its config.

    InvalidRequest for a folder that is no Flower App, a config the key cannot be added to,
    an app that chooses its own files (`fab-include`/`fab-exclude`, not supported here), or
    a bundle over the SuperLink's size limit.
    """
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise InvalidRequest(f"{folder} holds no {CONFIG_FILE}: not a Flower App")
    try:
        text = config_path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{config_path} is not UTF-8 text: {exc.reason}") from exc
    app = _app(_parse(text, folder), folder)
    chosen = sorted(key for key in ("fab-include", "fab-exclude") if key in app)
    if chosen:
        raise InvalidRequest(f"{config_path}: {', '.join(chosen)} is not supported yet")
    config = declare_keys(text, folder).encode("utf-8")
    buffer = io.BytesIO()
    manifest = []
    # One chunk of one file in memory at a time, and the bundle built so far: a folder may
    # hold gigabytes the FAB would pack, far past what the SuperLink takes.
    with zipfile.ZipFile(buffer, "w") as fab:
        manifest.append(_write(fab, CONFIG_FILE, [config], len(config), folder))
        for name in app_files(folder):
            path = folder / name
            with path.open("rb") as source:
                chunks = iter(lambda: source.read(READ_CHUNK), b"")
                manifest.append(_write(fab, name, chunks, path.stat().st_size, folder))
        listing = "\n".join(manifest).encode("utf-8")
        _write(fab, MANIFEST, [listing], len(listing), folder)
    data = buffer.getvalue()
    if len(data) > FAB_MAX_BYTES:
        raise _too_large(folder, len(data))
    return data


def _too_large(folder: Path, size: int) -> InvalidRequest:
    return InvalidRequest(
        f"{folder}: its FAB is {size:,} bytes, over the SuperLink's {FAB_MAX_BYTES:,}"
    )


def _write(
    fab: zipfile.ZipFile, name: str, chunks: Iterable[bytes], size: int, folder: Path
) -> str:
    """Add one file, as `writestr` would (same bytes), and return its manifest line (path,
    sha256, size in bits); InvalidRequest as soon as the bundle passes FAB_MAX_BYTES."""
    info = zipfile.ZipInfo(name, date_time=FAB_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.file_size = size
    digest, written = hashlib.sha256(), 0
    with fab.open(info, mode="w") as entry:
        for chunk in chunks:
            entry.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            if fab.fp is not None and fab.fp.tell() > FAB_MAX_BYTES:
                raise _too_large(folder, fab.fp.tell())
    return f"{name},{digest.hexdigest()},{written * 8}"


def fab_hash(fab: bytes) -> str:
    """The FAB's hash as the SuperLink computes it (sha256 of the bundle's bytes)."""
    return hashlib.sha256(fab).hexdigest()
