"""Two copies of one refused enqueue message handled at the same moment on PostgreSQL (READ
COMMITTED): a duplicate delivery, or a redelivery while the first copy's worker is still
committing. The refusal is one row, keyed by the message's task id, with or without a
caller_key: the second copy waits on the first's lock (an advisory lock on the key, else on
the message id), then finds its row."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select, text

from app import names
from app.handlers import HANDLERS
from app.runtime import RecordingOutbox
from app.usecases import declared_nets, enqueue
from models import RefusedMessage
from tests.fakes import fake_runtime

pytestmark = pytest.mark.integration

TASK_ID = "0c4f1a2b-7d3e-4f5a-9b8c-1d2e3f4a5b6c"
_WAITING = text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


@pytest.fixture
def rt(pg_factory, settings, clock):
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    return fake_runtime(settings, pg_factory, clock, RecordingOutbox())


def test_two_copies_of_one_keyless_refused_message_at_once_are_one_refusal(
    rt, pg_factory, settings, clock
):
    """The first copy has stored its refusal, not committed yet; the second copy (its own
    look finding nothing committed) waits on the message id's lock until the first commits,
    then finds that row: one row, one `rejected` event."""
    payload = {"definition": "tiny-job", "net": "nope"}  # no caller_key
    first = pg_factory()
    enqueue.record_rejection(first, None, "unknown net 'nope'", clock(), 3600.0, message_id=TASK_ID)
    handler = HANDLERS[names.ENQUEUE_JOB]
    answers: list[object] = []
    second = threading.Thread(
        target=lambda: answers.append(
            handler.call(rt, **handler.kwargs({"payload": payload}, TASK_ID))
        )
    )
    second.start()
    deadline = time.monotonic() + 5
    waited = False
    while second.is_alive() and time.monotonic() < deadline:
        with pg_factory() as session:
            if session.scalar(_WAITING):
                waited = True
                break
        time.sleep(0.02)
    first.commit()
    first.close()
    second.join(10)
    assert waited and answers
    with pg_factory() as session:
        rows = session.scalars(select(RefusedMessage.message_id)).all()
    assert rows == [TASK_ID]
