"""The unit tier's fake admin client (tests/fakes.py) and the simulator's (app/sim/admin.py)
answer a server alike: what a client makes of a status read or an abort, a run that died
with its server, a reply lost after the server acted, is one contract (app.sim.admin's
`status_of` and `abort_answer`), whichever fake server stands behind it."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from app.adapters.backend import AbortOutcome, AbortResult, RunState
from app.errors import ServerUnavailable
from app.sim.admin import SimAdmin
from app.sim.clock import SimClock
from app.sim.cluster import Cluster
from app.sim.faults import CLEAN, FaultProfile
from app.sim.workload import JobSpec, NetSpec
from tests.fakes import FakeAdmin, FakeServer

JOB = str(uuid.UUID(int=1))
TOKEN = f"{JOB}-0"


class _Host:
    """What the simulator's platform calls back: no hook does anything."""

    def __init__(self, faults: FaultProfile, spec: JobSpec) -> None:
        self.clock = SimClock()
        self.rng = random.Random(0)
        self.rng_msg = random.Random(1)
        self.faults = faults
        self._spec = spec

    def trace(self, line: str) -> None: ...

    def hook(self, point: str, net: str | None) -> None: ...

    def reader(self) -> int | None:
        return None

    def report(self, invariant: str, subject: str, detail: str) -> None: ...

    def on_submit(self, net: str, token: str, folder: Path, *, repeat: bool = False) -> None: ...

    def on_scale(self, net: str, replicas: int) -> None: ...

    def job_spec(self, job_id: str) -> JobSpec | None:
        return self._spec if job_id == JOB else None

    def scales_to_zero(self, net: str) -> bool:
        return True


def _sim(case: str) -> tuple[AbortResult, RunState, bool]:
    """The simulator's admin client aborting a run of `case`, then its status read."""
    faults = CLEAN.with_(lost_reply=1.0) if case == "reply lost" else CLEAN
    sites = ("site-9",) if case == "not started" else ()  # a site that never connects
    host = _Host(faults, JobSpec("job", 0.0, duration_s=None, sites=sites))
    cluster = Cluster(host, (NetSpec("net-a", kind="static"),), random.Random(0))
    host.clock.advance(100.0)  # booted, sites connected
    admin = SimAdmin(cluster, "net-a")
    host.faults = CLEAN  # the submit's reply arrives
    run_id = admin.submit(Path("job"), TOKEN)
    host.faults = faults
    if case == "restarted":
        cluster.crash("net-a", host.clock.t, 5.0)
        host.clock.advance(20.0)
    answer = admin.abort(run_id)
    host.faults = CLEAN
    status = admin.job_status(run_id)
    return answer, status.state, status.unstarted


def _fake(case: str) -> tuple[AbortResult, RunState, bool]:
    """The unit tier's fake admin client aborting a run of `case`, then its status read."""
    server = FakeServer()
    admin = FakeAdmin(server)
    run_id = admin.submit(Path("job"), TOKEN)
    if case == "not started":
        server.statuses[run_id] = "SUBMITTED"
    if case == "restarted":
        server.restart()
    if case == "reply lost":
        server.abort_reply = ServerUnavailable("reply lost")
    answer = admin.abort(run_id)
    status = admin.job_status(run_id)
    return answer, status.state, status.unstarted


@pytest.mark.parametrize(
    ("case", "outcome", "state", "unstarted"),
    [
        ("running", AbortOutcome.ABORTED, RunState.ABORTED, False),
        ("not started", AbortOutcome.ABORTED_BEFORE_START, RunState.ABORTED, True),
        ("restarted", AbortOutcome.NOT_RUNNING, RunState.RUNNING, False),
        ("reply lost", AbortOutcome.NOTHING_TO_ABORT, RunState.ABORTED, False),
    ],
)
def test_both_admin_fakes_answer_an_abort_alike(case, outcome, state, unstarted):
    for answer, after, not_started in (_sim(case), _fake(case)):
        assert (answer.outcome, after, not_started) == (outcome, state, unstarted)
    sim, fake = _sim(case)[0], _fake(case)[0]
    # The same words up to the server's own (its error text after the colon).
    assert sim.detail.split(":")[0] == fake.detail.split(":")[0], (sim, fake)
