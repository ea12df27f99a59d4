"""What a job's bundle is made of, and its copy: only regular files and folders that lie
inside the bundle's root (JOB_ROOT for a job folder, the downloaded folder for an S3 one).

flip-api unpacks its users' jobs into JOB_ROOT, and an archive keeps symlinks: a link in a
job may point anywhere on the worker's host (an admin kit's private key, the worker's
`/proc/self/environ`), and what is submitted reaches the job's own code on the FL server and
every site of its deploy map. Links inside the root (code shared between jobs) are followed;
a folder met again through a link loop is walked once. Everything else (a link out of the
root, a link to nothing, a link loop that is no folder, a FIFO, a device) refuses the bundle
as an invalid definition, naming the entry short and escaped.

The copy opens each file at the path the walk resolved with O_NOFOLLOW and copies from that
descriptor, so a file swapped for a link after the walk is refused, not followed. (A folder
on that path swapped for a link in the same instant is out of reach: whoever can do that can
write the job root itself.)
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from app.errors import InvalidRequest, quoted


@dataclass(frozen=True)
class Entries:
    """A bundle's folders (relative) and files (relative, and the real path to read)."""

    folders: tuple[str, ...]
    files: tuple[tuple[str, str], ...]


def entries(bundle: Path, root: Path) -> Entries:
    """Every folder and file the bundle's copy holds, checked (module docstring);
    InvalidRequest naming the first entry that may not be submitted."""
    folders: list[str] = []
    files: list[tuple[str, str]] = []
    seen: set[str] = set()

    def unreadable(exc: OSError) -> None:
        raise _refused(bundle, exc.filename or str(bundle), f"cannot be read ({exc.strerror})")

    for top, subfolders, names in os.walk(bundle, followlinks=True, onerror=unreadable):
        real_top = os.path.realpath(top)
        if not _within(root, real_top):
            raise _refused(bundle, top, "links outside the job root")
        if real_top in seen:  # a folder met again through a link loop: walked once
            subfolders[:] = []
            continue
        seen.add(real_top)
        if top != str(bundle):
            folders.append(os.path.relpath(top, bundle))
        subfolders.sort()
        for name in sorted(names):
            path = os.path.join(top, name)
            files.append((os.path.relpath(path, bundle), _regular_file(bundle, root, path)))
    return Entries(tuple(folders), tuple(files))


def _regular_file(bundle: Path, root: Path, path: str) -> str:
    """The real path of a regular file inside the root that `path` is or links to."""
    real = os.path.realpath(path)
    if not _within(root, real):
        raise _refused(bundle, path, "links outside the job root")
    try:
        mode = os.stat(real, follow_symlinks=False).st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            raise _refused(bundle, path, "is a link to nothing (or a link loop)") from None
        raise
    if not stat.S_ISREG(mode):
        raise _refused(bundle, path, "is neither a regular file nor a folder")
    return real


def copy(found: Entries, target: Path) -> None:
    """Write the checked entries under `target` (made here), each file read through a
    descriptor opened without following a link (module docstring)."""
    target.mkdir(parents=True)
    for folder in found.folders:
        (target / folder).mkdir(parents=True, exist_ok=True)
    for relative, real in found.files:
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOENT):
                raise _changed(relative) from None
            raise
        with os.fdopen(fd, "rb") as source:
            mode = os.fstat(source.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise _changed(relative)
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            with open(destination, "wb") as sink:
                shutil.copyfileobj(source, sink)
            os.chmod(destination, stat.S_IMODE(mode))


def _within(root: Path, real: str) -> bool:
    return Path(real).is_relative_to(root)


def _refused(bundle: Path, path: str, why: str) -> InvalidRequest:
    # The name as the disk holds it may be any bytes (surrogate escapes): quoted, storable.
    relative = os.path.relpath(path, bundle)
    return InvalidRequest(f"{quoted(os.path.join(bundle.name, relative))} {why}")


def _changed(relative: str) -> InvalidRequest:
    return InvalidRequest(f"{quoted(relative)} changed while it was copied")
