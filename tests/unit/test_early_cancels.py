"""A `cancel_prewarm` handled before its prewarm (tasks/README.md "Prewarm", **Cancellable**;
app.usecases.prewarm.early_cancels): kept for REJECTED_RETENTION_S, and the prewarm that
comes under its key is recorded ended `cancelled` at once, its net never started; the
review's reproduction (the prewarm retried through a database blip) is the last test."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from celery.exceptions import Retry
from sqlalchemy import select

from app import names
from app.errors import NotFound, RequestRejected
from app.schemas import EnqueueJob
from app.usecases import intake, prewarm
from models import EarlyCancel, NetState, Prewarm
from tasks import base
from tasks.registered import TASKS
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, database_unreachable, world_of

HINT = {"caller_key": "hint-1", "net": "net-a", "within_s": 600}
KEPT = re.compile(
    r"no prewarm with caller_key 'hint-1'; the cancel is kept until (\S+) for a prewarm of "
    r"this key"
)


@pytest.fixture
def pw(tmp_path, job_root, sqlite_factory, clock) -> Iterator[World]:
    nets = [net_decl(tmp_path, "net-a", "ecs", idle_timeout_s=60, ready_timeout_s=120)]
    world = world_of(nets, tmp_path, job_root, sqlite_factory, clock)
    base.set_runtime(world.rt)
    yield world
    base.set_runtime(None)


def _cancel(key: str = "hint-1") -> dict[str, Any]:
    answer: dict[str, Any] = TASKS[names.CANCEL_PREWARM].run(payload={"caller_key": key})
    return answer


def _prewarm(payload: dict[str, Any] = HINT) -> dict[str, Any]:
    answer: dict[str, Any] = TASKS[names.PREWARM].run(payload=payload)
    return answer


def _kept(pw: World) -> list[tuple[str, str, str]]:
    with pw.rt.sessions() as session:
        return [
            (c.caller_key, c.asked_at.isoformat(), c.kept_until.isoformat())
            for c in session.scalars(select(EarlyCancel).order_by(EarlyCancel.caller_key))
        ]


def _kept_until(answer: dict[str, Any]) -> str:
    """The answer keeps its one key, `rejected`, and says until when the cancel is kept."""
    assert set(answer) == {"rejected"}, answer
    found = KEPT.fullmatch(str(answer["rejected"]))
    assert found is not None, answer
    return found.group(1)


def _warm_ups(pw: World) -> list[dict[str, object]]:
    return [kwargs for task, kwargs in pw.outbox.sent if task == names.WARM_UP]


def test_a_prewarm_after_its_cancel_is_recorded_cancelled_and_starts_nothing(pw):
    asked = pw.clock()
    until = _kept_until(_cancel())
    assert until == (asked + timedelta(seconds=pw.rt.settings.rejected_retention_s)).isoformat()
    assert _kept(pw) == [("hint-1", asked.isoformat(), until)]
    pw.clock.advance(3)
    answer = _prewarm()
    assert answer["status"] == "cancelled" and answer["created"] is True
    assert answer["ended_at"] == pw.clock().isoformat()
    assert str(answer["detail"]).startswith(
        f"cancelled before it came: a cancel for its key was handled at {asked.isoformat()}"
    )
    assert pw.net("net-a").state == NetState.STOPPED and _warm_ups(pw) == []
    assert _kept(pw) == []  # carried out: deleted in the prewarm's transaction
    # flip-api's repeat of the prewarm names the same (ended) prewarm and starts nothing.
    again = _prewarm()
    assert again["status"] == "cancelled" and again["created"] is False
    assert pw.net("net-a").state == NetState.STOPPED and _warm_ups(pw) == []
    # The cancel again (its retry): the prewarm exists now, so it is answered as any cancel.
    assert _cancel()["status"] == "cancelled"


def test_a_repeated_cancel_before_the_prewarm_is_kept_once_until_the_first_one_s_time(pw):
    first = _kept_until(_cancel())
    pw.clock.advance(30)
    assert _kept_until(_cancel()) == first  # a retry, or flip-api's own repeat
    assert [(k, u) for k, _, u in _kept(pw)] == [("hint-1", first)]
    assert _prewarm()["status"] == "cancelled"
    assert _kept(pw) == [] and _warm_ups(pw) == []


def test_a_prewarm_after_its_kept_cancel_expired_is_accepted_as_any(pw):
    until = _kept_until(_cancel())
    pw.clock.advance(pw.rt.settings.rejected_retention_s + 1)
    assert pw.clock().isoformat() > until
    answer = _prewarm()
    assert answer["status"] == "warming" and answer["created"] is True
    assert pw.net("net-a").state == NetState.STARTING
    assert _warm_ups(pw) == [{"net_name": "net-a"}]
    assert _kept(pw) == []  # the expired one is gone with it


@pytest.mark.parametrize(
    "refused",
    [
        {"caller_key": "hint-1", "net": "net-a"},  # no within_s: refused by the payload's check
        {"caller_key": "hint-1", "net": "net-z", "within_s": 600},  # refused by the use case
    ],
    ids=["bad-payload", "unknown-net"],
)
def test_a_refused_prewarm_after_a_kept_cancel_is_still_refused_and_spends_it(pw, refused):
    _kept_until(_cancel())
    answer = _prewarm(refused)
    assert answer["reason_code"] == "rejected" and "refused" in answer
    with pw.rt.sessions() as session, pytest.raises(RequestRejected):
        prewarm.get_prewarm(session, "hint-1", pw.clock())
    # The kept cancel was for the prewarm sent before it, now refused (handled in order, the
    # cancel would have found the refusal): spent, so a corrected prewarm is a new request.
    assert _kept(pw) == []
    assert "refused at" in str(_cancel()["rejected"])
    assert _prewarm()["status"] == "warming" and _warm_ups(pw) == [{"net_name": "net-a"}]


def test_a_kept_cancel_prunes_the_ones_past_their_time(pw):
    _kept_until(_cancel())
    pw.clock.advance(pw.rt.settings.rejected_retention_s + 1)
    later = _cancel("hint-2")
    assert set(later) == {"rejected"} and "hint-2" in str(later["rejected"])
    assert [k for k, _, _ in _kept(pw)] == ["hint-2"]


def test_a_job_under_the_same_key_string_is_not_the_prewarm(pw):
    """Prewarm keys are their own namespace: a job stored under "hint-1" does not stop the
    cancel from being kept, nor its prewarm from being cancelled by it."""
    intake.submit_job(pw.rt, EnqueueJob(caller_key="hint-1", definition="tiny-job", net="net-a"))
    _kept_until(_cancel())
    assert _prewarm()["status"] == "cancelled"


def test_only_the_task_keeps_a_cancel_the_http_route_and_the_cli_say_not_found_at_once(pw):
    """As `abort_job` alone keeps an abort: a person at the CLI, or an HTTP caller, is told
    at once (404) and nothing is kept; the prewarm that comes after is held."""
    with pytest.raises(NotFound) as missing:
        prewarm.cancel_prewarm(pw.rt, "hint-1")
    assert str(missing.value) == "no prewarm with caller_key 'hint-1'"
    assert _kept(pw) == []
    assert _prewarm()["status"] == "warming"
    with pw.rt.sessions() as session:
        assert session.scalar(select(Prewarm.outcome).where(Prewarm.caller_key == "hint-1")) is None


def test_a_cancel_handled_while_its_prewarm_waits_out_a_database_blip_still_ends_the_hold(pw):
    """(Review 20) tasks/README.md, for every request: "carried out, or refused and recorded,
    exactly as if it had been handled at once, whatever the dispatcher's database does
    meanwhile". flip-api's prewarm meets the database down and is retried later; its cancel,
    sent after it, is handled first: the retried prewarm ends cancelled, its net not
    started (it held the net for within_s plus the idle grace)."""
    with (
        database_unreachable(pw),
        mock.patch.object(TASKS[names.PREWARM], "retry", side_effect=Retry()),
        pytest.raises(Retry),
    ):
        _prewarm()
    _cancel()
    _prewarm()
    with pw.rt.sessions() as session:
        view = prewarm.get_prewarm(session, "hint-1", pw.rt.clock())
    assert view.status == "cancelled", (view.status, view.detail, pw.net("net-a").state)
    assert pw.net("net-a").state == NetState.STOPPED
