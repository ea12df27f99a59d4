"""Aborts whose answer goes astray after the server acted (it marked the run): the reply
lost (the client answers NOTHING_TO_ABORT, as for a ServerUnavailable) or garbled (an error
nobody classified escapes the client). The next call answers normally again. And the check
that a stray run is held for exactly one start window."""

from __future__ import annotations

from app.adapters.nvflare.base import AbortOutcome, AbortResult
from app.errors import UnknownAdminError
from app.usecases import abort


def reply_lost_after_the_server_acted(world, net: str = "net-a") -> None:
    """The next abort reaches the server (which marks the run) but its reply is lost: the
    client answers as it does for a ServerUnavailable (NOTHING_TO_ABORT); the server is
    reachable again for the next call (a blip, as the simulator's `_lose_reply`)."""
    admin = world.admin(net)
    real = admin.abort

    def lost(nvflare_job_id: str) -> AbortResult:
        real(nvflare_job_id)
        admin.abort = real  # type: ignore[method-assign]
        return AbortResult(AbortOutcome.NOTHING_TO_ABORT, "server unavailable: reply lost")

    admin.abort = lost  # type: ignore[method-assign]


def reply_unclassified_after_the_server_acted(world, net: str = "net-a") -> None:
    """The next abort reaches the server (which marks the run) but answers with an error
    nobody classified (UnknownAdminError escapes the client: abort_on_server retries)."""
    admin = world.admin(net)
    real = admin.abort

    def garbled(nvflare_job_id: str) -> AbortResult:
        real(nvflare_job_id)
        admin.abort = real  # type: ignore[method-assign]
        raise UnknownAdminError("reply garbled")

    admin.abort = garbled  # type: ignore[method-assign]


def held_for_one_window(world, net: str = "net-a") -> None:
    """The net's one stray settles exactly RUN_START_WINDOW_S after its window started now
    (the status reads over meanwhile)."""
    assert abort.settle_stray_runs(world.rt, net) == 1
    world.clock.advance(abort.RUN_START_WINDOW_S - 1)
    assert abort.settle_stray_runs(world.rt, net) == 1
    world.clock.advance(1)
    assert abort.settle_stray_runs(world.rt, net) == 0
