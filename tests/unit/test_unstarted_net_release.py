"""A job whose bundle vanished fails before its net's scale-up; the net its claim moved to
STARTING is STOPPED again only if the platform shows no server wanted, running or pending
for it (a server still winding down, or just asked for, keeps it STARTING for reconcile)."""

from __future__ import annotations

import shutil

import pytest

from app.adapters.drivers.base import Observation
from app.usecases import dispatch
from app.usecases.dispatch import Step
from models import JobState, NetState


@pytest.mark.parametrize(
    ("observed", "net_after"),
    [
        (Observation(desired=0, running=0, pending=0), NetState.STOPPED),
        (Observation(desired=0, running=1, pending=0), NetState.STARTING),  # winding down
        (Observation(desired=1, running=0, pending=0), NetState.STARTING),  # just asked for
        (Observation(desired=0, running=0, pending=1), NetState.STARTING),  # placing a task
    ],
    ids=["nothing", "running", "desired", "pending"],
)
def test_a_net_is_stopped_again_only_if_no_server_is_on_its_way(world, observed, net_after):
    job_id = world.enqueue("j", net="net-a")
    [assignment] = dispatch.claim_and_start(world.rt)
    assert world.net("net-a").state == NetState.STARTING
    shutil.rmtree(world.rt.settings.job_root / "tiny-job")
    world.driver("net-a").observe = lambda: observed  # type: ignore[method-assign]

    result = dispatch.scale_up(world.rt, job_id, "net-a", assignment.attempt)

    assert result.step == Step.GAVE_UP
    job = world.job(job_id)
    assert (job.state, job.reason_code, job.last_error) == (
        JobState.FAILED,
        "bundle_missing",
        f"bundle_missing: {result.detail}",
    )
    assert "disappeared" in result.detail
    assert world.driver("net-a").calls == []  # never asked to scale up for a bundle-less job
    assert world.net("net-a").state == net_after
