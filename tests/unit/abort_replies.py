"""Aborts whose answer goes astray after the server acted (it marked the run): the reply
lost (the client answers NOTHING_TO_ABORT, as for a ServerUnavailable) or garbled (an error
nobody classified escapes the client), as the fake server's `abort_reply` makes the shared
client contract answer (app.sim.admin.abort_answer). The next call answers normally again.
And the check that a stray run is held for exactly one start window."""

from __future__ import annotations

from app.errors import ServerUnavailable, UnknownAdminError
from app.usecases import abort


def reply_lost_after_the_server_acted(world, net: str = "net-a") -> None:
    """The next abort reaches the server (which marks the run) but its reply is lost: the
    client answers as it does for a ServerUnavailable (NOTHING_TO_ABORT); the server is
    reachable again for the next call (a blip, as the simulator's `_lose_reply`)."""
    world.server(net).abort_reply = ServerUnavailable("reply lost")


def reply_unclassified_after_the_server_acted(world, net: str = "net-a") -> None:
    """The next abort reaches the server (which marks the run) but answers with an error
    nobody classified (UnknownAdminError escapes the client: abort_on_server retries)."""
    world.server(net).abort_reply = UnknownAdminError("reply garbled")


def held_for_one_window(world, net: str = "net-a") -> None:
    """The net's one stray settles exactly RUN_START_WINDOW_S after its window started now
    (the status reads over meanwhile)."""
    assert abort.settle_stray_runs(world.rt, net) == 1
    world.clock.advance(abort.RUN_START_WINDOW_S - 1)
    assert abort.settle_stray_runs(world.rt, net) == 1
    world.clock.advance(1)
    assert abort.settle_stray_runs(world.rt, net) == 0
