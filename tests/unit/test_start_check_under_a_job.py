"""A worker start that finds a net's files naming another server while the net has a job.

`prepare_nets_at_start` checks each net's admin kit (or Flower certificate) against the
server the net runs, and takes a mismatching net out of service (`mark_misconfigured`).
That refuses a net with an active job ("monitor settles that one first"), and the start
only logs it: nothing checks the files again. Once that job ends, the net is back in
service with files that dial another server, and the next job is claimed onto it, where it
looks like a server that never comes up (readiness deadline, an attempt lost each time),
the very case the start check exists to avoid. The guarantee: a net whose settings are
wrong is MISCONFIGURED and its jobs wait QUEUED.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from app.adapters import net_check
from app.celery_app import prepare_nets_at_start
from app.usecases import declared_nets, dispatch, records
from models import JobState, NetEvent, NetState, ReasonCode

pytestmark = pytest.mark.unit

FOREIGN = "admin kit dials other-host:8003, but net net-a's server serves on net-a:8003"


def _net_a_dials_another_server(net: Any, _settings: Any, **_kw: Any) -> str | None:
    return FOREIGN if net.name == "net-a" else None


def test_a_net_found_misconfigured_at_start_under_a_job_takes_no_job_after_it(
    world, sqlite_url, monkeypatch
):
    first = world.enqueue("first", net="net-a")
    world.run_pipeline(first)
    assert world.net("net-a").state == NetState.BUSY
    # The redeploy that brought the wrong kit restarts the worker while net-a runs `first`.
    monkeypatch.setattr(net_check, "endpoint_problem", _net_a_dials_another_server)
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))
    assert world.job(first).state == JobState.RUNNING  # its run is left alone: right
    # The run ends; its net is released (what the monitor does on the server's verdict).
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, first, JobState.COMPLETED, "done", world.clock(), code=ReasonCode.RUN_COMPLETED
        )
    # Out of service the moment its job lets it go, in that same transaction: never READY
    # for a claim in between.
    net = world.net("net-a")
    assert (net.state, net.last_error, net.misconfigured_after_job) == (
        NetState.MISCONFIGURED,
        FOREIGN,
        None,
    )
    second = world.enqueue("second", net="net-a")
    dispatch.claim_and_start(world.rt)
    assert world.job(second).state == JobState.QUEUED
    assert world.net("net-a").state == NetState.MISCONFIGURED


def test_a_net_found_misconfigured_at_start_while_idle_takes_no_job(world, sqlite_url, monkeypatch):
    """The case the start check handles: the same verdict on an idle net holds its jobs."""
    monkeypatch.setattr(net_check, "endpoint_problem", _net_a_dials_another_server)
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))
    job_id = world.enqueue("j", net="net-a")
    dispatch.claim_and_start(world.rt)
    assert world.job(job_id).state == JobState.QUEUED
    assert (world.net("net-a").state, world.net("net-a").last_error) == (
        NetState.MISCONFIGURED,
        FOREIGN,
    )


def test_a_restart_with_the_files_still_wrong_never_puts_the_net_in_service(
    world, sqlite_url, monkeypatch
):
    """A restart that did not fix the files: the net was MISCONFIGURED with a job waiting
    QUEUED for it. Another worker's assign round (a rolling restart, beat's period) lands
    between the start's reset (its own commit) and its check of the files."""
    with world.rt.sessions.begin() as session:
        declared_nets.mark_misconfigured(session, "net-a", FOREIGN, world.clock())
    waiting = world.enqueue("waiting", net="net-a")
    assert dispatch.claim_and_start(world.rt) == []  # out of service: it waits
    monkeypatch.setattr(net_check, "endpoint_problem", _net_a_dials_another_server)
    mark = declared_nets.mark_misconfigured

    def a_claim_lands_first(*args: Any, **kwargs: Any) -> bool:
        dispatch.claim_and_start(world.rt)
        return mark(*args, **kwargs)

    monkeypatch.setattr(declared_nets, "mark_misconfigured", a_claim_lands_first)
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))
    assert world.job(waiting).state == JobState.QUEUED
    assert world.net("net-a").state == NetState.MISCONFIGURED
    # Never out of MISCONFIGURED, not even for a moment another worker could claim in: the
    # start checks the files before it resets anything, in one transaction.
    with world.rt.sessions() as session:
        moves = session.execute(
            select(NetEvent.from_state, NetEvent.to_state).where(NetEvent.net_name == "net-a")
        ).all()
    assert [tuple(m) for m in moves if m[0] == NetState.MISCONFIGURED] == []


def test_a_restart_with_the_files_still_wrong_keeps_the_new_reason(world, sqlite_url, monkeypatch):
    with world.rt.sessions.begin() as session:
        declared_nets.mark_misconfigured(session, "net-a", "an older reason", world.clock())
    monkeypatch.setattr(net_check, "endpoint_problem", _net_a_dials_another_server)
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))
    assert (world.net("net-a").state, world.net("net-a").last_error) == (
        NetState.MISCONFIGURED,
        FOREIGN,
    )


def test_a_restart_with_the_files_fixed_resets_the_net(world, sqlite_url, monkeypatch):
    with world.rt.sessions.begin() as session:
        declared_nets.mark_misconfigured(session, "net-a", FOREIGN, world.clock())
    monkeypatch.setattr(net_check, "endpoint_problem", lambda *_a, **_kw: None)
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))
    assert (world.net("net-a").state, world.net("net-a").last_error) == (NetState.STOPPED, None)


def test_a_restart_with_the_files_fixed_under_the_job_drops_the_kept_verdict(
    world, sqlite_url, monkeypatch
):
    """The human fixed the files and restarted while the job still ran: the net goes back
    into service after it, as after any fix."""
    first = world.enqueue("first", net="net-a")
    world.run_pipeline(first)
    settings = world.rt.settings.model_copy(update={"database_url": sqlite_url})
    monkeypatch.setattr(net_check, "endpoint_problem", _net_a_dials_another_server)
    prepare_nets_at_start(settings)
    assert world.net("net-a").misconfigured_after_job == FOREIGN
    monkeypatch.setattr(net_check, "endpoint_problem", lambda *_a, **_kw: None)
    prepare_nets_at_start(settings)
    assert world.net("net-a").misconfigured_after_job is None
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session, first, JobState.COMPLETED, "done", world.clock(), code=ReasonCode.RUN_COMPLETED
        )
    assert world.net("net-a").state == NetState.READY
    second = world.enqueue("second", net="net-a")
    dispatch.claim_and_start(world.rt)
    assert world.job(second).state != JobState.QUEUED


def test_a_requeued_job_leaves_its_net_out_of_service_too(world, sqlite_url, monkeypatch):
    """Every way a job lets its net go applies the kept verdict (a requeue here), and the
    requeued job waits for a human rather than being claimed back onto it."""
    first = world.enqueue("first", net="net-a")
    world.run_pipeline(first)
    monkeypatch.setattr(net_check, "endpoint_problem", _net_a_dials_another_server)
    prepare_nets_at_start(world.rt.settings.model_copy(update={"database_url": sqlite_url}))
    with world.rt.sessions.begin() as session:
        records.requeue_job(session, first, "server restarted under the run", world.clock())
    dispatch.claim_and_start(world.rt)
    assert world.job(first).state == JobState.QUEUED
    assert world.net("net-a").state == NetState.MISCONFIGURED
