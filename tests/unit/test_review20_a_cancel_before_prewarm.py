"""Review round 20 (A): a `cancel_prewarm` handled before its prewarm is lost.

tasks/README.md promises, for all five requests (prewarm and cancel_prewarm named): "the
request is carried out, or refused and recorded, exactly as if it had been handled at once,
whatever the dispatcher's database does meanwhile". flip-api sends a prewarm, then its
cancel (the user left the page); the prewarm meets a database blip and is retried with
backoff while the cancel, handled meanwhile, finds no prewarm: it is answered "rejected" and
recorded nowhere. The prewarm's retry then starts the server and holds it for `within_s`
(up to PREWARM_MAX_S) + the idle grace, as if the cancel had never been sent. An abort that
overtakes its enqueue is kept for it (`early_aborts`); a cancel that overtakes its prewarm
is not.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import pytest
from celery.exceptions import Retry
from sqlalchemy import create_engine

from app import names
from app.db import session_factory
from app.usecases import prewarm
from tasks import base
from tasks.registered import TASKS

KEY = "hint-late"
HINT = {"caller_key": KEY, "net": "net-a", "within_s": 600}


@pytest.fixture
def rt(world):
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


@contextmanager
def database_unreachable(world):
    """The world's database refuses every connection (a real driver error), until the end."""
    working = world.rt.sessions
    world.rt.sessions = session_factory(create_engine("sqlite:////no/such/folder/fl.db"))
    try:
        yield
    finally:
        world.rt.sessions = working


def test_a_cancel_handled_while_its_prewarm_waits_out_a_database_blip_still_ends_the_hold(rt):
    # 1. The prewarm's first delivery meets the database down: kept, retried later.
    with (
        database_unreachable(rt),
        mock.patch.object(TASKS[names.PREWARM], "retry", side_effect=Retry()),
        pytest.raises(Retry),
    ):
        TASKS[names.PREWARM].run(payload=HINT)
    # 2. The cancel flip-api sent after it is handled first, the database back.
    TASKS[names.CANCEL_PREWARM].run(payload={"caller_key": KEY})
    # 3. The prewarm's retry.
    TASKS[names.PREWARM].run(payload=HINT)
    with rt.rt.sessions() as session:
        view = prewarm.get_prewarm(session, KEY, rt.rt.clock())
    # Handled in the order sent, the hold would have ended "cancelled"; here it holds the
    # net (its server started for nobody) until its deadline.
    assert view.status == "cancelled", (view.status, view.detail, rt.net("net-a").state)
