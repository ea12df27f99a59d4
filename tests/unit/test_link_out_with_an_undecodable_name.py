"""A link out of JOB_ROOT whose file name is bytes that are not UTF-8 (a tar or zip from
flip-api keeps them; Python reads a lone surrogate) fails its job `definition_invalid` like
any other: the refusal names the entry short and escaped (`app.errors.quoted`), so the
failure reason can be stored and the job does not stay DISPATCHING on its net."""

from __future__ import annotations

import os

from models import JobState, ReasonCode
from tests.unit.test_links_inside_the_root_that_cannot_be_copied import dispatched


def test_a_link_out_of_the_root_with_a_non_utf8_name_fails_the_job_definition_invalid(
    world, job_root, tmp_path
):
    outside = tmp_path / "kits" / "client.key"
    outside.parent.mkdir(parents=True)
    outside.write_text("-----BEGIN PRIVATE KEY-----")
    config = job_root / "tiny-job" / "app" / "config"
    os.symlink(outside, os.fsencode(config) + b"/weights-\xff.pem")
    job_id = world.enqueue("odd-name", net="net-a")
    raised, state = dispatched(world, job_id)
    assert (raised, state) == (None, (JobState.FAILED, ReasonCode.DEFINITION_INVALID)), (
        f"dispatch raised {raised!r}; the job is left {state[0]} on its net"
    )
