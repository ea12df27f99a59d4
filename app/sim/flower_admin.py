"""The simulated client of a Flower net: what app.adapters.flower.client does over the Control
API, on top of a SimServer whose runs are a SuperLink's (app.sim.superlink), with the
admin fake's injected faults (its latency, failures before acting, replies lost after it).

Where it differs from the NVFLARE fake (app.sim.admin), as the real adapters differ:

- `submit` first looks for a run whose config carries the token (list-runs), and starts a
  new one only if there is none (start-run): a lost reply's run is adopted by the retry,
  never started twice. Between the two calls nothing fences another submit of the same
  token but the dispatcher's lease on the attempt (a hook point lies between them).
- `submit` packs the folder into a FAB first, as the client does (`build_fab`: a malformed
  pyproject.toml is an invalid definition before any call), where the folder holds one: the
  sweep's Flower jobs otherwise carry the NVFLARE stand-in bundle (app.sim.bundles).
- A start-run's reply may be lost on purpose (`SuperLink.lose_reply_of`, the adversary's
  race of two submits of one attempt): the run started, the caller sees ServerUnavailable.
- `server_start_time` is `NO_START_TIME` whenever the SuperLink answers; readiness carries
  it too.
- `job_status` maps the run's record with the real `classify.run_status`; `live_runs` lists
  every run whose record is not finished (a dead run's too, until its token expires).
- `abort` sends the stop first: unknown run or a SuperLink down NOTHING_TO_ABORT, a
  finished run ALREADY_FINISHED, else ABORTED (final: never ABORTED_BEFORE_START or
  NOT_RUNNING); a SuperLink that refuses every stop (`SuperLink.refuses_stops`) answers
  with an error the client cannot classify (UnknownAdminError escapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.adapters.backend import (
    AbortOutcome,
    AbortResult,
    AdminClient,
    RunStatus,
)
from app.adapters.flower import classify
from app.adapters.flower.client import NO_START_TIME
from app.adapters.flower.fab import CONFIG_FILE, build_fab
from app.errors import (
    NvflareJobNotFound,
    NvflareJobNotRunning,
    ServerUnavailable,
    UnknownAdminError,
)
from app.net_config import NetConfig
from app.sim import superlink
from app.sim.admin import SimAdmin
from app.sim.cluster import Cluster
from app.sim.servers import Run, SimServer


def admin_for(cluster: Cluster, net: NetConfig) -> AdminClient:
    """The fake client of the net's backend, as app.runtime builds the real one."""
    if net.backend == "flower":
        return FlowerSimAdmin(cluster, net.name)
    return SimAdmin(cluster, net.name)


class FlowerSimAdmin(SimAdmin):
    """One worker process's Control API client of a Flower net's SuperLink."""

    UNCLASSIFIED = "unclassified Control API answer"
    SITES_WORD = "SuperNodes"

    def server_start_time(self) -> float:
        self._reach("server_start_time")  # list-nodes: the SuperLink answers
        return NO_START_TIME

    def _ready_start_time(self, server: SimServer) -> float | None:
        return NO_START_TIME  # the Flower adapter's: a SuperLink has none to give

    def submit(
        self,
        job_folder: Path,
        submit_token: str,
        *,
        required_sites: Sequence[str] = (),
        resource_spec: Any = None,
    ) -> str:
        host = self.cluster.host
        if (job_folder / CONFIG_FILE).is_file():
            build_fab(job_folder)  # InvalidRequest for a malformed Flower App
        self.cluster.crash_before_submit(self.net, host.clock.t)
        existing = self._started_run(submit_token)
        if existing is not None:
            return existing  # the adapter keeps it: nothing reaches the SuperLink as a submit
        server = self._reach("submit")  # start-run
        host.on_submit(self.net, submit_token, job_folder)
        run = self.cluster.submit(server, submit_token, host.clock.t)
        host.hook("admin.submit.after", self.net)
        if isinstance(server, superlink.SuperLink) and server.lose_reply_of == submit_token:
            server.lose_reply_of = None
            self._connected = False
            raise ServerUnavailable(f"{self.net}: start-run sent, reply lost (simulated)")
        self._lose_reply("submit")
        # The adapter's re-check (FlowerControlClient._first_with_token): a run the token
        # started meanwhile is kept and this one stopped while pending (seed 561), by
        # `find_run`, which raises if the stop does not land.
        first = self.find_run(submit_token)
        return run.nvflare_id if first is None else first

    def _started_run(self, submit_token: str) -> str | None:
        """The adapter's lookup before a start-run (FlowerControlClient.submit)."""
        return self.find_run(submit_token)

    def find_run(self, submit_token: str) -> str | None:
        """The first run whose config carries the token, as the adapter keeps it: a later
        one still live is stopped, and ServerUnavailable if that stop does not land."""
        server = self._listed("find_run")
        runs = [run for run in server.store.values() if run.token == submit_token]
        if not runs:
            return None
        first = runs[0].nvflare_id
        for run in runs[1:]:
            if superlink.record(run, self.cluster.host.clock.t)[0] == superlink.FINISHED:
                continue
            result = self.abort(run.nvflare_id)
            if result.outcome is AbortOutcome.NOTHING_TO_ABORT and (
                superlink.record(run, self.cluster.host.clock.t)[0] != superlink.FINISHED
            ):
                raise ServerUnavailable(
                    f"{self.net}: run {run.nvflare_id} of token {submit_token} not stopped "
                    f"(simulated): {result.detail}"
                )
        return first

    def _listed(self, op: str) -> SimServer:
        """The SuperLink, for a list of its runs: refused while `lists_refused` is set."""
        server = self._reach(op)
        if isinstance(server, superlink.SuperLink) and server.lists_refused:
            self._connected = False
            raise ServerUnavailable(f"{self.net}: ListRuns refused (simulated)")
        return server

    def _record(self, nvflare_job_id: str) -> tuple[Run, tuple[str, str, str, str]]:
        server = self._reach("job_status")
        run = server.store.get(nvflare_job_id)
        if run is None:
            raise NvflareJobNotFound(f"{self.net}: Run ID not found (simulated)")
        return run, superlink.record(run, self.cluster.host.clock.t)

    def job_status(self, nvflare_job_id: str) -> RunStatus:
        run, (status, sub_status, details, running_at) = self._record(nvflare_job_id)
        if run.poisoned:
            raise UnknownAdminError(f"{self.net}: run {nvflare_job_id} has no status")
        if status == superlink.FINISHED:
            server = self.server
            reader = self.cluster.host.reader()
            if reader is None:
                server.finished_seen.add(nvflare_job_id)
            else:
                server.finished_read.setdefault(reader, set()).add(nvflare_job_id)
        return classify.run_status(status, sub_status, details, running_at)

    def live_runs(self) -> frozenset[str]:
        """The runs whose record is not finished (pending, starting or running)."""
        server = self._listed("live_runs")
        t = self.cluster.host.clock.t
        return frozenset(
            run.nvflare_id
            for run in server.store.values()
            if superlink.record(run, t)[0] != superlink.FINISHED
        )

    def abort(self, nvflare_job_id: str) -> AbortResult:
        """StopRun, as FlowerControlClient.abort answers it."""
        try:
            self._stop(nvflare_job_id)
        except ServerUnavailable as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"SuperLink unavailable: {exc}")
        except NvflareJobNotFound as exc:
            return AbortResult(AbortOutcome.NOTHING_TO_ABORT, f"unknown run: {exc}")
        except NvflareJobNotRunning as exc:
            return AbortResult(AbortOutcome.ALREADY_FINISHED, str(exc))
        return AbortResult(AbortOutcome.ABORTED, "Flower finished:stopped")

    def _stop(self, nvflare_job_id: str) -> None:
        """The stop on the SuperLink: the record reads finished:stopped at once, for good."""
        server = self._reach("abort")
        run = server.store.get(nvflare_job_id)
        if run is None:
            raise NvflareJobNotFound(f"{self.net}: Run ID not found (simulated)")
        t = self.cluster.host.clock.t
        if superlink.record(run, t)[0] == superlink.FINISHED:
            raise NvflareJobNotRunning(f"{self.net}: run {nvflare_job_id} already finished")
        if isinstance(server, superlink.SuperLink) and server.refuses_stops(t):
            raise UnknownAdminError(f"{self.net}: StopRun refused (simulated, for good)")
        run.aborted_at, run.revives_at = t, None
        self.cluster.host.hook("admin.abort.after", self.net)
        self._lose_reply("abort")
