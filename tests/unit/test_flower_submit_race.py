"""The Flower adapter's submit racing another submit of the same token
(app/adapters/flower/client.py `_first_with_token`, seed 561): the token's first run is kept
and every later one is stopped while pending. A stop that does not land (the SuperLink
unreachable for that one call) must not leave the later run pending, to be started beside
the first: two live runs of one attempt."""

from __future__ import annotations

import httpx

from app.errors import DispatcherError
from tests.unit.test_flower_fakes import APP, SHORT, World, _ControlApi, token


class _Racing(_ControlApi):
    """Another submit of the same token starts its run just before this start-run lands;
    the next `stop_failures` stop-runs find the SuperLink unreachable."""

    stop_failures = 0
    raced = False

    def start_run(self, request: httpx.Request) -> httpx.Response:
        if not self.raced:
            self.raced = True
            self.world.cluster.submit(self.world.server, token(SHORT), self.world.clock.t)
        return super().start_run(request)

    def stop_run(self, request: httpx.Request) -> httpx.Response:
        if self.stop_failures:
            self.stop_failures -= 1
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return super().stop_run(request)


def _racing_world(stop_failures: int) -> World:
    w = World(real=True)
    w.api = _Racing(w)
    w.api.stop_failures = stop_failures
    w.client.api = w.api  # type: ignore[attr-defined]
    return w


def _live_of_token(w: World) -> set[str]:
    mine = {run.nvflare_id for run in w.server.store.values() if run.token == token(SHORT)}
    return mine & w.client.live_runs()


def test_a_racing_submit_keeps_the_first_run_and_stops_its_own() -> None:
    w = _racing_world(stop_failures=0)
    kept = w.client.submit(APP, token(SHORT))
    assert w.runs_of(token(SHORT)) == 2
    assert _live_of_token(w) == {kept}


def test_a_stop_that_does_not_land_leaves_no_second_live_run() -> None:
    w = _racing_world(stop_failures=1)
    try:
        kept: str | None = w.client.submit(APP, token(SHORT))
    except DispatcherError:
        kept = None  # an unknown outcome: the caller retries the submit
    if kept is None:
        kept = w.client.submit(APP, token(SHORT))  # the retry, the SuperLink answering again
    assert w.runs_of(token(SHORT)) == 2
    # Whatever the first call answered, once a submit has returned the kept run, the
    # token's other run is stopped: the job adopts one run, and no other will start.
    assert _live_of_token(w) == {kept}
    w.later(100.0)
    assert _live_of_token(w) <= {kept}
    assert w.client.find_run(token(SHORT)) == kept
