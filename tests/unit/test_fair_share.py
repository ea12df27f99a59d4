"""The claim's fair share between projects (issue 40 item 2, app/usecases/fair_share.py): among
the jobs a free net may take, one of the project furthest below its share (the nets it holds
per weight), priority then age within a project; a project at its max_nets gets no net, keeps
none up and starts none; a job QUEUED for AGING_S comes before every other. The prewarm
preference asks "which job would this net take next" in the same order."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from sqlalchemy import select

from app.schemas import EnqueueJob, PrewarmNet, job_id_for
from app.usecases import claims, prewarm, records, scale_down
from app.usecases import enqueue as enqueue_uc
from models import Job, JobState, Net, NetState, ReasonCode
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of
from tests.unit.test_claim_cost import claim_counting_statements


def fair_world(tmp_path, job_root, sqlite_factory, clock, nets: Sequence[str], **shares) -> World:
    declared = [net_decl(tmp_path, n, "ecs", idle_timeout_s=30) for n in nets]
    return world_of(declared, tmp_path, job_root, sqlite_factory, clock, **shares)


@pytest.fixture
def two_nets(tmp_path, job_root, sqlite_factory, clock) -> World:
    return fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1", "net-2"])


def enqueue(world: World, key: str, project: str | None = None, **kw: object) -> uuid.UUID:
    kw.setdefault("required_sites", ["site-1", "site-2"])
    return world.enqueue(key, project_id=project, **kw)


def claim(world: World) -> tuple[str, str] | None:
    """One claim: (the claimed job's key, its net), or None."""
    with world.rt.sessions.begin() as session:
        found = claims.claim_next_job(session, world.rt.settings, world.clock())
        if found is None:
            return None
        return records.get_job(session, found.job_id).caller_key, found.net_name


def end(world: World, key: str) -> None:
    """The job ends (ABORTED from ASSIGNED), its net free again."""
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session,
            job_id_for(key),
            JobState.ABORTED,
            "done",
            world.clock(),
            code=ReasonCode.ABORTED,
        )


def test_a_project_that_enqueued_later_gets_the_next_free_net_before_the_older_queue(two_nets):
    """Project a enqueued six jobs and holds both nets; b's two jobs come later. The next
    free net goes to b (a holds two, b none), the one after to a (one each, a's is older):
    each project holds one net. Priority-then-age gave both to a's older jobs."""
    for i in range(6):
        enqueue(two_nets, f"a{i}", "a")
    assert [claim(two_nets), claim(two_nets)] == [("a0", "net-1"), ("a1", "net-2")]
    enqueue(two_nets, "b0", "b")
    enqueue(two_nets, "b1", "b")

    end(two_nets, "a0")
    assert claim(two_nets) == ("b0", "net-1")
    end(two_nets, "a1")
    assert claim(two_nets) == ("a2", "net-2")  # one net each: a's job is older than b1
    end(two_nets, "b0")
    assert claim(two_nets) == ("b1", "net-1")


def test_a_weight_is_a_share_of_the_nets(tmp_path, job_root, sqlite_factory, clock):
    """a weighs 2, b 1, three nets: a gets two of them (its usage 1/2 is below b's 1/1)."""
    world = fair_world(
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        ["net-1", "net-2", "net-3"],
        PROJECT_SHARES='{"a": {"weight": 2}}',
    )
    enqueue(world, "b0", "b")
    enqueue(world, "b1", "b")
    for i in range(3):
        enqueue(world, f"a{i}", "a")
    taken = [claim(world) for _ in range(3)]
    # b0 is the oldest (both at 0); then a (0/2 < 1/1); then a again (1/2 < 1/1).
    assert [key for key, _ in taken] == ["b0", "a0", "a1"]


def test_priority_orders_within_a_project_never_across_shares(two_nets):
    enqueue(two_nets, "a-old", "a")
    enqueue(two_nets, "a-urgent", "a", priority=10)
    assert claim(two_nets) == ("a-urgent", "net-1")
    enqueue(two_nets, "b-low", "b", priority=-5)
    # a holds a net, b none: b's job first, whatever a's priority.
    enqueue(two_nets, "a-urgent-2", "a", priority=100)
    assert claim(two_nets) == ("b-low", "net-2")


def test_jobs_without_a_project_share_the_default_project(two_nets):
    enqueue(two_nets, "none-0")
    enqueue(two_nets, "none-1")
    enqueue(two_nets, "p-0", "p")
    assert claim(two_nets) == ("none-0", "net-1")
    assert claim(two_nets) == ("p-0", "net-2")  # the default project holds one already


def test_a_job_queued_for_aging_s_comes_before_every_other(
    tmp_path, job_root, sqlite_factory, clock
):
    world = fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1", "net-2"], AGING_S=600)
    enqueue(world, "a-busy", "a")
    assert claim(world) == ("a-busy", "net-1")
    enqueue(world, "a-waiting", "a")
    clock.advance(601)  # a-waiting is aged now
    enqueue(world, "b-urgent", "b", priority=1000)
    assert claim(world) == ("a-waiting", "net-2")


def test_aged_jobs_go_by_age_alone(tmp_path, job_root, sqlite_factory, clock):
    world = fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1"], AGING_S=600)
    enqueue(world, "a-old", "a")
    enqueue(world, "b-urgent", "b", priority=50)
    clock.advance(700)
    assert claim(world) == ("a-old", "net-1")


@pytest.fixture
def capped(tmp_path, job_root, sqlite_factory, clock) -> World:
    return fair_world(
        tmp_path,
        job_root,
        sqlite_factory,
        clock,
        ["net-1", "net-2"],
        PROJECT_SHARES='{"a": {"max_nets": 1}}',
    )


def test_a_project_at_its_cap_gets_no_further_net(capped):
    enqueue(capped, "a0", "a")
    enqueue(capped, "a1", "a")
    enqueue(capped, "b0", "b")
    assert claim(capped) == ("a0", "net-1")
    assert claim(capped) == ("b0", "net-2")
    end(capped, "b0")
    assert claim(capped) is None  # net-2 free, a1 waiting: a holds its one net
    end(capped, "a0")
    assert claim(capped) is not None and capped.job(job_id_for("a1")).state == JobState.ASSIGNED


def test_a_capped_projects_queue_costs_a_claim_one_statement(capped):
    """No free net is a candidate for a job the claim may not take: the claim that cannot
    place any job stays one statement (test_claim_cost.py)."""
    enqueue(capped, "a0", "a")
    enqueue(capped, "a1", "a")
    assert claim(capped) == ("a0", "net-1")
    assert claim_counting_statements(capped) == (None, 1)


def test_a_capped_projects_queue_keeps_no_idle_server_up(capped):
    """The idle check counts only jobs the claim may take: net-2, READY and idle past its
    grace, is scaled down while a's job waits (it could not take it), not while b's does."""
    enqueue(capped, "a0", "a")
    assert claim(capped) == ("a0", "net-1")
    with capped.rt.sessions.begin() as session:
        net = session.get(Net, "net-2")
        net.transition(NetState.STARTING, capped.clock(), "test")
        net.transition(NetState.READY, capped.clock(), "test")
        net.idle_since = capped.clock()
    enqueue(capped, "a1", "a")
    capped.clock.advance(31)
    with capped.rt.sessions() as session:
        assert not claims.queued_job_fits(session, capped.rt.settings, "net-2")
        wanted = session.scalars(
            select(Net.name).where(claims.wanted_by_queued_job(Net.name, capped.rt.settings.shares))
        ).all()
        assert wanted == []
        # Without the shares (the awaited-run poll), a1 still awaits net-1's run.
        assert (
            "net-1"
            in session.scalars(select(Net.name).where(claims.wanted_by_queued_job(Net.name))).all()
        )
    enqueue(capped, "b0", "b")
    with capped.rt.sessions() as session:
        assert claims.queued_job_fits(session, capped.rt.settings, "net-2")
    with capped.rt.sessions.begin() as session:  # b0 is withdrawn before it runs
        session.get(Job, job_id_for("b0")).transition(
            JobState.ABORTED, capped.clock(), "gone", code=ReasonCode.ABORTED
        )
    assert scale_down.scale_down_idle_nets(capped.rt) == ["net-2"]


def test_a_held_net_is_hinted_for_the_job_fair_share_takes_next(
    tmp_path, job_root, sqlite_factory, clock
):
    """net-1 is held by a prewarm that job h (project b) names; net-2 is as warm and unheld;
    project a holds net-3. x (project a) is older than h, but b holds no net, so h is the job
    a free net takes next: its held net comes first and h lands on it. Asked by priority
    and age, the preference saw x ahead of h, put net-1 after net-2, and h took net-2,
    ending its hold from there."""
    world = fair_world(tmp_path, job_root, sqlite_factory, clock, ["net-1", "net-2", "net-3"])
    enqueue(world, "a-running", "a", net="net-3")
    assert claim(world) == ("a-running", "net-3")
    with world.rt.sessions.begin() as session:
        for name in ("net-1", "net-2"):
            net = session.get(Net, name)
            net.transition(NetState.STARTING, world.clock(), "test")
            net.mark_idle(world.clock())
    prewarm.request_prewarm(world.rt, PrewarmNet(caller_key="pk", net="net-1", within_s=600))
    enqueue(world, "x", "a")
    enqueue(world, "h", "b", prewarm_key="pk")
    assert claim(world) == ("h", "net-1")


def test_the_claims_order_is_built_once_per_shares(capped):
    """Statements are keyed by the shares (test_claim_statements_built_once.py): claims with
    the same settings build none anew."""
    enqueue(capped, "a0", "a")
    claim(capped)
    end(capped, "a0")
    built = len(claims._BUILT)
    for i in range(3):
        enqueue(capped, f"b{i}", "b")
        claim(capped)
        end(capped, f"b{i}")
    assert len(claims._BUILT) == built


def test_of_jobs_queued_at_the_same_instant_the_claim_takes_the_lower_id_first(world):
    """The order ends with the job's id: two jobs of one instant go in the same order on every
    read, not in the order their rows were written ("first" has the higher id here)."""
    now = world.clock()
    with world.rt.sessions.begin() as session:
        for key in ("first", "second"):
            request = EnqueueJob(caller_key=key, definition="tiny-job", net="net-a")
            enqueue_uc.enqueue_job(session, world.rt.settings, request, now)
    assert job_id_for("second") < job_id_for("first")
    with world.rt.sessions.begin() as session:
        claimed = claims.claim_next_job(session, world.rt.settings, world.clock())
    assert claimed is not None and claimed.job_id == job_id_for("second")
