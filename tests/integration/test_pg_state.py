"""The SQL guarantees, on the machine's real PostgreSQL with committed rows and real
concurrent connections."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, make_url, select, text
from sqlalchemy.exc import IntegrityError

from app import names
from app.db import make_engine
from app.schemas import EnqueueJob, PrewarmNet
from app.settings import Settings
from app.usecases import claims, declared_nets, prewarm, records
from app.usecases import enqueue as enqueue_uc
from app.usecases.prewarm import warm_up as prewarm_warm_up
from models import Job, JobState, Net, NetState, Prewarm, PrewarmOutcome
from tests.fixtures.db import PG_ADMIN_URL, fresh_pg_database, net_decl
from tests.unit.conftest import World

pytestmark = pytest.mark.integration


@pytest.fixture
def db(pg_factory, settings, clock):
    with pg_factory.begin() as session:
        declared_nets.sync_nets(session, settings, clock())
    return pg_factory


def enqueue(db, settings, clock, key, **kw):
    with db.begin() as session:
        return enqueue_uc.enqueue_job(
            session,
            settings,
            EnqueueJob(caller_key=key, definition="tiny-job", required_sites=["s"], **kw),
            clock(),
        ).job_id


def race(db, settings, clock, n=2, hold_locks=True):
    """Open n transactions that each claim, hold their locks until all have claimed, then
    commit: a real overlap, not two claims one after the other. `hold_locks=False`: each
    commits as soon as it has claimed, for claims that may UPDATE one row (the second waits
    for the first's commit, which a barrier after the claims would turn into a deadlock)."""
    barrier = threading.Barrier(n, timeout=10)
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def claim(i: int) -> None:
        try:
            with db.begin() as session:
                session.execute(text("SELECT 1"))
                barrier.wait()  # both transactions are open
                results[i] = claims.claim_next_job(session, settings, clock())
                if hold_locks:
                    barrier.wait()  # both have claimed while holding their row locks
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_two_claimers_racing_for_one_job_get_one_winner(db, settings, clock):
    job_id = enqueue(db, settings, clock, "only")
    results = race(db, settings, clock)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert winners[0].job_id == job_id
    with db() as session:
        assert session.get(Job, job_id).state == JobState.ASSIGNED


def test_two_jobs_racing_for_one_net_one_assigned_other_queued(db, settings, clock):
    first = enqueue(db, settings, clock, "a", net="net-a")
    second = enqueue(db, settings, clock, "b", net="net-a")
    results = race(db, settings, clock)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    with db() as session:
        assert {session.get(Job, first).state, session.get(Job, second).state} == {
            JobState.ASSIGNED,
            JobState.QUEUED,
        }
        assert session.get(Net, "net-a").state == NetState.STARTING


def test_many_claimers_many_jobs_each_net_gets_at_most_one(db, settings, clock):
    ids = [enqueue(db, settings, clock, f"j{i}") for i in range(5)]
    results = race(db, settings, clock, n=4)
    winners = [r for r in results if r is not None]
    assert len(winners) == 2  # two nets
    assert len({w.net_name for w in winners}) == 2
    assert len({w.job_id for w in winners}) == 2
    with db() as session:
        assigned = session.scalars(select(Job).where(Job.state == JobState.ASSIGNED)).all()
        assert {j.id for j in assigned} <= set(ids)
        assert len(assigned) == 2


def test_one_active_job_per_net_is_enforced_by_the_database(db, settings, clock, pg_engine):
    enqueue(db, settings, clock, "a", net="net-a")
    with db.begin() as session:
        claims.claim_next_job(session, settings, clock())
    # Bypass the application entirely: a raw INSERT of a second active job on net-a.
    with pytest.raises(IntegrityError, match="uq_jobs_one_active_per_net"), pg_engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, caller_key, definition, required_sites, net_name, "
                "priority, state, attempts, max_attempts, created_at, state_changed_at, version)"
                " VALUES (:id, 'raw', 'x', '[]', 'net-a', 0, 'RUNNING', 0, 3, now(), now(), 1)"
            ),
            {"id": uuid.uuid4()},
        )
    # A finished job on the same net is fine: only active states count.
    with pg_engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, caller_key, definition, required_sites, net_name, "
                "priority, state, attempts, max_attempts, created_at, state_changed_at, version)"
                " VALUES (:id, 'raw2', 'x', '[]', 'net-a', 0, 'COMPLETED', 0, 3, now(), now(), 1)"
            ),
            {"id": uuid.uuid4()},
        )


def test_enqueue_same_caller_key_twice_concurrently_returns_one_job(db, settings, clock):
    barrier = threading.Barrier(2, timeout=10)
    results: list[object] = [None, None]

    def go(i: int) -> None:
        with db.begin() as session:
            session.execute(text("SELECT 1"))
            barrier.wait()
            results[i] = enqueue_uc.enqueue_job(
                session,
                settings,
                EnqueueJob(caller_key="same", definition="tiny-job", required_sites=["s"]),
                clock(),
            )

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0].job_id == results[1].job_id
    assert sorted([results[0].created, results[1].created]) == [False, True]
    with db() as session:
        assert len(session.scalars(select(Job)).all()) == 1


def _until_a_backend_waits_on_a_lock(factory, deadline_s: float = 20.0) -> None:
    """Returns once another connection of this database waits on a row lock."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with factory() as session:
            waiting = session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
            )
        if waiting:
            return
        time.sleep(0.02)  # polling the condition, not a fixed wait
    raise AssertionError("the second transaction never waited on the first one's rows")


def test_two_first_requests_creating_a_new_nets_rows_at_once_both_succeed(
    pg_factory, settings, clock
):
    """After a deploy that adds a net, two requests (or two starting workers) both find its
    row missing: the second insert waits on the first's uncommitted row, then must not
    fail on its key (an IntegrityError, answered 503), since the row it wanted is there."""
    inserted = threading.Event()
    errors: list[BaseException] = []

    def second() -> None:
        inserted.wait(10)
        try:
            with pg_factory.begin() as session:
                declared_nets.ensure_net_rows(session, settings, clock())
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    with pg_factory.begin() as session:
        declared_nets.ensure_net_rows(session, settings, clock())  # inserted, not yet committed
        inserted.set()
        _until_a_backend_waits_on_a_lock(pg_factory)
    thread.join(10)
    assert not thread.is_alive()
    assert errors == []
    with pg_factory() as session:
        assert sorted(session.scalars(select(Net.name))) == ["net-a", "net-b"]


def test_a_stale_writer_cannot_overwrite_a_newer_state(db, settings, clock):
    job_id = enqueue(db, settings, clock, "v")
    with db() as stale:
        stale_job = stale.get(Job, job_id)
        with db.begin() as fresh:
            records.abort_job(fresh, job_id, "user", clock())
        stale_job.priority = 9
        with pytest.raises(Exception, match="expected to update 1 row"):
            stale.commit()


def test_a_refused_enqueue_whose_words_cannot_be_stored_is_recorded_on_postgresql(
    db, settings, clock
):
    # PostgreSQL's text refuses NUL and has no form for a lone surrogate: the refusal of
    # such a payload was itself lost (psycopg DataError). It is kept escaped.
    from app.usecases import intake
    from models import RejectedRequest
    from tests.unit.conftest import World

    world = World(settings, db, clock)
    intake.record_refusal(world.rt, "bad\x00key\ud800", "caller_key: bad \x00 \ud800")
    with db() as session:
        row = session.scalars(select(RejectedRequest)).one()
    assert (row.caller_key, row.job_id) == ("bad\\x00key\\ud800", None)
    assert row.reason == "caller_key: bad \\x00 \\ud800"


def test_a_payload_postgresql_cannot_store_is_refused_before_it_reaches_it(db, settings, clock):
    from pydantic import ValidationError
    from sqlalchemy.exc import DataError

    from app.schemas import ReportedStatus, ReportJobStatus

    with pytest.raises(ValidationError, match="NUL"):
        ReportJobStatus(job_id=uuid.uuid4(), status=ReportedStatus.STOPPED, detail="a\x00b")
    # What the check spares: the report's words go into the history, a text column.
    job_id = enqueue(db, settings, clock, "k")
    unchecked = ReportJobStatus.model_construct(
        job_id=job_id, status=ReportedStatus.STOPPED, detail="a\x00b"
    )
    with pytest.raises(DataError, match="0x00"), db.begin() as session:
        records.report_job_status(session, unchecked, clock())
        session.flush()


def test_a_hinted_job_and_an_older_one_claimed_at_once_end_its_hold_once(db, settings, clock):
    """Two claimers at once: one takes the older job onto the held net (ending the hold
    there, claims._use_holds), the other the job that names the hold onto the other net
    (ending it by its key, claims._end_named_hold). Both UPDATE the one prewarm row: the
    second waits for the first and then finds it ended, so the hold ends once, with no
    deadlock and no error. (Which claimer takes which job depends on timing: each commits
    as soon as it has claimed, so a claimer blocked on the row waits for the other's commit.)"""
    from app.schemas import PrewarmNet
    from app.usecases import prewarm
    from models import Prewarm, PrewarmOutcome
    from tests.unit.conftest import World

    world = World(settings, db, clock)
    prewarm.request_prewarm(world.rt, PrewarmNet(caller_key="hint", net="net-a", within_s=120))
    older = enqueue(db, settings, clock, "older")
    hinted = enqueue(db, settings, clock, "hinted", prewarm_key="hint")
    results = race(db, settings, clock, hold_locks=False)
    assert {r.job_id for r in results if r is not None} == {older, hinted}
    with db() as session:
        row = session.scalars(select(Prewarm).where(Prewarm.caller_key == "hint")).one()
        assert row.outcome == PrewarmOutcome.USED
        assert row.job_id in {older, hinted}


def pause_after_named_hold(monkeypatch, claimers):
    """Each claim, once it has ended the hold its job names, waits for the others to get
    there too (a barrier between the claim's two steps), so that no claim ends the holds on
    its own net first. A broken barrier: another claim waits on a lock this one holds, so
    this one goes on."""
    all_named = threading.Barrier(claimers, timeout=2)
    end_named = claims._end_named_hold

    def end_named_then_wait(*args, **kwargs):
        end_named(*args, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):
            all_named.wait()

    monkeypatch.setattr(claims, "_end_named_hold", end_named_then_wait)


def test_two_claims_ending_each_others_holds_do_not_deadlock(db, settings, clock, monkeypatch):
    """net-a is held for key ka, net-b for kb; a job pinned to net-a names kb, one pinned to
    net-b names ka. Each claim ends the hold its job names, then the holds on its own net:
    unordered, claimer A would lock kb's row then ka's while B locks ka's then kb's, and
    PostgreSQL would kill one claim as a deadlock. Both claims lock their holds in one order
    first, so the second waits for the first and both succeed."""
    from app.schemas import PrewarmNet
    from app.usecases import prewarm
    from models import Prewarm, PrewarmOutcome
    from tests.unit.conftest import World

    world = World(settings, db, clock)
    for key, net in (("ka", "net-a"), ("kb", "net-b")):
        prewarm.request_prewarm(world.rt, PrewarmNet(caller_key=key, net=net, within_s=120))
    one = enqueue(db, settings, clock, "one", net="net-a", prewarm_key="kb")
    two = enqueue(db, settings, clock, "two", net="net-b", prewarm_key="ka")
    # Both claims end their named hold before either ends the holds on its net: the
    # interleaving that crosses the two locks.
    pause_after_named_hold(monkeypatch, claimers=2)
    results = race(db, settings, clock, hold_locks=False)
    assert {r.job_id for r in results if r is not None} == {one, two}
    with db() as session:
        rows = session.scalars(select(Prewarm)).all()
        assert {row.outcome for row in rows} == {PrewarmOutcome.USED}


def run_together(*targets):
    """Run each in a thread of its own, all at once, and wait for all."""
    threads = [threading.Thread(target=target) for target in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def waiting_on_a_lock(db, timeout_s=10.0):
    """Return once another connection to the test's database waits for a lock (so the
    caller, which holds it, can go on); fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    query = text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while time.monotonic() < deadline:
        with db() as session:
            if session.scalar(query):
                return
        time.sleep(0.02)
    pytest.fail("no connection came to wait for a lock")


def test_three_claims_ending_each_others_holds_in_a_ring_do_not_deadlock(
    db, tmp_path, job_root, clock, monkeypatch
):
    """Three holds, three jobs each pinned to one net and naming the next net's hold: unordered,
    the three claims would lock the rows in a ring (a three-way deadlock); in id order they
    queue behind one another."""
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        JOB_ROOT=job_root,
        NETS=json.dumps([net_decl(tmp_path, n) for n in ("net-a", "net-b", "net-c")]),
    )
    world = World(settings, db, clock)
    for key, net in (("ka", "net-a"), ("kb", "net-b"), ("kc", "net-c")):
        prewarm.request_prewarm(world.rt, PrewarmNet(caller_key=key, net=net, within_s=120))
    jobs = {
        enqueue(db, settings, clock, "one", net="net-a", prewarm_key="kb"),
        enqueue(db, settings, clock, "two", net="net-b", prewarm_key="kc"),
        enqueue(db, settings, clock, "three", net="net-c", prewarm_key="ka"),
    }
    pause_after_named_hold(monkeypatch, claimers=3)
    results = race(db, settings, clock, n=3, hold_locks=False)
    assert {r.job_id for r in results if r is not None} == jobs
    with db() as session:
        assert {row.outcome for row in session.scalars(select(Prewarm))} == {PrewarmOutcome.USED}


def test_a_claim_and_a_settling_round_at_once_do_not_deadlock(
    db, settings, clock, monkeypatch, caplog
):
    """The settling round (every scale-down round) locks every open hold in id order. A
    claim that ended the hold its job names (net-b's, the later id) before its own net's
    (net-a's, the earlier) crossed it: PostgreSQL killed the round as a deadlock. Locking
    both first, in id order, the round waits for the claim."""
    world = World(settings, db, clock)
    for key, net in (("ka", "net-a"), ("kb", "net-b")):
        prewarm.request_prewarm(world.rt, PrewarmNet(caller_key=key, net=net, within_s=120))
    one = enqueue(db, settings, clock, "one", net="net-a", prewarm_key="kb")
    named = threading.Event()
    end_named = claims._end_named_hold

    def end_named_then_pause(*args, **kwargs):
        end_named(*args, **kwargs)
        named.set()
        waiting_on_a_lock(db)  # the settling round runs meanwhile, up to a row this holds

    monkeypatch.setattr(claims, "_end_named_hold", end_named_then_pause)
    errors: list[BaseException] = []
    results: list[object] = []

    def claim():
        try:
            with db.begin() as session:
                results.append(claims.claim_next_job(session, settings, clock()))
        except BaseException as exc:
            errors.append(exc)

    def settle():
        named.wait(5)
        prewarm_warm_up.settle_prewarms(world.rt)

    caplog.set_level(logging.ERROR)
    run_together(claim, settle)
    assert not errors, errors
    assert [r.job_id for r in results] == [one]
    assert "settling prewarms failed" not in caplog.text
    with db() as session:
        assert {row.outcome for row in session.scalars(select(Prewarm))} == {PrewarmOutcome.USED}


def test_a_claim_waits_for_a_cancel_in_flight_and_the_hold_stays_cancelled(
    db, settings, clock, monkeypatch
):
    """A cancel holds the hold's row (locked, not yet ended) when a job naming it is claimed
    onto its net: the claim waits for the cancel, then finds the hold ended and claims all
    the same; the hold is cancelled, not used (the cancel came first)."""
    world = World(settings, db, clock)
    prewarm.request_prewarm(world.rt, PrewarmNet(caller_key="ka", net="net-a", within_s=120))
    one = enqueue(db, settings, clock, "one", net="net-a", prewarm_key="ka")
    locked = threading.Event()
    settle = prewarm.settle_row

    def settle_then_pause(*args, **kwargs):
        locked.set()
        waiting_on_a_lock(db)  # the claim runs meanwhile, up to this row
        return settle(*args, **kwargs)

    monkeypatch.setattr(prewarm, "settle_row", settle_then_pause)
    errors: list[BaseException] = []
    out: dict[str, object] = {}

    def cancel():
        try:
            out["cancel"] = prewarm.cancel_prewarm(world.rt, "ka")
        except BaseException as exc:
            errors.append(exc)

    def claim():
        locked.wait(5)
        try:
            with db.begin() as session:
                out["claim"] = claims.claim_next_job(session, settings, clock())
        except BaseException as exc:
            errors.append(exc)

    run_together(cancel, claim)
    assert not errors, errors
    assert out["claim"].job_id == one
    assert out["cancel"].status == "cancelled"
    with db() as session:
        row = session.scalars(select(Prewarm)).one()
        assert (row.outcome, row.job_id) == (PrewarmOutcome.CANCELLED, None)
        assert session.get(Job, one).state == JobState.ASSIGNED


def test_a_nul_in_any_text_a_task_is_sent_is_refused_before_postgresql(db, settings, clock, caplog):
    """The Celery doors (and the CLI's abort) with a NUL in every text a caller sends that
    reaches PostgreSQL: each is a refusal (logged as one WARNING line), never a database
    error; the job is unchanged."""
    from app.errors import InvalidRequest
    from tasks import base
    from tasks.registered import TASKS

    job_id = enqueue(db, settings, clock, "k")
    world = World(settings, db, clock)
    base.set_runtime(world.rt)
    try:
        answers = {
            "abort": TASKS[names.ABORT_JOB].run(payload={"job_id": str(job_id), "reason": "a\x00"}),
            "report": TASKS[names.REPORT_JOB_STATUS].run(
                payload={"job_id": str(job_id), "status": "error", "detail": "a\x00"}
            ),
            "cancel": TASKS[names.CANCEL_PREWARM].run(payload={"caller_key": "a\x00"}),
            "prewarm": TASKS[names.PREWARM].run(
                payload={"caller_key": "a\x00", "net": "net-a", "within_s": 60}
            ),
            "enqueue": TASKS[names.ENQUEUE_JOB].run(
                payload={"caller_key": "k2", "definition": "tiny-job", "prewarm_key": "a\x00"}
            ),
        }
    finally:
        base.set_runtime(None)
    for what, answer in answers.items():
        assert "rejected" in str(answer) or "refused" in str(answer), (what, answer)
    with pytest.raises(InvalidRequest, match="reason holds a NUL"), db.begin() as session:
        records.abort_job(session, job_id, "cli \x00", clock())
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    with db() as session:
        assert session.get(Job, job_id).state == JobState.QUEUED


@pytest.mark.parametrize("task_name", [names.ENQUEUE_JOB, names.PREWARM])
def test_a_request_arriving_before_the_schema_is_migrated_is_retried_on_postgresql(
    db, settings, clock, task_name
):
    """tasks/README.md "What flip-api may rely on": a database that cannot store the request now,
    a schema not yet migrated included (a worker started before `migrate` ran), never lets
    Celery acknowledge it away. On SQLite that is an OperationalError ("no such table"); on
    PostgreSQL, the production database, psycopg raises UndefinedTable, a ProgrammingError."""
    from app.db import make_engine, session_factory
    from app.handlers import HANDLERS, Verdict, on_error
    from tests.fixtures.db import fresh_pg_database

    world = World(settings, db, clock)
    payload = {
        names.ENQUEUE_JOB: {"caller_key": "flip-1", "definition": "tiny-job", "net": "net-a"},
        names.PREWARM: {"caller_key": "hint-1", "net": "net-a", "within_s": 60},
    }[task_name]
    handler = HANDLERS[task_name]
    with fresh_pg_database("fld_unmigrated") as url:
        engine = make_engine(url)
        world.rt.sessions = session_factory(engine)  # the schema is not there yet
        try:
            with pytest.raises(Exception) as failed:
                handler.call(world.rt, payload=payload)
        finally:
            engine.dispose()
    assert on_error(handler, failed.value, 0, settings) is Verdict.RETRY, repr(failed.value)


def test_a_request_reaching_a_read_only_postgresql_during_a_failover_is_retried(
    db, settings, clock, pg_url
):
    """The connection string still names the old primary for a while after a failover (DNS,
    a pooler): it answers reads and refuses every write with SQLSTATE 25006. The request
    cannot be stored now and will be later: tasks/README.md "What flip-api may rely on" says such a
    request is retried, never acknowledged away."""
    from app.db import make_engine, session_factory
    from app.handlers import HANDLERS, Verdict, on_error

    world = World(settings, db, clock)
    handler = HANDLERS[names.ENQUEUE_JOB]
    engine = make_engine(pg_url, connect_args={"options": "-c default_transaction_read_only=on"})
    world.rt.sessions = session_factory(engine)
    try:
        with pytest.raises(Exception) as failed:
            handler.call(
                world.rt,
                payload={"caller_key": "flip-1", "definition": "tiny-job", "net": "net-a"},
            )
    finally:
        engine.dispose()
    assert on_error(handler, failed.value, 0, settings) is Verdict.RETRY, repr(failed.value)


def test_sessions_speak_utc_whatever_the_servers_zone():
    """app.db's PostgreSQL sessions read timestamps in UTC, the zone TZDateTime passes through
    without converting, even on a server (or database) set to another zone."""
    with fresh_pg_database("fld_tz") as url:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(
                text(f"ALTER DATABASE \"{make_url(url).database}\" SET timezone TO 'Asia/Tokyo'")
            )
        admin.dispose()
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "UTC"
                read = conn.exec_driver_sql("SELECT TIMESTAMPTZ '2026-01-01 09:00:00+09'").scalar()
            assert read == datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
            assert read.tzinfo is UTC
        finally:
            engine.dispose()
