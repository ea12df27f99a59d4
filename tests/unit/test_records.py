"""Use cases on SQL state, on an embedded SQLite database built by migrations."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from app.errors import InvalidRequest, NotFound
from app.schemas import EnqueueJob, ReportedStatus, ReportJobStatus
from app.usecases import claims, declared_nets, records
from app.usecases import enqueue as enqueue_uc
from models import Job, JobEvent, JobState, Net, NetState, ReasonCode


@pytest.fixture
def db(sqlite_factory, settings, clock):
    with sqlite_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    return sqlite_factory


def enqueue(db, settings, clock, key="k1", **kw):
    request = EnqueueJob(caller_key=key, definition="tiny-job", **kw)
    with db.begin() as session:
        return enqueue_uc.enqueue_job(session, settings, request, clock())


def states(db, job_id):
    with db() as session:
        job = session.get(Job, job_id)
        return job.state, (session.get(Net, job.net_name).state if job.net_name else None)


def test_sync_nets_creates_rows_once(db, settings, clock):
    with db.begin() as session:
        assert declared_nets.sync_nets(session, settings, clock()) == []
        assert {n.name: n.state for n in session.scalars(select(Net))} == {
            "net-a": NetState.STOPPED,
            "net-b": NetState.STOPPED,
        }


def test_sync_nets_returns_the_names_of_the_rows_it_created(sqlite_factory, settings, clock):
    with sqlite_factory.begin() as session:
        assert declared_nets.sync_nets(session, settings, clock()) == ["net-a", "net-b"]


def test_enqueue_is_idempotent_on_caller_key(db, settings, clock):
    first = enqueue(db, settings, clock, required_sites=["site-1"])
    second = enqueue(db, settings, clock, required_sites=["site-1"])
    assert first.created and not second.created
    assert first.job_id == second.job_id
    with db() as session:
        assert len(session.scalars(select(Job)).all()) == 1
        events = session.scalars(select(JobEvent)).all()
        assert [(e.from_state, e.to_state) for e in events] == [(None, JobState.QUEUED)]


def test_enqueue_takes_sites_from_the_requested_net(db, settings, clock):
    result = enqueue(db, settings, clock, net="net-b")
    with db() as session:
        job = session.get(Job, result.job_id)
        assert job.required_sites == ["site-1", "site-2"]
        assert job.requested_net == "net-b"
        assert job.max_attempts == settings.max_attempts


@pytest.mark.parametrize(
    ("definition", "needle"),
    [
        ("../outside", "without '..'"),
        ("/etc", "relative folder"),
        ("missing-job", "not a folder"),
        ("tiny-job/../../x", "without '..'"),
        ("s3://Bad_Bucket/x", "invalid bucket name"),
        ("s3://flip-jobs/a/b c", "job folder name"),
    ],
)
def test_enqueue_rejects_bad_definitions_and_writes_nothing(
    db, settings, clock, definition, needle
):
    with pytest.raises(InvalidRequest, match=needle), db.begin() as session:
        enqueue_uc.enqueue_job(
            session,
            settings,
            EnqueueJob(caller_key="x", definition=definition, required_sites=["s"]),
            clock(),
        )
    with db() as session:
        assert session.scalars(select(Job)).all() == []


def test_enqueue_rejects_a_symlink_out_of_the_root(db, settings, clock, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (settings.job_root / "sneaky").symlink_to(outside)
    with pytest.raises(InvalidRequest, match="escapes"), db.begin() as session:
        enqueue_uc.enqueue_job(
            session,
            settings,
            EnqueueJob(caller_key="x", definition="sneaky", required_sites=["s"]),
            clock(),
        )


def test_enqueue_accepts_an_s3_uri(db, settings, clock):
    with db.begin() as session:
        result = enqueue_uc.enqueue_job(
            session,
            settings,
            EnqueueJob(caller_key="s3", definition="s3://flip-jobs/a/b", required_sites=["s"]),
            clock(),
        )
    assert result.created


def test_enqueue_rejects_unknown_net_and_empty_sites(db, settings, clock):
    with pytest.raises(InvalidRequest, match="unknown net 'nope'"), db.begin() as session:
        enqueue_uc.enqueue_job(
            session,
            settings,
            EnqueueJob(caller_key="a", definition="tiny-job", net="nope"),
            clock(),
        )
    with pytest.raises(InvalidRequest, match="required_sites"), db.begin() as session:
        enqueue_uc.enqueue_job(
            session, settings, EnqueueJob(caller_key="b", definition="tiny-job"), clock()
        )


def test_assign_prefers_priority_then_age_and_a_warm_net(db, settings, clock):
    low = enqueue(db, settings, clock, "low", required_sites=["s"]).job_id
    clock.advance(1)
    high = enqueue(db, settings, clock, "high", required_sites=["s"], priority=5).job_id
    with db.begin() as session:
        session.get(Net, "net-b").transition(NetState.STARTING, clock(), "t")
        session.get(Net, "net-b").transition(NetState.READY, clock(), "t")
    with db.begin() as session:
        first = claims.claim_next_job(session, settings, clock())
    assert first is not None
    assert (first.job_id, first.net_name, first.net_state) == (high, "net-b", NetState.READY)
    with db.begin() as session:
        second = claims.claim_next_job(session, settings, clock())
    assert (second.job_id, second.net_name, second.net_state) == (low, "net-a", NetState.STARTING)
    with db.begin() as session:
        assert claims.claim_next_job(session, settings, clock()) is None


def test_assign_honours_the_requested_net(db, settings, clock):
    job_id = enqueue(db, settings, clock, net="net-b").job_id
    with db.begin() as session:
        assignment = claims.claim_next_job(session, settings, clock())
    assert assignment.net_name == "net-b" and assignment.job_id == job_id


def test_requeue_then_fail_after_max_attempts(db, settings, clock):
    job_id = enqueue(db, settings, clock, required_sites=["s"], max_attempts=2).job_id
    with db.begin() as session:
        claims.claim_next_job(session, settings, clock())
    with db.begin() as session:
        assert records.requeue_job(session, job_id, "server vanished", clock()) is True
    assert states(db, job_id) == (JobState.QUEUED, None)
    with db.begin() as session:
        claims.claim_next_job(session, settings, clock())
    with db.begin() as session:
        assert records.requeue_job(session, job_id, "server vanished again", clock()) is False
    with db() as session:
        job = session.get(Job, job_id)
        assert job.state == JobState.FAILED
        assert job.attempts == 2
        assert "server vanished again" in job.last_error


def test_dispatch_then_finish_frees_the_net(db, settings, clock):
    job_id = enqueue(db, settings, clock, net="net-a").job_id
    with db.begin() as session:
        claims.claim_next_job(session, settings, clock())
        session.get(Net, "net-a").transition(NetState.READY, clock(), "ready")
        session.get(Job, job_id).start_dispatch(clock())
    with db.begin() as session:
        records.mark_dispatched(session, job_id, "nv-1", 1234.5, clock())
        records.mark_dispatched(session, job_id, "nv-1", 1234.5, clock())  # repeated delivery
    assert states(db, job_id) == (JobState.RUNNING, NetState.BUSY)
    with db.begin() as session:
        assert (
            records.finish_job(
                session, job_id, JobState.COMPLETED, "done", clock(), code=ReasonCode.RUN_COMPLETED
            )
            is True
        )
        assert (
            records.finish_job(
                session, job_id, JobState.COMPLETED, "again", clock(), code=ReasonCode.RUN_COMPLETED
            )
            is False
        )
    with db() as session:
        net = session.get(Net, "net-a")
        assert net.state == NetState.READY and net.idle_since == clock()


def test_abort_queued_and_assigned_at_once_running_goes_aborting(db, settings, clock):
    queued = enqueue(db, settings, clock, "q", net="net-a").job_id
    with db.begin() as session:
        decision = records.abort_job(session, queued, "user", clock())
    assert (decision.state, decision.needs_server_abort) == (JobState.ABORTED, False)

    assigned = enqueue(db, settings, clock, "a", net="net-a").job_id
    with db.begin() as session:
        claims.claim_next_job(session, settings, clock())
    with db.begin() as session:
        decision = records.abort_job(session, assigned, "user", clock())
    assert (decision.state, decision.needs_server_abort) == (JobState.ABORTED, False)

    running = enqueue(db, settings, clock, "r", net="net-a").job_id
    with db.begin() as session:
        claims.claim_next_job(session, settings, clock())
        session.get(Job, running).start_dispatch(clock())
    with db.begin() as session:
        decision = records.abort_job(session, running, "user", clock())
    assert (decision.state, decision.needs_server_abort) == (JobState.ABORTING, True)


def test_report_job_status(db, settings, clock):
    job_id = enqueue(db, settings, clock, net="net-a").job_id
    with pytest.raises(InvalidRequest), db.begin() as session:
        records.report_job_status(
            session, ReportJobStatus(job_id=job_id, status=ReportedStatus.ERROR), clock()
        )
    with db.begin() as session:
        state = records.report_job_status(
            session, ReportJobStatus(job_id=job_id, status=ReportedStatus.STOPPED), clock()
        )
    assert state == JobState.ABORTED
    with pytest.raises(NotFound), db.begin() as session:
        records.report_job_status(
            session, ReportJobStatus(job_id=uuid.uuid4(), status=ReportedStatus.STOPPED), clock()
        )
