"""Each dispatch's submit token is new, even after a requeue that counted no attempt (a net
found misconfigured) and with history written before migration 0004 (the rule itself:
models.Job.start_dispatch, test_states.py): a server that kept its job store never answers
the job's next submit with the run of an earlier one, aborted or dead with its process."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from app.errors import AdminMisconfigured
from app.usecases import abort, declared_nets, dispatch, monitor, reconciler, records
from models import JobEvent, JobState, NetState, StrayRun
from tests.unit.conftest import World


def _strays(world: World) -> list[tuple[str, str | None, str | None]]:
    with world.rt.sessions() as session:
        return [
            (s.net_name, s.nvflare_job_id, s.submit_token)
            for s in session.scalars(select(StrayRun))
        ]


def test_a_job_requeued_as_misconfigured_gets_a_run_of_its_own_on_the_same_server(always_on):
    """app/usecases/README.md: misconfiguration 'fails fast: the net goes MISCONFIGURED and
    its job back to the queue without losing an attempt'; 'a run that no job counts ... is a
    stray run'. Path: try 1 of a submit lands on `fixed` with its reply lost; try 2 meets a
    rejected admin kit: the run is kept as a stray by token, the job QUEUED (attempt still
    0), the net MISCONFIGURED. The stray is aborted, an operator restarts with the kit
    fixed, the job is claimed onto `fixed` again and submitted: it must get a new run, not
    the aborted one."""
    world = always_on
    reconciler.reconcile(world.rt)  # the always-on net comes up READY
    job_id = world.stuck_in_dispatching("pinned", net="fixed")
    token = world.job(job_id).submit_token
    server = world.server("fixed")
    server.submitted[token] = "nv-1"  # try 1 landed; its reply was lost
    server.statuses["nv-1"] = "RUNNING"

    server.submit_error = AdminMisconfigured("admin kit rejected")
    with pytest.raises(AdminMisconfigured):
        dispatch.dispatch(world.rt, job_id, "fixed", 0)
    assert (world.job(job_id).state, world.job(job_id).attempts) == (JobState.QUEUED, 0)
    assert _strays(world) == [("fixed", None, token)]
    assert world.net("fixed").state == NetState.MISCONFIGURED

    # A MISCONFIGURED net is asked nothing about its strays (what answers may be another
    # server): they wait for the operator's fix.
    assert abort.settle_stray_runs(world.rt, "fixed") == 1
    assert server.statuses["nv-1"] == "RUNNING"
    server.submit_error = None  # the operator fixes the kit and restarts the processes
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    assert abort.settle_stray_runs(world.rt, "fixed") == 0
    assert server.statuses["nv-1"] == "FINISHED:ABORTED"
    reconciler.reconcile(world.rt)
    assert world.net("fixed").state == NetState.READY

    world.run_pipeline(job_id)
    assert world.job(job_id).nvflare_job_id != "nv-1", "the new attempt adopted the aborted run"
    monitor.monitor_running_jobs(world.rt)
    assert world.job(job_id).state == JobState.RUNNING


def test_a_job_requeued_as_misconfigured_gets_a_run_of_its_own_after_a_scale_to_zero(world):
    """app/usecases/README.md: 'a run the server forgot is lost, not RUNNING forever'; 'its
    job back to the queue without losing an attempt'. Try 1 lands on net-a with its reply
    lost, try 2 meets a rejected kit: net-a MISCONFIGURED and scaled to zero (the run dies
    with the process), the stray cleared once net-a is STOPPED at zero replicas after a
    restart with the kit fixed. The job's next submit to net-a must start a run, not adopt
    the dead one."""
    job_id = world.stuck_in_dispatching("pinned", net="net-a")
    token = world.job(job_id).submit_token
    server = world.server("net-a")
    server.submitted[token] = "nv-1"
    server.statuses["nv-1"] = "RUNNING"

    server.submit_error = AdminMisconfigured("admin kit rejected")
    with pytest.raises(AdminMisconfigured):
        dispatch.dispatch(world.rt, job_id, "net-a", 0)
    assert (world.job(job_id).state, world.job(job_id).attempts) == (JobState.QUEUED, 0)
    assert world.driver("net-a").replicas == 0
    server.restart()  # the process died with the scale-down; its job store did not

    server.submit_error = None
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    reconciler.reconcile(world.rt)
    assert _strays(world) == []  # gone with the server

    world.run_pipeline(job_id)
    assert world.job(job_id).nvflare_job_id != "nv-1", "the new attempt adopted the dead run"


def test_a_second_dispatch_at_one_attempt_gets_a_new_token_with_history_before_0004(world):
    """app/README.md, Design decisions: "each dispatch's submit token must be new, even when
    a requeue counted no attempt" (records.dispatches_of), and a requeued job on a server
    that kept its job store must not be answered with the earlier run
    (models.Job.start_dispatch).

    A job that spent an attempt on a readiness timeout was dispatched at attempt 1 before
    migration 0004 (its DISPATCHING row has attempt NULL), its net was then found
    misconfigured (a requeue that counts no attempt), and it is dispatched again at attempt
    1. `start_dispatch` keeps "the older rule" for such history (`len(earlier) > attempts`,
    1 > 1 is false) and hands out `<id>-1` a second time: the server, which kept its job
    store, answers with the first dispatch's run (one killed with its process), which the
    job adopts instead of starting a run of its own."""
    job_id = world.enqueue("requeued-twice", net="net-a")
    with world.rt.sessions.begin() as session:
        records.get_job(session, job_id).attempts = 1  # a readiness timeout spent one
    net, attempt = world.run_until_ready(job_id)
    with world.rt.sessions.begin() as session:
        earlier = records.dispatches_of(session, job_id)
        first = records.get_job(session, job_id).start_dispatch(world.clock(), earlier=earlier)
    server = world.server(net)
    landed = world.admin(net).submit(world.rt.settings.job_root, first)  # the submit landed
    server.submit_error = AdminMisconfigured("admin certificate expired")
    with pytest.raises(AdminMisconfigured):
        dispatch.dispatch(world.rt, job_id, net, attempt)  # the retry meets the bad kit
    assert world.job(job_id).state == JobState.QUEUED
    assert world.job(job_id).attempts == attempt  # not the job's fault: no attempt counted
    with world.rt.sessions.begin() as session:
        # That history was written before migration 0004: its rows know no attempt.
        session.execute(update(JobEvent).where(JobEvent.job_id == job_id).values(attempt=None))
    # A human fixes the kit; the server had gone to zero with the run (its job store kept).
    server.submit_error = None
    server.restart()
    with world.rt.sessions.begin() as session:
        declared_nets.sync_nets(session, world.rt.settings, world.clock(), at_start=True)
    reconciler.reconcile(world.rt)  # the stray died with the server: forgotten

    net, again = world.run_until_ready(job_id)
    assert again == attempt
    dispatch.dispatch(world.rt, job_id, net, again)

    second = world.job(job_id).submit_token
    assert second != first, f"dispatch at attempt {again} reused submit token {first}"
    assert world.job(job_id).nvflare_job_id != landed, "adopted the earlier dispatch's run"
