"""An enqueue on PostgreSQL inserts without reading first (app.usecases.enqueue): a failed
insert inside its savepoint must leave the transaction usable there too, both when the key
names a job (a repeat) and when the net it names has no row yet (a deploy that added it,
before any worker started)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.schemas import EnqueueJob
from app.usecases import enqueue
from models import Job, JobEvent, Net

pytestmark = pytest.mark.integration


def _enqueue(pg_factory, settings, clock, key: str, **kw):
    request = EnqueueJob(caller_key=key, definition="tiny-job", **kw)
    with pg_factory.begin() as session:
        return enqueue.enqueue_job(session, settings, request, clock())


def test_an_enqueue_before_the_nets_have_rows_creates_them_and_the_job(pg_factory, settings, clock):
    stored = _enqueue(pg_factory, settings, clock, "k", net="net-b")
    assert stored.created
    with pg_factory() as session:
        assert sorted(session.scalars(select(Net.name))) == ["net-a", "net-b"]
        assert session.get(Job, stored.job_id).requested_net == "net-b"


def test_a_repeat_is_answered_by_its_job_and_writes_nothing(pg_factory, settings, clock):
    first = _enqueue(pg_factory, settings, clock, "k", net="net-a")
    again = _enqueue(pg_factory, settings, clock, "k", net="net-a")
    assert (again.job_id, again.created) == (first.job_id, False)
    with pg_factory() as session:
        assert session.scalar(select(func.count()).select_from(JobEvent)) == 1
