"""The shared Celery app as the doors use it: configure() and the outbox's sends."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from app import names
from app.celery_app import CeleryOutbox, beat_schedule, celery_config, configure
from app.settings import Settings


def queued_tasks(broker_db, queue: str = names.QUEUE) -> list[str]:
    with sqlite3.connect(broker_db) as conn:
        rows = conn.execute(
            "SELECT m.payload FROM kombu_message m JOIN kombu_queue q ON m.queue_id = q.id"
            " WHERE q.name = ? ORDER BY m.id",
            (queue,),
        ).fetchall()
    return [json.loads(payload)["headers"]["task"] for (payload,) in rows]


def test_configure_with_another_broker_sends_there(tmp_path):
    # Celery binds its connection pool to the broker of the first send; a process that is
    # configured again (the CLI run twice in one process, tests) must follow the new URL.
    brokers = {name: tmp_path / f"{name}.db" for name in ("a", "b")}
    for name in ("a", "b", "a"):
        settings = Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path, BROKER_URL=f"sqla+sqlite:///{brokers[name]}"
        )
        assert CeleryOutbox(configure(settings)).send(names.ASSIGN_NEXT_JOB) is True
    assert queued_tasks(brokers["a"]) == [names.ASSIGN_NEXT_JOB] * 2
    assert queued_tasks(brokers["b"]) == [names.ASSIGN_NEXT_JOB]


def test_beat_sends_housekeeping_to_its_own_queue_and_the_callback_sweep_with_deliveries(tmp_path):
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path,
        CALLBACK_URL="http://127.0.0.1:9/cb",
        CALLBACK_SECRET="s" * 16,
    )
    queues = {name: e["options"]["queue"] for name, e in beat_schedule(settings).items()}
    assert queues.pop("deliver-callbacks") == names.PIPELINE_QUEUE
    assert set(queues) == {
        "assign-next-job",
        "scale-down-idle-nets",
        "monitor-running-jobs",
        "reconcile",
        "keep-alive-busy-nets",
        "monitor-awaited-runs",
    }
    assert set(queues.values()) == {names.HOUSEKEEPING_QUEUE}


def test_a_chain_and_a_kick_go_to_their_queues_on_the_embedded_broker(tmp_path):
    broker = tmp_path / "broker.db"
    settings = Settings(FL_DISPATCHER_DATA_DIR=tmp_path, BROKER_URL=f"sqla+sqlite:///{broker}")
    outbox = CeleryOutbox(configure(settings))
    outbox.start_pipeline("job-1", "net-a", 0)
    assert outbox.send(names.SETTLE_STRAY_RUNS, net_name="net-a") is True
    assert outbox.send(names.ASSIGN_NEXT_JOB) is True
    assert queued_tasks(broker, names.PIPELINE_QUEUE) == [names.SCALE_UP, names.SETTLE_STRAY_RUNS]
    assert queued_tasks(broker, names.QUEUE) == [names.ASSIGN_NEXT_JOB]
    assert queued_tasks(broker, names.HOUSEKEEPING_QUEUE) == []


def test_a_chain_the_broker_refuses_is_reported_not_raised(tmp_path):
    # A real Celery app whose Redis refuses connections (port 1): `apply_async` raises
    # kombu's OperationalError once its publish retries are spent. An assign round sends
    # the chain after each claim's commit: raised there, it stopped the round (its later
    # claims) over a message the job's step lease re-drives anyway.
    # An app of its own: the shared one (configure) must keep its settings for other tests.
    dead = Celery("dead-broker", broker="redis://127.0.0.1:1/0", set_as_current=False)
    dead.conf.broker_connection_timeout = 1
    dead.conf.task_publish_retry_policy = {"max_retries": 1, "interval_start": 0}
    try:
        outbox = CeleryOutbox(dead)
        assert outbox.start_pipeline("job-1", "net-a", 1) is False
        assert outbox.send(names.ASSIGN_NEXT_JOB) is False
    finally:
        dead.close()


def test_a_worker_without_q_consumes_every_queue(tmp_path):
    config = celery_config(Settings(FL_DISPATCHER_DATA_DIR=tmp_path))
    assert [q.name for q in config["task_queues"]] == list(names.QUEUES)


def _send_what_is_due(scheduler) -> None:
    """Tick until nothing is due now (Celery's tick returns 0 right after each send)."""
    for _ in range(50):
        if scheduler.tick() > 0:
            return
    raise AssertionError("beat kept sending")


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
def test_beat_sends_housekeeping_at_once_after_its_clock_steps_back(
    tmp_path, monkeypatch, restarted
):
    # A host that booted ahead and was corrected by NTP: the last runs, in memory and in the
    # schedule file, lie an hour in the future. Housekeeping must not wait the hour out,
    # neither in the running beat nor in one restarted on the same file.
    from app.beat import SingleBeatScheduler

    broker = tmp_path / "broker.db"
    settings = Settings(
        FL_DISPATCHER_DATA_DIR=tmp_path / "data",
        BROKER_URL=f"sqla+sqlite:///{broker}",
        HOUSEKEEPING_INTERVAL_S="15",
        AWAITED_POLL_S="0",
    )
    app = configure(settings)
    # The current app for the test: schedule entries read back from the schedule file
    # tell the time by Celery's current app, and another test may have made its own one
    # current (its real clock then puts every run "in the future").
    from celery import _state

    monkeypatch.setattr(_state, "default_app", app)
    monkeypatch.setattr(_state._tls, "current_app", app, raising=False)
    clock = {"now": datetime(2026, 3, 1, 13, 0, tzinfo=UTC)}  # an hour ahead
    monkeypatch.setattr(app, "now", lambda: clock["now"])
    schedule_file = str(tmp_path / "celerybeat-schedule")

    def sent() -> int:
        return len(queued_tasks(broker, names.HOUSEKEEPING_QUEUE))

    beat = SingleBeatScheduler(app=app, schedule_filename=schedule_file)
    try:
        clock["now"] += timedelta(seconds=15)
        _send_what_is_due(beat)
        assert sent() >= 3  # assign, scale-down, monitor: one interval after the start

        clock["now"] -= timedelta(hours=1)  # NTP steps the clock back
        if restarted:  # on the schedule file, which holds the runs from the future
            beat.close()
            beat = SingleBeatScheduler(app=app, schedule_filename=schedule_file)
        before = sent()
        _send_what_is_due(beat)
        assert sent() >= before + 3, "beat waits out the clock's step before sending"
    finally:
        beat.close()
