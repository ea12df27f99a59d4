"""Starts the platform fails: an always-on start that never comes up is an OUTAGE past its
net's ready_timeout_s from the first ask, even while the platform refuses every call
(README, "What to page on"); an always-on net is not left at zero replicas by the
dispatcher, an OUTAGE's lost replica asked for again (`watch_always_on`: "always-on means
one replica"; tests.sim's `always-on-replica`, `outage-back-up`), and an OUTAGE whose server
answers is READY while the platform's API refuses; a settling start fails on its own
failure, not on a crash from before its ask, and an adopted one on its container's exit.
Each test failed on the code it was written against."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.adapters.drivers.docker import observed as docker_observed
from app.errors import DriverMisconfigured, DriverTransientError
from app.usecases import reconciler, records, scaling
from models import NetEvent, NetState
from tests.unit.scale_history import scale_decisions
from tests.unit.test_revived_strays import _net_state, _stray_on, _strays, _world

ROUND_S = 30.0  # two HOUSEKEEPING_INTERVAL_S of 15 s: a reconcile round


def _start(world, name: str) -> None:
    """The net moves to STARTING now, with no job and no replica asked for (a prewarm's
    start across a redeploy to always-on, a claim whose job ended before its scale_up)."""
    with world.rt.sessions.begin() as session:
        records.get_net(session, name).transition(NetState.STARTING, world.clock(), "prewarm")


@pytest.mark.parametrize("broken", ["every-call", "scale-only"])
def test_an_always_on_start_whose_platform_never_takes_a_call_pages(always_on, broken):
    """net-a (always-on ECS) is left STARTING with no job and no replica; its platform's API
    then refuses every call for good (a network path to the ECS endpoint lost, a throttle
    that never lets up: DriverTransientError), so its server is never started. Past its
    ready_timeout_s from the first ask it is an OUTAGE (FlDispatcherNetOutage pages). Before
    round 15's fix it stayed STARTING for hours: each round's `watch_always_on` raised on
    the driver before it read the server (reconcile noted "not checked"), and the deadline
    counted from the last refused call (`outages._asked_at`), i.e. from now."""
    world = always_on
    world.server("net-a").up = False  # never started: nothing answers
    _start(world, "net-a")
    driver = world.driver("net-a")
    if broken == "every-call":
        driver.fail_with = DriverTransientError("EndpointConnectionError: ecs.eu-west-2")
    else:  # observing works (desired 0); the scale call is refused every time

        def refused(replicas: int) -> None:
            raise DriverTransientError("ThrottlingException: rate exceeded")

        driver.scale = refused
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    waited = 0.0
    while waited < 4 * deadline:
        world.clock.advance(ROUND_S)
        waited += ROUND_S
        reconciler.reconcile(world.rt)
    assert world.driver("net-a").replicas == 0
    assert world.net("net-a").state == NetState.OUTAGE, (
        f"always-on server never started, STARTING {waited:.0f}s (deadline {deadline:.0f}s):"
        " never paged"
    )


def test_an_always_on_start_whose_replica_the_platform_lost_is_asked_for_again(always_on):
    """net-a's platform loses the replica at start for a while (a docker container that
    exits at start reads as desired 0: app/adapters/drivers/docker.py), so each round of the
    job-less STARTING asks for it again; past ready_timeout_s from the first ask it is an
    OUTAGE (`outages.overdue_start`). Then the platform would run it (the cause is gone):
    the OUTAGE's replica is asked for again and the net is READY once its server answers.
    Before round 15's fix `watch_always_on` asked only for a net "left down" (STOPPING,
    UNHEALTHY, STOPPED, a job-less STARTING), never for an OUTAGE: an OUTAGE at zero
    replicas for good, and the README's "once the server answers, READY again" never came."""
    world = always_on
    world.server("net-a").up = False
    _start(world, "net-a")
    deadline = world.rt.settings.net("net-a").ready_timeout_s
    for _ in range(int(deadline // ROUND_S) + 2):
        reconciler.reconcile(world.rt)
        if world.net("net-a").state == NetState.OUTAGE:
            break
        world.driver("net-a").replicas = 0  # lost again before the next round
        world.clock.advance(ROUND_S)
    assert world.net("net-a").state == NetState.OUTAGE
    world.driver("net-a").replicas = 0  # the replica of the last ask is lost too
    asks = len(scale_decisions(world, "net-a"))
    # From now on the platform keeps a replica it is asked for, and its server answers.
    for _ in range(10):
        world.clock.advance(ROUND_S)
        world.server("net-a").up = world.driver("net-a").replicas > 0
        reconciler.reconcile(world.rt)
    assert len(scale_decisions(world, "net-a")) > asks, (
        "always-on net in OUTAGE at zero replicas: its replica never asked for again"
    )
    assert world.net("net-a").state == NetState.READY


# A Flower SuperLink container that crashed an hour ago: the engine keeps how it ended
# until it is started again (app/adapters/drivers/docker.py: "an exit from before it, a
# crash long ago, is history"). A `docker stop` of an exited container is a no-op (304).
CRASHED: dict[str, object] = {
    "Status": "exited",
    "ExitCode": 1,
    "FinishedAt": "2026-12-05T12:00:00Z",
}
RUNNING: dict[str, object] = {"Status": "running"}


def _a_container_that_crashed_long_ago(world, net: str) -> dict[str, dict[str, object]]:
    """The net's driver reads as the Docker driver reads its container (`docker.observed`,
    the product's own reading): exited with code 1 long ago while not started, running once
    started; a stop leaves the old exit in place when there was nothing to stop. What the
    engine says now, for the test to change."""
    driver = world.driver(net)
    state: dict[str, dict[str, object]] = {"now": CRASHED}
    real_scale = driver.scale

    def scale(replicas: int) -> None:
        real_scale(replicas)
        if replicas:
            state["now"] = RUNNING
        elif state["now"] is RUNNING:
            state["now"] = {"Status": "exited", "ExitCode": 143}

    driver.scale = scale
    driver.observe = lambda: docker_observed(state["now"])
    return state


@pytest.mark.parametrize("ask", ["refused-once", "on-the-wire-during-a-round"])
def test_a_settling_start_is_not_failed_by_a_crash_from_before_its_ask(
    tmp_path, job_root, sqlite_factory, clock, ask
):
    """fl-a (scale-to-zero Flower, its strays kept in the SuperLink's database) is STOPPED;
    its container crashed an hour ago, which the engine still reports (exited, code 1).
    Reconcile starts it to settle the strays (STOPPED -> STARTING, then the ask). Either the
    ask is refused once (the engine busy: DriverTransientError, "not checked"), or another
    reconcile round runs while the ask is on the wire (rounds overlap: a round waits its
    calls' timeouts). The round that then looks at the STARTING net sees the old crash with
    nothing running, and `failed_starts.give_up_failed_start` fails the start at once
    ("settling start failed", logged at error, UNHEALTHY, scaled to 0), though its replica was
    never asked of the platform, or is being started that very moment. The start counts as
    tried, so the net rests at zero up to SETTLE_REST_MAX_S once its strays are overdue. A
    prewarm's start guards against exactly this (`warm_up._poll`: a failure fails the start
    only once the driver took a start for it, `_start_asked`); the settling start does not."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    world.server("fl-a").up = False
    assert scaling.take_down(world.rt, "fl-a", "test")
    _a_container_that_crashed_long_ago(world, "fl-a")
    driver = world.driver("fl-a")
    started = driver.scale
    if ask == "refused-once":

        def refused(replicas: int) -> None:
            driver.scale = started  # type: ignore[method-assign]
            raise DriverTransientError("docker engine: 500 Server Error (busy)")

        driver.scale = refused  # type: ignore[method-assign]
        reconciler.reconcile(world.rt)  # STARTING; the ask refused: "not checked"
        clock.advance(ROUND_S)
    else:

        def on_the_wire(replicas: int) -> None:
            driver.scale = started  # type: ignore[method-assign]
            if replicas:
                reconciler.reconcile(world.rt)  # an overlapping round looks meanwhile
            started(replicas)

        driver.scale = on_the_wire  # type: ignore[method-assign]
    reconciler.reconcile(world.rt)
    assert _net_state(world, "fl-a") == NetState.STARTING or driver.replicas == 1
    with world.rt.sessions() as session:
        given_up = session.scalars(
            select(NetEvent.reason).where(
                NetEvent.net_name == "fl-a", NetEvent.to_state == NetState.UNHEALTHY
            )
        ).all()
    assert given_up == [], f"settling start failed on a crash from before its ask: {given_up}"
    assert len(_strays(world, "fl-a")) == 1


def test_a_settling_start_whose_container_exits_after_its_ask_is_still_failing_at_once(
    tmp_path, job_root, sqlite_factory, clock
):
    """The other side of the rule above: the ask was taken (the container started), and
    the container then exits on its own: that exit is this start's failure, given up at
    once as round 15 made it (UNHEALTHY, its error the exit), not waited out."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    world.server("fl-a").up = False
    assert scaling.take_down(world.rt, "fl-a", "test")
    engine = _a_container_that_crashed_long_ago(world, "fl-a")
    reconciler.reconcile(world.rt)  # started to settle: the container runs
    assert (_net_state(world, "fl-a"), engine["now"]) == (NetState.STARTING, RUNNING)
    engine["now"] = {"Status": "exited", "ExitCode": 2, "FinishedAt": "2026-12-05T13:00:05Z"}
    clock.advance(ROUND_S)
    reconciler.reconcile(world.rt)
    net = world.net("fl-a")
    assert net.state == NetState.STOPPED  # UNHEALTHY, then its stop confirmed
    assert net.last_error is not None and "exited on its own with code 2" in net.last_error
    assert len(_strays(world, "fl-a")) == 1


def _outage_whose_server_is_back(world):
    """net-a (always-on, its replica running) READY, then an OUTAGE, then its server back."""
    world.driver("net-a").replicas = 1
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.READY
    world.server("net-a").up = False
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.OUTAGE
    world.server("net-a").up = True
    return world


def test_an_outage_whose_server_answers_again_is_ready_while_its_platform_api_refuses(always_on):
    """README, FlDispatcherNetOutage: "Once the server answers, the net is READY again."
    net-a (always-on ECS, its replica running) loses its server, an OUTAGE; the server
    answers again while the platform's API refuses every call (throttled, its endpoint
    unreachable: the replica itself is fine). Before 6483ba4 an OUTAGE's driver was never
    read and the server's answer ended it; since, the refused read ends the net's round
    before the server is asked, so the page keeps firing on a net that works for as long
    as the platform's API is out."""
    world = _outage_whose_server_is_back(always_on)
    world.driver("net-a").fail_with = DriverTransientError("ThrottlingException")  # the API not
    for _ in range(3):
        world.clock.advance(30)
        reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.READY, "an OUTAGE whose server answers"


def test_an_outage_whose_server_answers_again_is_ready_while_its_platform_refuses_access(
    always_on,
):
    """README, FlDispatcherNetOutage: "Once the server answers, the net is READY again."
    As above, with the platform refusing the driver's read as misconfigured (an IAM policy
    change still propagating: AccessDenied on DescribeServices) while the replica runs and
    its server answers. An always-on net that never went down never reads its driver, and
    stays READY through such a denial; since 6483ba4 an OUTAGE's re-ask reads it first, so
    the denial made the net MISCONFIGURED (out of service until a worker restart) although
    its server answered: the server decides, as for a refusal that is transient."""
    world = _outage_whose_server_is_back(always_on)
    world.driver("net-a").fail_with = DriverMisconfigured(  # the API denies the driver
        "ecs service net-a: DescribeServices failed: AccessDeniedException: not authorized"
    )
    world.clock.advance(30)
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.READY, "an OUTAGE whose server answers"


def test_an_outage_whose_server_stays_away_and_platform_refuses_as_misconfigured_is_so(
    always_on,
):
    """The other side of the test above, kept as the README says (FlDispatcherNetMisconfigured:
    "a missing ECS service or cluster, access denied: its last_error says which"): an
    OUTAGE whose server does not answer and whose replica the platform will not give
    (the service deleted, a docker container removed by hand: the driver never creates
    one) is MISCONFIGURED with the refusal as its error, not an OUTAGE re-asked forever
    whose page names only an unreachable server."""
    world = always_on
    world.driver("net-a").replicas = 1
    reconciler.reconcile(world.rt)
    world.server("net-a").up = False
    reconciler.reconcile(world.rt)
    assert world.net("net-a").state == NetState.OUTAGE
    refusal = "ecs service net-a: DescribeServices failed: ServiceNotFoundException"
    world.driver("net-a").fail_with = DriverMisconfigured(refusal)
    world.clock.advance(30)
    reconciler.reconcile(world.rt)
    net = world.net("net-a")
    assert net.state == NetState.MISCONFIGURED
    assert net.last_error is not None and refusal in net.last_error


def test_an_adopted_settling_start_whose_container_exits_is_failing_at_once(
    tmp_path, job_root, sqlite_factory, clock
):
    """app/deploy/CHANGELOG.md (b24e237): "A job-less start that settles stray runs (or a
    replica started by hand and adopted as one) whose driver reports a failure of this start
    with nothing running is UNHEALTHY at once". fl-a (Flower, its strays kept in the
    SuperLink's database) is STOPPED; an operator starts its docker container by hand (the
    stray alert's advice) and reconcile adopts it as a settling start; the container then
    exits on its own: UNHEALTHY at once, the exit its error. A docker container that exited
    reads as no replica desired, and since b24e237 such a failure of a settling start counts
    only after a scale-up the driver took since the start; an adopted start has none (it
    was waited out to ready_timeout_s, then abandoned, its error not the container's exit),
    so an adoption now has its own reason (`failed_starts.ADOPTED_START`)."""
    world = _world(tmp_path, job_root, sqlite_factory, clock)
    _stray_on(world, "fl-a")
    world.server("fl-a").up = False
    assert scaling.take_down(world.rt, "fl-a", "test")
    engine = _a_container_that_crashed_long_ago(world, "fl-a")
    engine["now"] = RUNNING  # `docker start` by hand
    reconciler.reconcile(world.rt)
    assert _net_state(world, "fl-a") == NetState.STARTING  # adopted to settle
    assert scale_decisions(world, "fl-a")[-1][0] == 0  # nothing asked since the take-down
    engine["now"] = {"Status": "exited", "ExitCode": 2, "FinishedAt": "2026-12-05T13:00:05Z"}
    clock.advance(30)
    reconciler.reconcile(world.rt)
    net = world.net("fl-a")
    assert net.state != NetState.STARTING, "an adopted start whose container exited waited out"
    assert net.last_error is not None and "exited on its own with code 2" in net.last_error
