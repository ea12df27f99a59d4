"""The prewarm tests' world (tests/unit/test_prewarm.py, test_prewarm_requests.py): nets with
sites and a 60 s idle grace, flip-api's hint as the use case takes it, and what the tests
read back (the key's row and view, warm-ups sent, starts)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app import names
from app.read_models import PrewarmView
from app.schemas import PrewarmNet
from app.usecases import prewarm, records
from app.usecases.prewarm import warm_up as prewarm_warm_up
from app.usecases.prewarm.warm_up import Warm
from models import JobState, NetEvent, NetState, Prewarm, ReasonCode
from tests.fixtures.db import net_decl
from tests.unit.conftest import World, world_of

GRACE_S = 60
READY_TIMEOUT_S = 120
MAX_S = 600
# Any scale-down round after the bound: tasks/README.md allows "plus one scale-down round".
ROUND_S = 1


@pytest.fixture
def pw(tmp_path, job_root, sqlite_factory, clock) -> World:
    """Two scale-to-zero nets (grace 60 s) with sites; net-c has only site-3; a static one."""
    nets = [
        net_decl(
            tmp_path,
            name,
            "ecs",
            idle_timeout_s=GRACE_S,
            ready_timeout_s=READY_TIMEOUT_S,
            sites=["site-1", "site-2"],
        )
        for name in ("net-a", "net-b")
    ]
    nets.append(
        net_decl(
            tmp_path, "net-c", "ecs", idle_timeout_s=GRACE_S, sites=["site-3"], required_sites=[]
        )
    )
    nets.append(net_decl(tmp_path, "fixed", "static", sites=["site-9"], required_sites=[]))
    return world_of(nets, tmp_path, job_root, sqlite_factory, clock, PREWARM_MAX_S=MAX_S)


def ask(world: World, key: str, **kw) -> prewarm.Requested:
    return prewarm.request_prewarm(world.rt, PrewarmNet(caller_key=key, **kw))


def warm_sent(world: World) -> list[str]:
    return [kw["net_name"] for task, kw in world.outbox.sent if task == names.WARM_UP]


def warm_until_ready(world: World, net: str) -> None:
    """What the warm_up task does: poll until the net is READY."""
    for _ in range(5):
        if prewarm_warm_up.warm_up(world.rt, net).step == Warm.READY:
            return
    raise AssertionError("never ready")


def row(world: World, key: str, *, refused: bool | None = None) -> Prewarm:
    """The key's accepted prewarm if any, else its latest refusal."""
    stmt = select(Prewarm).where(Prewarm.caller_key == key)
    if refused is not None:
        stmt = stmt.where(Prewarm.refused.is_(refused))
    with world.rt.sessions() as session:
        return session.scalars(stmt.order_by(Prewarm.refused, Prewarm.id.desc())).first()


def view(world: World, key: str) -> PrewarmView:
    with world.rt.sessions() as session:
        return prewarm.get_prewarm(session, key, world.clock())


def starts(world: World, net: str) -> int:
    with world.rt.sessions() as session:
        return len(
            session.scalars(
                select(NetEvent).where(
                    NetEvent.net_name == net, NetEvent.to_state == NetState.STARTING
                )
            ).all()
        )


def held_ready(world: World, key: str = "p1", within_s: float = 300, net: str = "net-a"):
    """A prewarm of `net` whose server is up and READY (held)."""
    answer = ask(world, key, net=net, within_s=within_s)
    if answer.notified:
        warm_until_ready(world, net)
    assert world.net(net).state == NetState.READY
    return answer


def moved_ready(world: World, net: str = "net-a") -> None:
    """The STARTING net moved READY by another's readiness check (a job's chain, whose sites
    may differ from the holds', or reconcile's)."""
    with world.rt.sessions.begin() as session:
        records.get_net(session, net).transition(NetState.READY, world.clock(), "ready")


def finish(world: World, job_id) -> None:
    with world.rt.sessions.begin() as session:
        records.finish_job(
            session,
            job_id,
            JobState.COMPLETED,
            "done",
            world.clock(),
            code=ReasonCode.RUN_COMPLETED,
        )


def boot_slowly(world: World, net: str, boot_s: float) -> None:
    """The driver is asked for a replica now; the server answers only `boot_s` later (still
    inside the net's ready_timeout_s), polled by warm_up as its task does."""
    world.server(net).up = False
    assert prewarm_warm_up.warm_up(world.rt, net).step == Warm.NOT_READY  # driver asked
    world.clock.advance(boot_s)
    world.server(net).up = True
    assert prewarm_warm_up.warm_up(world.rt, net).step == Warm.READY
