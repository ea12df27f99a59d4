"""The nets page (GET /nets) on a realistic day: what the read model derives from the
history, and what the served page says."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from app.entrypoints.api import create_app
from app.entrypoints.nets_page import duration, render
from app.runtime import RecordingOutbox, Runtime
from app.usecases.net_history import Segment, nets_as_declared, nets_overview, timeline
from models import NetState
from tests.fixtures.day import MISCONFIGURED_ERROR, build_day, day_settings

N = NetState


@pytest.fixture
def day(tmp_path, job_root, sqlite_factory, clock):
    settings = day_settings(tmp_path, job_root)
    build_day(sqlite_factory, clock())
    runtime = Runtime(
        settings=settings,
        engine=sqlite_factory.kw["bind"],
        sessions=sqlite_factory,
        clock=clock,
        outbox=RecordingOutbox(),
    )
    return runtime


def overview(runtime, net=None):
    with runtime.sessions() as session:
        return nets_overview(session, nets_as_declared(runtime.settings), runtime.clock(), net=net)


def test_timeline_starts_in_the_state_before_the_windows_first_move(clock):
    now = clock()
    since = now - timedelta(hours=24)
    moves = [
        (N.READY, N.BUSY, since + timedelta(hours=6)),
        (N.BUSY, N.READY, since + timedelta(hours=12)),
    ]
    finishing = [(since + timedelta(hours=10), since + timedelta(hours=12))]
    assert timeline(N.READY, moves, finishing, since=since, now=now) == [
        Segment("up", since, since + timedelta(hours=6)),
        Segment("busy", since + timedelta(hours=6), since + timedelta(hours=10)),
        Segment("finishing", since + timedelta(hours=10), since + timedelta(hours=12)),
        Segment("up", since + timedelta(hours=12), now),
    ]
    # No move in the window: the current state throughout; a first-ever move: unknown before.
    assert timeline(N.STOPPED, [], [], since=since, now=now) == [Segment("down", since, now)]
    first = [(None, N.STOPPED, since + timedelta(hours=1))]
    assert [s.kind for s in timeline(N.STOPPED, first, [], since=since, now=now)] == [
        "unknown",
        "down",
    ]


def test_each_net_of_the_day_as_its_history_tells_it(day, clock):
    ov = overview(day)
    nets = {n.now.name: n for n in ov.nets}
    # Those that need a human first (net-b's stray, net-c misconfigured), then by name.
    assert list(nets) == ["net-b", "net-c", "net-a"]
    assert [n.name for n in ov.attention] == ["net-b", "net-c"]
    a, b, c = nets["net-a"], nets["net-b"], nets["net-c"]

    assert a.now.state == N.BUSY and a.active_job is not None
    assert a.active_job.state.value == "FINISHING"
    kinds = [s.kind for s in a.segments]
    assert kinds[0] == "down" and kinds[-1] == "finishing"
    assert {"starting", "up", "busy", "stopping", "unhealthy"} <= set(kinds)
    # Seven cold starts completed in the window (the lost run's restart included).
    assert a.cold_starts_s == [48, 52, 45, 61, 47, 55, 50]
    assert a.queued_here == 1 and a.now.idle_left_s is None and not a.now.needs_attention
    # The segments tile the window exactly.
    for net in ov.nets:
        assert net.segments[0].start == ov.since and net.segments[-1].end == ov.now
        for left, right in zip(net.segments, net.segments[1:], strict=False):
            assert left.end == right.start and left.kind != right.kind

    assert b.now.always_on and b.now.state == N.READY and b.now.idle_left_s is None
    assert b.now.strays == 1 and b.now.needs_attention
    assert [s.kind for s in b.segments][:2] == ["up", "busy"]

    assert c.now.state == N.MISCONFIGURED and c.now.last_error == MISCONFIGURED_ERROR
    assert c.segments[-1].kind == "misconfigured" and c.now.needs_attention
    assert c.cold_starts_s == [75, 82] and c.queued_here == 1

    assert ov.queued == 2 and ov.queued_anywhere == 0
    assert len(ov.jobs) == 14
    newest = ov.jobs[0]  # net-a's run, FINISHING since 11:37
    assert newest.caller_key == "model-06-train" and newest.state.value == "FINISHING"
    pinned = next(j for j in ov.jobs if j.caller_key == "model-07-train")
    assert pinned.net == "net-a" and [m.state.value for m in pinned.moves] == ["QUEUED"]
    requeued = next(j for j in ov.jobs if j.attempts == 1 and j.net == "net-a")
    assert [m.state.value for m in requeued.moves] == [
        "QUEUED",
        "ASSIGNED",
        "DISPATCHING",
        "RUNNING",
        "QUEUED",
        "ASSIGNED",
        "DISPATCHING",
        "RUNNING",
        "COMPLETED",
    ]


def test_one_nets_jobs_are_those_it_ran_and_those_queued_for_it(day):
    # model-14 was requeued off net-c when it became MISCONFIGURED: pinned, waiting.
    assert [j.caller_key for j in overview(day, "net-c").jobs] == [
        "model-14-train",
        "model-13-train",
        "model-12-train",
    ]
    with day.sessions() as session:
        from app.usecases.net_history import recent_jobs

        assert [j.caller_key for j in recent_jobs(session, 2, "net-c")] == [
            "model-14-train",
            "model-13-train",
        ]


def test_a_finishing_span_that_ended_inside_the_window(day, clock):
    from sqlalchemy import select

    from models import Job, JobState, Net, ReasonCode

    reported = clock() - timedelta(minutes=10)
    with day.sessions.begin() as session:
        job = session.scalars(select(Job).where(Job.caller_key == "model-06-train")).one()
        finishing_since = job.state_changed_at
        job.transition(
            JobState.COMPLETED, reported, "results uploaded", code=ReasonCode.RESULTS_UPLOADED
        )
        session.get(Net, "net-a").mark_idle(reported)
    tail = overview(day, "net-a").nets[0].segments[-3:]
    assert [(s.kind, s.start, s.end) for s in tail] == [
        ("busy", tail[0].start, finishing_since),
        ("finishing", finishing_since, reported),
        ("up", reported, clock()),
    ]


def test_idle_grace_left_and_overdue(day, clock):
    with day.sessions.begin() as session:
        from models import Net

        net = session.get(Net, "net-a")
        assert net is not None
        net.state, net.idle_since = N.READY, clock() - timedelta(seconds=200)
    assert overview(day, "net-a").nets[0].now.idle_left_s == 400
    clock.advance(700)
    net_a = overview(day, "net-a").nets[0].now
    assert net_a.idle_left_s == -300 and net_a.needs_attention


def test_the_served_page(day):
    client = TestClient(create_app(day))
    page = client.get("/nets")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert '<meta http-equiv="refresh" content="30">' in html
    assert "<script" not in html and "http://" not in html and "https://" not in html
    for name in ("net-a", "net-b", "net-c"):
        assert f'id="net-{name}"' in html
    assert "Needs attention" in html
    assert "1 stray run(s)" in html
    assert "the admin kit&#x27;s CA does not match" in html  # escaped
    assert "model-06-train" in html and "FINISHING" in html
    assert "7 in 24 h, median 50 s" in html
    assert "1 pinned here" in html

    assert client.get("/nets", params={"page": 0}).status_code == 422
    one = client.get("/nets", params={"net": "net-c"})
    assert one.status_code == 200
    assert 'id="net-net-c"' in one.text and 'id="net-net-a"' not in one.text
    assert client.get("/nets", params={"net": "nope"}).status_code == 400


def test_duration_words():
    assert [duration(s) for s in (5, 65, 3700, 90000, -125)] == [
        "5 s",
        "1m 05s",
        "1h 01m",
        "1d 1h",
        "2m 05s",
    ]


def test_a_page_holds_page_size_nets_and_every_trouble_is_listed(day, clock):
    with day.sessions() as session:
        declared = nets_as_declared(day.settings)
        first = nets_overview(session, declared, clock(), page_size=2)
        second = nets_overview(session, declared, clock(), page=2, page_size=2)
        beyond = nets_overview(session, declared, clock(), page=9, page_size=2)
    assert (first.page, first.pages, first.offset) == (1, 2, 0)
    assert [p.now.name for p in first.nets] == ["net-b", "net-c"]
    assert [p.now.name for p in second.nets] == ["net-a"] and second.offset == 2
    assert beyond.page == 2  # past the last page: the last page
    # Every page lists every net in trouble and counts the whole fleet.
    assert [n.name for n in second.attention] == ["net-b", "net-c"]
    assert second.total_nets == 3 and second.nets_by_state == {
        "BUSY": 1,
        "MISCONFIGURED": 1,
        "READY": 1,
    }
    # The page's window holds its own nets' moves only.
    assert second.nets[0].cold_starts_s == [48, 52, 45, 61, 47, 55, 50]
    pager = "Nets 1\u20132 of 3 (page 1 of 2, those that need attention first)"
    assert pager in render(first) and 'href="nets?page=2">next' in render(first)
    assert "Nets 3\u20133 of 3" in render(second) and "previous" in render(second)
