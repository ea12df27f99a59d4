"""A job's copy reads each file at the path the check resolved, through a descriptor opened
without following a link (app/adapters/bundle_copy.py): a file swapped for a link out of
JOB_ROOT between the check and the copy is refused (the job FAILED `definition_invalid`),
never copied from outside the root. The swap is made here at that instant."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from app.adapters import bundle_copy
from app.usecases import records
from models import JobState, ReasonCode

SECRET = "-----BEGIN PRIVATE KEY----- swapped-between-check-and-copy"


def test_a_file_swapped_for_a_link_out_between_the_check_and_the_copy_is_not_copied(
    world, job_root, tmp_path, monkeypatch
):
    outside = tmp_path / "kits" / "client.key"
    outside.parent.mkdir(parents=True)
    outside.write_text(SECRET)
    weights = job_root / "tiny-job" / "app" / "config" / "weights.bin"
    weights.write_text("weights")
    copy = bundle_copy.copy

    def swap_then_copy(found, target):
        for _, real in found.files:
            if os.path.basename(real) == "weights.bin":
                os.remove(real)
                os.symlink(outside, real)  # after the check, before the copy opens it
        return copy(found, target)

    monkeypatch.setattr(bundle_copy, "copy", swap_then_copy)
    job_id = world.enqueue("race", net="net-a")
    with contextlib.suppress(AssertionError):
        world.run_pipeline(job_id)

    submitted = b""
    for folder in world.server("net-a").folders:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                submitted += path.read_bytes()
    assert SECRET.encode() not in submitted, "a file swapped for a link out was copied"
    with world.rt.sessions() as session:
        job = records.get_job(session, job_id)
        assert (job.state, job.reason_code) == (JobState.FAILED, ReasonCode.DEFINITION_INVALID)
