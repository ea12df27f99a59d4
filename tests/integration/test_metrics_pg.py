"""The running totals behind /metrics on PostgreSQL, with real concurrent transactions: a
history row that commits after a later one has been counted is still counted, once, and
scrapes racing each other count every row exactly once."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import func, select

from app.db import unit_of_work
from app.metrics.figures import SCALE_EVENTS
from app.metrics.read import read_snapshot
from models import MetricTotal, Net, NetState, ScaleEvent
from tests.metrics_reference import reference_snapshot

pytestmark = pytest.mark.integration


def _scale_event(outcome: str, clock) -> ScaleEvent:
    return ScaleEvent(
        net_name="net-a", action="scale_up", replicas=1, reason="t", outcome=outcome, at=clock()
    )


@pytest.fixture
def net_a(pg_factory, clock):
    with pg_factory.begin() as session:
        session.add(Net(name="net-a", state=NetState.STOPPED, state_changed_at=clock()))
    return pg_factory


def _scrape(sessions, clock):
    with unit_of_work(sessions) as session:
        return read_snapshot(session, clock())


def test_a_row_committed_after_a_newer_one_was_counted_is_counted(net_a, clock):
    late = net_a()
    late.add(_scale_event("error: late", clock))
    late.flush()  # its id is taken now, below the next row's; it commits last
    with net_a.begin() as session:
        session.add(_scale_event("ok", clock))

    assert _scrape(net_a, clock).scale_events == {("net-a", "scale_up", "ok"): 1}
    late.commit()
    late.close()
    counted = _scrape(net_a, clock).scale_events
    assert counted == {
        ("net-a", "scale_up", "ok"): 1,
        ("net-a", "scale_up", "error"): 1,
    }
    with net_a() as session:
        assert reference_snapshot(session, clock()).scale_events == counted


def test_racing_scrapes_count_every_row_once(net_a, clock):
    with net_a.begin() as session:
        session.add_all(_scale_event("ok", clock) for _ in range(200))
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def scrape_and_add() -> None:
        try:
            start.wait()
            for _ in range(5):
                with net_a.begin() as session:
                    session.add(_scale_event("ok", clock))
                _scrape(net_a, clock)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=scrape_and_add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with net_a() as session:
        rows = session.scalar(select(func.count()).select_from(ScaleEvent))
    assert rows == 220
    assert _scrape(net_a, clock).scale_events == {("net-a", "scale_up", "ok"): 220}


def test_a_long_non_ascii_driver_error_is_counted_by_its_class_and_scrapes_go_on(net_a, clock):
    # The driver's words fill the outcome column (200 characters), each escaped to six in a
    # JSON label: the label must be the outcome's class, never the text.
    words = "error: " + "ошибка драйвера " * 12
    with net_a.begin() as session:
        session.add(_scale_event(words[:200], clock))
        session.add(_scale_event(("misconfigured: " + "配置错误" * 60)[:200], clock))
        session.add(_scale_event("error: throttled", clock))
        session.add(_scale_event("ok", clock))

    counted = _scrape(net_a, clock).scale_events
    assert counted == {
        ("net-a", "scale_up", "error"): 2,
        ("net-a", "scale_up", "misconfigured"): 1,
        ("net-a", "scale_up", "ok"): 1,
    }
    with net_a.begin() as session:
        session.add(_scale_event("error: " + "é" * 193, clock))
    assert _scrape(net_a, clock).scale_events[("net-a", "scale_up", "error")] == 3
    scraped = _scrape(net_a, clock).scale_events
    with net_a() as session:
        assert reference_snapshot(session, clock()).scale_events == scraped


def test_totals_counted_under_the_drivers_words_are_read_as_their_class(net_a, clock):
    # Totals folded before outcomes were classed keep free-text labels: a scrape merges
    # them into the closed set instead of exporting one series per error message.
    with net_a.begin() as session:
        session.add_all(
            MetricTotal(metric=SCALE_EVENTS, labels=json.dumps(labels), value=value)
            for labels, value in [
                (["net-a", "scale_up", "error: throttled"], 2),
                (["net-a", "scale_up", "error: access denied"], 1),
                (["net-a", "scale_up", "misconfigured: no such service"], 1),
                (["net-a", "scale_up", "ok"], 5),
            ]
        )
        session.add(_scale_event("error: throttled", clock))

    assert _scrape(net_a, clock).scale_events == {
        ("net-a", "scale_up", "error"): 4,
        ("net-a", "scale_up", "misconfigured"): 1,
        ("net-a", "scale_up", "ok"): 5,
    }
