"""The metrics the alert rules need beyond the lifecycle ones: how long each idle net has
been up for nothing against its grace, and when beat's reconcile last finished a round."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.db import unit_of_work
from app.entrypoints.api import create_app
from app.metrics.read import read_snapshot
from app.runtime import RecordingOutbox, Runtime
from app.usecases import reconciler
from tests.fixtures.day import build_day, day_settings


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_idle_time_and_grace_per_net_from_the_api(tmp_path, job_root, sqlite_factory, clock):
    settings = day_settings(tmp_path, job_root)
    build_day(sqlite_factory, clock())
    runtime = Runtime(
        settings=settings,
        engine=sqlite_factory.kw["bind"],
        sessions=sqlite_factory,
        clock=clock,
        outbox=RecordingOutbox(),
    )
    text = TestClient(create_app(runtime)).get("/metrics").text
    # net-b (always on) has been READY without a job since 05:00:01, and has no grace;
    # net-a is BUSY and net-c MISCONFIGURED: not idle.
    assert samples(text, "fl_dispatcher_net_idle_seconds") == {
        (("net", "net-a"),): 0.0,
        (("net", "net-b"),): 7 * 3600.0 - 1,
        (("net", "net-c"),): 0.0,
    }
    assert samples(text, "fl_dispatcher_net_idle_grace_seconds") == {
        (("net", "net-a"),): 600.0,
        (("net", "net-c"),): 900.0,
    }


def test_reconcile_records_its_round_for_the_beat_alert(world):
    def last_runs():
        with unit_of_work(world.rt.sessions) as session:
            return read_snapshot(session, world.clock()).housekeeping_last_run

    assert last_runs() == {}  # no round yet: the series is absent (the rule's absent() case)
    reconciler.reconcile(world.rt)
    first = world.clock()
    assert last_runs() == {"reconcile": first.timestamp()}
    world.clock.advance(30)
    reconciler.reconcile(world.rt)
    assert last_runs() == {"reconcile": (first + timedelta(seconds=30)).timestamp()}
