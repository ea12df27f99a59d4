"""Adversarial review 2 (contract, burst, beat lock): each test is one defect found, failing
on main until it is fixed."""

from __future__ import annotations

import base64
import uuid

import pytest

from app import names
from app.errors import InvalidRequest
from app.schemas import EnqueueJob
from app.usecases import enqueue, views
from tests.fixtures.db import net_decl
from tests.unit.conftest import world_of

API_KEY = "review2-secret"


@pytest.fixture
def api_world(tmp_path, job_root, sqlite_factory, clock):
    nets = [net_decl(tmp_path, "net-a", "ecs"), net_decl(tmp_path, "fixed", "static")]
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, API_SECRET=API_KEY)


def _enqueue(world, key: str, **kw):
    with world.rt.sessions.begin() as session:
        return enqueue.enqueue_job(
            session,
            world.rt.settings,
            EnqueueJob(caller_key=key, definition="tiny-job", **kw),
            world.clock(),
        )


def test_repeat_with_max_attempts_spelled_out_as_its_default_is_the_same_request(world) -> None:
    """Scenario: flip-api enqueues {caller_key, definition, net} (max_attempts omitted, so
    MAX_ATTEMPTS=3); its retry spells the default out, max_attempts=3: the very job it names.
    Promise (README Task API): "a repeat with the same payload (defaults filled in) returns
    the same job". Here the retry is refused 409 caller_key_conflict (the digest fills in the
    schema's null, not the setting it stands for; the message lists no differing field)."""
    first = _enqueue(world, "k-defaults", net="net-a")
    again = _enqueue(world, "k-defaults", net="net-a", max_attempts=world.rt.settings.max_attempts)
    assert (again.job_id, again.created) == (first.job_id, False)


def test_repeat_with_the_nets_default_sites_spelled_out_is_the_same_request(world) -> None:
    """Scenario: an enqueue for net-a omits required_sites (so the net's site-1, site-2);
    the retry sends required_sites=[site-2, site-1], the very sites the job has.
    Promise (README Task API): "defaults filled in, sites in any order" names the same job;
    here it is a 409 caller_key_conflict, with no differing field named."""
    first = _enqueue(world, "k-sites", net="net-a")
    again = _enqueue(world, "k-sites", net="net-a", required_sites=["site-2", "site-1"])
    assert (again.job_id, again.created) == (first.job_id, False)


def test_a_crafted_cursor_without_a_zone_is_a_400_not_a_crash(world) -> None:
    """Scenario: GET /jobs?cursor=<base64 of '2026-01-01T00:00:00|<uuid>'> (no zone offset).
    Promise (cursor pagination, app/usecases/views.py): a cursor this API did not return is
    InvalidRequest (400); here the naive datetime reaches UTCDateTime's bind and raises
    (StatementError -> 500)."""
    world.enqueue("k-page", net="net-a")
    raw = f"2026-01-01T00:00:00|{uuid.uuid4()}"
    cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    with world.rt.sessions() as session, pytest.raises(InvalidRequest):
        views.page_jobs(session, None, 10, cursor=cursor)


def test_readmes_event_mapping_keeps_the_job_on_a_caller_key_conflict() -> None:
    """Scenario: flip-api reuses a caller_key with another payload; the dispatcher sends a
    `kind: "rejected"` event whose job_id is the EXISTING (maybe running) job's id, with
    reason_code caller_key_conflict. A receiver built from README's event-to-FLIP table reads
    `kind: "rejected"` -> ERROR / COMPLETED and marks that live job's model ERROR.
    Promise (reason codes, models/reasons.py): caller_key_conflict leaves flip-api's statuses
    unchanged. Fix: the README row must say "ERROR/COMPLETED for reason_code rejected;
    unchanged for caller_key_conflict" (better: generate that row from REASONS too)."""
    from pathlib import Path

    from models.reasons import REASONS, ReasonCode

    assert REASONS[ReasonCode.CALLER_KEY_CONFLICT].flip[None].model_status is None
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith('| `kind: "rejected"`'))
    assert "caller_key_conflict" in row or "unchanged" in row, row


def test_a_standby_beats_heartbeat_does_not_vouch_for_a_stalled_active_beat(
    tmp_path, monkeypatch
) -> None:
    """Scenario: two beats share a data folder (FileLock's own case: SQLite, one machine; or
    compose's beat-data volume with a second replica). The active one, holding the lock,
    stalls (a hung broker send) at t=0; the standby ticks every second and rewrites the same
    beat-heartbeat.json with "active": false. `fl-dispatcher ready --beat-ticked-within 60`
    reads only the file's age, so at t=100 it reports the beat ticking: the hung holder is
    never restarted, the standby never gets the lock, and no beat round (the cover of a lost
    kick) runs. Promise ("Run exactly one beat": the heartbeat proves the scheduler is
    ticking; "Queues and kicks": beat's round within one interval). Fix: only the active
    beat writes the shared heartbeat (or heartbeat_age_s ignores "active": false / the file
    is per process), so the check fails for the holder that stopped ticking."""
    from app import beat

    path = tmp_path / beat.HEARTBEAT_FILE
    holder = beat.FileLock(tmp_path / "beat.lock")
    assert holder.hold()
    beat.write_heartbeat(path, active=True, now=0.0)  # the holder's last tick, then it hangs

    standby = object.__new__(beat.SingleBeatScheduler)
    standby._beat_lock = beat.FileLock(tmp_path / "beat.lock")
    standby._heartbeat = path
    standby._active = False
    standby._beat_id = "standby"
    monkeypatch.setattr(beat.time, "time", lambda: 100.0)
    assert standby.tick() == beat.STANDBY_POLL_S  # standing by: the holder has the lock
    age = beat.heartbeat_age_s(path, 101.0)
    holder.release()
    assert age is None or age > 60, f"the stalled beat looks like it ticked {age:.0f}s ago"


def test_an_invalid_repeat_of_a_live_jobs_caller_key_is_a_conflict_not_a_rejection(
    world,
) -> None:
    """Scenario: job k-live is QUEUED (or RUNNING); flip-api sends enqueue_job again with the
    same caller_key and another payload that also fails the schema (priority 5000). Schema
    validation runs before the key lookup, so it is recorded and pushed as reason_code
    `rejected` with job_id = the live job's id, and REASONS maps `rejected` to ERROR /
    COMPLETED: a receiver following the reason table ends the live job's model in ERROR.
    Promise (Task API): the same caller_key with a different payload creates nothing and
    changes nothing: caller_key_conflict, "that job is unchanged (keep its status)". Fix: in
    the task (and POST /jobs), when the payload's caller_key is usable and names an existing
    job, refuse any payload that is not its repeat as caller_key_conflict, validation
    error included in the reason."""
    from models.reasons import REASONS, ReasonCode
    from tasks import base
    from tasks.registered import TASKS

    live = world.enqueue("k-live", net="net-a")
    base.set_runtime(world.rt)
    try:
        answer = TASKS[names.ENQUEUE_JOB].run(
            payload={
                "caller_key": "k-live",
                "definition": "tiny-job",
                "net": "net-a",
                "priority": 5000,
            }
        )
    finally:
        base.set_runtime(None)
    assert world.job(live).state.value == "QUEUED"
    code = ReasonCode(answer["reason_code"])
    assert REASONS[code].flip[None].model_status is None, (
        f"a refused repeat of live job {live} goes out as {code}: flip-api sets "
        f"{REASONS[code].flip[None]}"
    )
