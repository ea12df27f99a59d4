"""Break of round 23's change 1 (app/adapters/jobdefs.py): links inside JOB_ROOT.

Promise: the changelog's Unreleased "Links inside the root (code shared between jobs) are
followed as before", and `refuse_links_out`/`_files`, which walk a link loop once ("a
folder met again through a link loop is not"), so a loop is a shape the round means to take;
every bad bundle is "the job's fault: the submit refuses it as an invalid definition (the
job FAILED at once, definition_invalid), never with an error nobody classified, which a
pipeline step raises loudly and the lease re-drives until the job has spent its attempts,
holding its net each time" (tests/unit/test_flower_bad_bundles.py).

Found: a job folder whose link stays inside the root but cannot be copied, a folder linking
to its own parent (a loop), a link to a file gone from the root, or two links naming each
other, passes the new check and then makes `shutil.copytree` raise `shutil.Error` (an
OSError nobody classifies) out of the dispatch step: the job is left DISPATCHING on its
net, to be re-driven into the same error. (The copy's loop blindness predates the round;
the round's own walk skips loops, the copy it guards does not.)"""

from __future__ import annotations

import pytest

from app.usecases import dispatch, records
from models import JobState, ReasonCode


def _loop(config, job_root):
    (config / "again").symlink_to(config, target_is_directory=True)


def _dangling(config, job_root):
    (config / "shared.py").symlink_to(job_root / "shared" / "gone.py")


def _file_loop(config, job_root):
    (config / "a").symlink_to(config / "b")
    (config / "b").symlink_to(config / "a")


@pytest.mark.parametrize(
    "plant", [_loop, _dangling, _file_loop], ids=["folder-loop", "dangling", "file-loop"]
)
def test_a_link_inside_the_root_that_cannot_be_copied_fails_the_job_definition_invalid(
    plant, world, job_root
):
    plant(job_root / "tiny-job" / "app" / "config", job_root)
    job_id = world.enqueue("inside-links", net="net-a")
    net, attempt = world.run_until_ready(job_id)

    try:
        dispatch.dispatch(world.rt, job_id, net, attempt)
    except Exception as exc:
        raised = f"{type(exc).__module__}.{type(exc).__name__}"
    else:
        raised = None

    with world.rt.sessions() as session:
        job = records.get_job(session, job_id)
        state = (job.state, job.reason_code)
    assert raised is None and state in (
        (JobState.FAILED, ReasonCode.DEFINITION_INVALID),
        (JobState.RUNNING, None),
    ), f"dispatch raised {raised} and left the job {state[0]} on its net"
