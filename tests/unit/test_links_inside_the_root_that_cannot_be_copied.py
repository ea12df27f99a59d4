"""Links inside JOB_ROOT are followed and a folder met again through a link loop is walked
once; a link inside the root that cannot be copied (a link to a file gone, two links naming
each other) fails its job `definition_invalid` at once, never with an error nobody
classified (which the lease re-drives, holding the net each time)."""

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
    raised, state = dispatched(world, job_id)
    assert raised is None and state in (
        (JobState.FAILED, ReasonCode.DEFINITION_INVALID),
        (JobState.RUNNING, None),
    ), f"dispatch raised {raised} and left the job {state[0]} on its net"


def dispatched(world, job_id) -> tuple[str | None, tuple[JobState, ReasonCode | None]]:
    """The dispatch step run on the job's ready net: what it raised (None: nothing), and
    the job's state and reason code after it."""
    net, attempt = world.run_until_ready(job_id)
    try:
        dispatch.dispatch(world.rt, job_id, net, attempt)
    except Exception as exc:
        raised: str | None = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    else:
        raised = None
    with world.rt.sessions() as session:
        job = records.get_job(session, job_id)
        return raised, (job.state, job.reason_code)
