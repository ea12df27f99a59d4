"""Drain (issue 40 item 1, app/usecases/drains.py): a drained net takes no new claim and no
prewarm, finishes what it runs (a FINISHING hold for flip-api's report included), then
scales to zero after its grace as usual; queued jobs wait, spending nothing, and say "net
drained"; undrain kicks the assigner. A whole-deployment drain covers a net declared later,
and every drain outlives the runtime that made it (it is in SQL)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from app import names
from app.entrypoints import nets_page
from app.entrypoints.api import create_app
from app.errors import InvalidRequest, NetDrained
from app.schemas import ReportedStatus, ReportJobStatus
from app.settings import Settings
from app.usecases import dispatch, drains, monitor, records, scale_down
from app.usecases.net_history import nets_as_declared, nets_overview
from app.usecases.views import job_detail
from models import Drain, JobState, NetState, PrewarmOutcome
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of
from tests.unit.prewarm_world import ask, pw, row, warm_sent  # noqa: F401 (pw: a fixture)

IDLE_S = 60
API_KEY = "drain-doors-key-0123"
AUTH = {"X-API-Key": API_KEY}


def _nets(tmp_path, *names_: str) -> list[dict]:
    return [net_decl(tmp_path, n, "ecs", idle_timeout_s=IDLE_S) for n in names_]


@pytest.fixture
def two(tmp_path, job_root, sqlite_factory, clock) -> World:
    """net-a and net-b, scale-to-zero, 60 s grace; the API key set."""
    nets = _nets(tmp_path, "net-a", "net-b")
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, API_SECRET=API_KEY)


def _kicks(world: World) -> int:
    return sum(1 for task, _ in world.outbox.sent if task == names.ASSIGN_NEXT_JOB)


def _waiting_for(world: World, job_id) -> str | None:
    with world.rt.sessions() as session:
        return job_detail(session, job_id, settings=world.rt.settings).waiting_for


def test_a_claim_skips_a_drained_net_and_the_job_waits_saying_net_drained(two):
    pinned = two.enqueue("pinned", net="net-a")
    drains.drain(two.rt, ["net-a"])
    assert dispatch.claim_and_start(two.rt) == []
    job = two.job(pinned)
    assert (job.state, job.attempts, job.retries) == (JobState.QUEUED, 0, 0)
    assert _waiting_for(two, pinned) == (
        "net drained: net net-a, which it is pinned to, is drained; it runs once an operator "
        "undrains one (`undrain`)"
    )
    # An unpinned job takes the net not drained; with both drained it waits too.
    anywhere = two.enqueue("anywhere", required_sites=["site-1"])
    assert _waiting_for(two, anywhere) is None
    drains.drain(two.rt, ["net-b"])
    assert dispatch.claim_and_start(two.rt) == []
    assert _waiting_for(two, anywhere).startswith(
        "net drained: every net it may run on is drained (net-a, net-b)"
    )
    assert two.net("net-a").state == two.net("net-b").state == NetState.STOPPED


def test_undrain_kicks_the_assigner_and_the_waiting_job_is_claimed(two):
    job_id = two.enqueue("pinned", net="net-a")
    drains.drain(two.rt, ["net-a"])
    before = _kicks(two)
    changed = drains.undrain(two.rt, ["net-a"])
    assert changed.notified is True and changed.state == "none"
    assert _kicks(two) == before + 1
    assert [a.job_id for a in dispatch.claim_and_start(two.rt)] == [job_id]
    assert two.net("net-a").state == NetState.STARTING


def test_a_drained_net_finishes_its_job_then_scales_to_zero_while_a_queued_job_waits(two):
    running = two.enqueue("running", net="net-a")
    two.run_pipeline(running)
    drains.drain(two.rt, ["net-a"], reason="release 0.3.0")
    waiting = two.enqueue("waiting", net="net-a")
    view = drains.drain_view(two.rt)
    assert (view.state, view.complete, view.queued) == ("draining", False, 1)
    assert [(n.name, n.active_job.id) for n in view.nets] == [("net-a", running)]

    two.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(two.rt)
    assert two.job(running).state == JobState.COMPLETED
    assert dispatch.claim_and_start(two.rt) == []  # the freed net is not claimed
    view = drains.drain_view(two.rt)
    assert (view.state, view.complete, view.nets[0].active_job) == ("drained", True, None)

    two.clock.advance(IDLE_S)
    assert scale_down.scale_down_idle_nets(two.rt) == ["net-a"]  # the queued job keeps nothing up
    assert two.net("net-a").state == NetState.STOPPED
    assert two.driver("net-a").replicas == 0
    job = two.job(waiting)
    assert (job.state, job.attempts, job.retries) == (JobState.QUEUED, 0, 0)

    drains.undrain(two.rt, ["net-a"])
    assert [a.job_id for a in dispatch.claim_and_start(two.rt)] == [waiting]


def test_a_finishing_job_held_for_flip_api_s_report_keeps_the_drain_from_completing(two):
    object.__setattr__(two.rt.settings.net("net-a"), "release_after", "reported")
    job_id = two.enqueue("j", net="net-a")
    two.run_pipeline(job_id)
    drains.drain(two.rt, ["net-a"])
    two.server("net-a").statuses["nv-1"] = "FINISHED:COMPLETED"
    monitor.monitor_running_jobs(two.rt)
    assert two.job(job_id).state == JobState.FINISHING
    view = drains.drain_view(two.rt)
    assert view.state == "draining" and view.nets[0].active_job.state == JobState.FINISHING
    two.clock.advance(10 * IDLE_S)
    assert scale_down.scale_down_idle_nets(two.rt) == []  # the hold is kept
    with two.rt.sessions.begin() as session:
        report = ReportJobStatus(job_id=job_id, status=ReportedStatus.RESULTS_UPLOADED)
        records.report_job_status(session, report, two.clock())
    assert drains.drain_view(two.rt).state == "drained"


def test_a_whole_deployment_drain_covers_a_net_declared_later_and_outlives_its_runtime(
    two, tmp_path, job_root, sqlite_factory, clock
):
    drains.drain(two.rt, everything=True)
    # A redeploy adds net-c: every process restarts with the new NETS, on the same database.
    later = World(
        Settings(
            FL_DISPATCHER_DATA_DIR=tmp_path / "data",
            JOB_ROOT=job_root,
            NETS=json.dumps(_nets(tmp_path, "net-a", "net-b", "net-c")),
            PER_JOB_FL_SERVER="true",
        ),
        sqlite_factory,
        clock,
    )
    job_id = later.enqueue("anywhere", required_sites=["site-1"])
    assert dispatch.claim_and_start(later.rt) == []
    view = drains.drain_view(later.rt)
    assert view.deployment and view.state == "drained"
    assert [(n.name, n.deployment) for n in view.nets] == [
        ("net-a", True),
        ("net-b", True),
        ("net-c", True),
    ]
    assert _waiting_for(later, job_id).startswith("net drained: every net it may run on")
    with pytest.raises(InvalidRequest, match="the whole deployment is drained"):
        drains.undrain(later.rt, ["net-c"])
    drains.undrain(later.rt, everything=True)
    assert len(dispatch.claim_and_start(later.rt)) == 1


def test_a_drain_names_declared_nets_or_all_and_keeps_its_first_time(two):
    with pytest.raises(InvalidRequest, match="unknown net"):
        drains.drain(two.rt, ["net-z"])
    with pytest.raises(InvalidRequest, match="--all"):
        drains.drain(two.rt)
    first = drains.drain(two.rt, ["net-a"]).nets[0].since
    two.clock.advance(30)
    assert drains.drain(two.rt, ["net-a"]).nets[0].since == first


def test_a_prewarm_for_a_drained_net_is_refused_and_starts_nothing(pw):  # noqa: F811
    drains.drain(pw.rt, ["net-a"])
    with pytest.raises(NetDrained, match="net net-a is drained"):
        ask(pw, "p1", net="net-a", within_s=300)
    assert row(pw, "p1").outcome == PrewarmOutcome.NET_DRAINED
    assert warm_sent(pw) == [] and pw.net("net-a").state == NetState.STOPPED
    # A hint by sites goes to a fitting net that is not drained, and is refused once all are.
    assert ask(pw, "p2", required_sites=["site-1"], within_s=300).prewarm.net == "net-b"
    drains.drain(pw.rt, ["net-b"])
    with pytest.raises(NetDrained, match=r"every net with its sites is drained \(net-a, net-b\)"):
        ask(pw, "p3", required_sites=["site-1"], within_s=300)


def test_a_drain_ends_the_live_holds_on_its_nets(pw):  # noqa: F811
    ask(pw, "p1", net="net-a", within_s=300)
    assert pw.net("net-a").state == NetState.STARTING
    drains.drain(pw.rt, ["net-a"])
    held = row(pw, "p1")
    assert (held.outcome, held.detail) == (PrewarmOutcome.CANCELLED, "net net-a drained")


def test_the_drain_routes_need_the_api_key_and_get_drain_is_open(two):
    two.enqueue("pinned", net="net-a")
    with TestClient(create_app(two.rt)) as client:
        assert client.post("/drain", json={"nets": ["net-a"]}).status_code == 401
        assert client.post("/undrain", json={"all": True}).status_code == 401
        assert client.get("/drain").json()["state"] == "none"
        answer = client.post("/drain", json={"nets": ["net-a"], "reason": "deploy"}, headers=AUTH)
        assert answer.status_code == 200
        assert answer.json()["state"] == "drained" and answer.json()["notified"] is None
        assert client.get("/drain").json()["nets"][0]["name"] == "net-a"
        assert [n["drained"] for n in client.get("/fl/status").json()["nets"]] == [True, False]
        refused = client.post(
            "/prewarms", json={"caller_key": "p", "net": "net-a", "within_s": 60}, headers=AUTH
        )
        assert refused.status_code == 409 and refused.json()["reason_code"] == "net_drained"
        assert client.post("/drain", json={}, headers=AUTH).status_code == 400
        undrained = client.post("/undrain", json={"nets": ["net-a"]}, headers=AUTH)
        assert undrained.status_code == 200 and undrained.json()["notified"] is True
        assert client.get("/drain").json()["state"] == "none"


def test_the_nets_page_shows_a_drain_banner(two):
    job_id = two.enqueue("running", net="net-a")
    two.run_pipeline(job_id)
    drains.drain(two.rt, everything=True)
    with two.rt.sessions() as session:
        overview = nets_overview(session, nets_as_declared(two.rt.settings), two.clock())
    page = nets_page.render(overview)
    assert "The whole deployment is drained" in page
    assert "<b>Draining</b>: still active: net-a: running" in page
    assert page.count("takes no new job") == 2  # each net's card


def test_a_hold_accepted_as_its_net_was_drained_is_ended_by_the_next_round(pw):  # noqa: F811
    """A prewarm that read its net before a drain committed (PostgreSQL: the drain's commit
    landed while the prewarm waited for the net's lock) is let through; the next scale-down
    round ends it, so nothing starts the drained net again for it."""
    ask(pw, "p1", net="net-a", within_s=300)
    with pw.rt.sessions.begin() as session:  # the drain's row, without its own hold ending
        session.add(Drain(scope="net-a", drained_at=pw.clock()))
    pw.clock.advance(1)
    scale_down.scale_down_idle_nets(pw.rt)
    held = row(pw, "p1")
    assert (held.outcome, held.detail) == (PrewarmOutcome.CANCELLED, "net net-a drained")
