"""What a reconcile round reports per net (its task result, which is what an operator reads
in the worker log): stray runs it could not settle, and whether that took the net down; an
always-on server found unreachable (OUTAGE) and stray runs gone with a server that is not
there; a net it could not check this round and why. Each note is exactly what happened,
one repair after the other."""

from __future__ import annotations

from app.errors import DriverTransientError, UnknownAdminError
from app.usecases import reconciler, records
from models import NetState


def _stray(world, net: str, *, readable: bool = True) -> None:
    """A run left on the net's server (its abort unheard), still RUNNING there."""
    job_id = world.enqueue(f"j-{net}", net=net)
    world.add_stray(job_id, net, "nv-7")
    world.server(net).statuses["nv-7"] = "RUNNING"
    if not readable:

        def unreadable(_: str):
            raise UnknownAdminError("job has no status")

        world.admin(net).job_status = unreadable  # type: ignore[method-assign]


def _set_state(world, name: str, state: NetState) -> None:
    with world.rt.sessions.begin() as session:
        records.get_net(session, name).state = state


def _notes(world, net: str) -> list[str]:
    return [r for r in reconciler.reconcile(world.rt).repaired if r.startswith(f"{net}:")]


def test_strays_left_unsettled_are_reported_and_so_is_the_take_down(world):
    world.driver("net-a").replicas = 1
    _set_state(world, "net-a", NetState.READY)
    _stray(world, "net-a", readable=False)
    assert _notes(world, "net-a") == ["net-a: 1 stray run(s) unsettled"]
    world.clock.advance(world.rt.settings.abort_timeout_s)
    assert _notes(world, "net-a") == ["net-a: 1 stray run(s) unsettled; net taken down"]
    assert world.driver("net-a").replicas == 0


def test_strays_beside_a_running_job_are_settled_and_reported_too(world):
    """A net with a job is read with its stray runs like any other (a submit that landed
    for a job that moved on can leave one beside the next job's run)."""
    job_id = world.enqueue("running", net="net-a")
    world.run_pipeline(job_id)
    _stray(world, "net-a", readable=False)
    assert _notes(world, "net-a") == ["net-a: 1 stray run(s) unsettled"]


def test_an_always_on_net_keeps_its_unsettled_strays_and_says_only_that(world):
    reconciler.reconcile(world.rt)  # the static server is READY
    _stray(world, "fixed", readable=False)
    world.clock.advance(world.rt.settings.abort_timeout_s + 1)
    assert _notes(world, "fixed") == ["fixed: 1 stray run(s) unsettled"]


def test_unsettled_strays_follow_the_repair_of_the_same_round(world):
    _set_state(world, "net-a", NetState.READY)  # no replica: drift
    _stray(world, "net-a")  # the server is not there to settle it
    assert _notes(world, "net-a") == [
        "net-a: drift: READY net had no server; now STOPPED; 1 stray run(s) unsettled"
    ]


def test_a_net_the_driver_cannot_tell_about_is_reported_not_checked(world):
    world.driver("net-a").fail_with = DriverTransientError("ECS throttled")
    assert _notes(world, "net-a") == ["net-a: not checked: ECS throttled"]


def test_an_unreachable_always_on_server_is_reported_as_an_outage(always_on):
    world = always_on
    _set_state(world, "net-a", NetState.READY)  # scaled to 0 by hand, no strays
    world.server("net-a").up = False
    assert _notes(world, "net-a") == ["net-a: READY -> OUTAGE"]


def test_strays_gone_with_an_always_on_server_are_reported_after_the_outage(always_on):
    world = always_on
    _set_state(world, "net-a", NetState.READY)  # scaled to 0 by hand
    world.server("net-a").up = False
    _stray(world, "net-a")
    assert _notes(world, "net-a") == ["net-a: READY -> OUTAGE; no server: stray runs gone with it"]
    # One more while the outage goes on: the OUTAGE's replica is asked for again (always-on
    # means one replica), so this one waits for the new server to answer for it.
    _stray(world, "net-a")
    assert _notes(world, "net-a") == ["net-a: 1 stray run(s) unsettled"]
    assert world.driver("net-a").replicas == 1


def test_an_unreachable_server_that_still_runs_keeps_its_strays(always_on):
    world = always_on
    world.driver("net-a").replicas = 1
    _set_state(world, "net-a", NetState.READY)
    world.server("net-a").up = False  # the replica runs; its server does not answer
    _stray(world, "net-a")
    assert _notes(world, "net-a") == ["net-a: READY -> OUTAGE; 1 stray run(s) unsettled"]
