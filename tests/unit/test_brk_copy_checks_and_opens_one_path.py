"""Break of round 23's change 1 (app/adapters/jobdefs.py `_copy_within`): the per-file check
"for a link changed after refuse_links_out" resolves the source once to check it
(`_within`: os.path.realpath) and again to copy it (`shutil.copy2(os.path.realpath(...))`):
two walks of the path. A link swapped between the two (the race the check is there for)
is copied from outside JOB_ROOT. The swap is made here at that instant, deterministically.
Fix: open the resolved path once (O_NOFOLLOW on the real path checked, or compare the
opened file's fstat with the checked path's) and copy from that descriptor."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from app.adapters import jobdefs

SECRET = "-----BEGIN PRIVATE KEY----- swapped-between-check-and-copy"


def test_a_file_swapped_for_a_link_out_between_the_check_and_the_copy_is_not_copied(
    world, job_root, tmp_path, monkeypatch
):
    outside = tmp_path / "kits" / "client.key"
    outside.parent.mkdir(parents=True)
    outside.write_text(SECRET)
    weights = job_root / "tiny-job" / "app" / "config" / "weights.bin"
    weights.write_text("weights")
    checked = jobdefs._within
    copying = []

    def check_then_swap(root, path):
        answer = checked(root, path)
        if copying and os.path.basename(path) == "weights.bin" and not os.path.islink(path):
            os.remove(path)
            os.symlink(outside, path)  # after the check, before the copy's own realpath
        return answer

    copy_within = jobdefs._copy_within

    def marked_copy(root, source, target):
        copying.append(source)
        return copy_within(root, source, target)

    monkeypatch.setattr(jobdefs, "_within", check_then_swap)
    monkeypatch.setattr(jobdefs, "_copy_within", marked_copy)
    job_id = world.enqueue("race", net="net-a")
    with contextlib.suppress(AssertionError):
        world.run_pipeline(job_id)

    submitted = b""
    for folder in world.server("net-a").folders:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                submitted += path.read_bytes()
    assert SECRET.encode() not in submitted, (
        "a file swapped for a link out of JOB_ROOT after _copy_within's check was copied"
    )
