"""Two dispatch steps of one attempt on a Flower net (a step re-driven beside itself, as the
step leases allow), through the use case and the real Flower adapter over a fake Control
API: the token's later run must never live beside the run the job adopted.

Worker B looks the token up (none yet) and is paused before its start-run; worker A's whole
dispatch runs meanwhile (its lookup finds nothing, it starts the token's first run, adopts
it: the job is RUNNING). B's start-run then starts a second run and its reply is lost: B's
submit raises, and its task retries. The adapter stops a later run only in a lookup
(`FlowerControlClient.find_run`), so the retry must look, though the job has moved on."""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.errors import ServerUnavailable
from app.runtime import RecordingOutbox, Runtime
from app.schemas import EnqueueJob
from app.settings import Settings
from app.usecases import declared_nets, dispatch, records
from app.usecases import enqueue as enqueue_uc
from app.usecases.dispatch import Step
from models import JobState
from tests.fakes import FakeDriver
from tests.fixtures.flower import APP
from tests.unit.test_flower_fakes import NET, World, _ControlApi, _RealOverFake


class _PausedStart(_ControlApi):
    """The first start-run waits while `meanwhile` runs (the other worker), then starts its
    run and loses its reply; the SuperLink then refuses the next `refused_after` calls."""

    meanwhile: object = None
    refused_after = 0
    refusing = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.refusing:
            self.refusing -= 1
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return super().__call__(request)

    def start_run(self, request: httpx.Request) -> httpx.Response:
        other, self.meanwhile = self.meanwhile, None
        if other is None:
            return super().start_run(request)
        other()  # type: ignore[operator]
        self.lose_next_start = True
        self.refusing = self.refused_after
        return super().start_run(request)


def _worker(settings: Settings, sessions, clock, api: _ControlApi) -> Runtime:
    """One worker process: its own Control API client of the one SuperLink."""
    return Runtime(
        settings=settings,
        engine=sessions.kw["bind"],
        sessions=sessions,
        clock=clock,
        driver_factory=lambda net, s: FakeDriver(replicas=1),
        admin_factory=lambda net, s: _RealOverFake(api),
        outbox=RecordingOutbox(),
    )


def enqueue(rt: Runtime, sessions, clock) -> tuple[uuid.UUID, int]:
    """A job of the Flower App enqueued for the net, claimed, the net seen ready: its id and
    attempt."""
    with sessions.begin() as session:
        declared_nets.sync_nets(session, rt.settings, clock())
        job_id = enqueue_uc.enqueue_job(
            session,
            rt.settings,
            EnqueueJob(caller_key="k", definition="flower-app", net=NET),
            clock(),
        ).job_id
    (assignment,) = dispatch.claim_and_start(rt)
    attempt = assignment.attempt
    assert dispatch.scale_up(rt, job_id, NET, attempt).step == Step.DONE
    assert dispatch.check_ready(rt, job_id, NET, attempt).step == Step.DONE
    return job_id, attempt


@pytest.fixture
def flower_settings(tmp_path: Path) -> Settings:
    root = tmp_path / "jobs"
    shutil.copytree(APP, root / "flower-app")
    net = {
        "name": NET,
        "backend": "flower",
        "driver": {"kind": "static"},
        "flower": {"address": f"{NET}.superlink:9093", "insecure": True},
        "required_sites": ["site-1", "site-2"],
    }
    return Settings(FL_DISPATCHER_DATA_DIR=tmp_path / "data", JOB_ROOT=root, NETS=json.dumps([net]))


@dataclass
class _Race:
    superlink: World
    token: str
    kept: str  # the run A started and the job adopted
    b: Runtime
    job_id: uuid.UUID
    attempt: int

    def live_of_token(self) -> set[str]:
        store = self.superlink.server.store.values()
        mine = {run.nvflare_id for run in store if run.token == self.token}
        return mine & self.superlink.client.live_runs()


def _race(flower_settings: Settings, sqlite_factory, clock, refused_after: int = 0) -> _Race:
    """B's submit paused before its start-run while A's runs whole; B's start-run starts the
    token's second run and loses its reply (then `refused_after` calls are refused)."""
    superlink = World(real=True)
    superlink.later(100.0)  # the SuperNodes are online
    api = _PausedStart(superlink)
    api.refused_after = refused_after
    a = _worker(flower_settings, sqlite_factory, clock, api)
    b = _worker(flower_settings, sqlite_factory, clock, api)
    job_id, attempt = enqueue(a, sqlite_factory, clock)
    with sqlite_factory.begin() as session:  # the attempt's submit begins: its token stored
        token = records.get_job(session, job_id).start_dispatch(clock())

    adopted: list[str] = []

    def worker_a() -> None:
        result = dispatch.dispatch(a, job_id, NET, attempt)
        assert result.step == Step.DONE
        adopted.append(result.detail)

    api.meanwhile = worker_a
    with pytest.raises(ServerUnavailable):  # B's start-run: its reply lost
        dispatch.dispatch(b, job_id, NET, attempt)
    with sqlite_factory() as session:
        job = records.get_job(session, job_id)
        assert (job.state, job.nvflare_job_id) == (JobState.RUNNING, adopted[0])
    assert superlink.runs_of(token) == 2  # A's, and B's whose reply was lost
    return _Race(superlink, token, adopted[0], b, job_id, attempt)


def test_a_submit_whose_reply_was_lost_stops_the_later_run_once_the_job_adopted_the_first(
    flower_settings: Settings, sqlite_factory, clock
) -> None:
    """Even at its last try (no retry follows: its retries spent, or its worker paused past
    the call's timeout there), B looks the token up before it raises."""
    race = _race(flower_settings, sqlite_factory, clock)
    assert race.live_of_token() == {race.kept}, "a later run lives beside the adopted one"


def test_a_retried_submit_stops_the_later_run_of_a_token_the_job_adopted_meanwhile(
    flower_settings: Settings, sqlite_factory, clock
) -> None:
    """The SuperLink unreachable for B's own look-up right after its lost reply: the retry,
    which finds the job RUNNING, looks again."""
    race = _race(flower_settings, sqlite_factory, clock, refused_after=1)
    dispatch.dispatch(race.b, race.job_id, NET, race.attempt)  # B's task retries
    assert race.live_of_token() == {race.kept}, "a later run lives beside the adopted one"


class _DuplicateDuringReadiness(_ControlApi):
    """While the first readiness check's list-nodes is on the wire, `meanwhile` runs (a
    duplicate chain of the same attempt, submitting)."""

    meanwhile: object = None

    def list_nodes(self, request: httpx.Request) -> httpx.Response:
        other, self.meanwhile = self.meanwhile, None
        if other is not None:
            other()  # type: ignore[operator]
        return super().list_nodes(request)


def test_the_readiness_sweep_never_stops_the_run_a_duplicate_chain_just_submitted(
    flower_settings: Settings, sqlite_factory, clock
) -> None:
    """Before a submit, a Flower net's readiness stops the runs no job counts (a run a
    restarted SuperLink revived from its database: app.usecases.revived_runs). A chain of
    the same attempt re-driven beside this one may have submitted the job meanwhile: its
    run is the job's, and must be left alone."""
    superlink = World(real=True)
    superlink.later(100.0)
    api = _DuplicateDuringReadiness(superlink)
    c = _worker(flower_settings, sqlite_factory, clock, api)
    d = _worker(flower_settings, sqlite_factory, clock, api)
    with sqlite_factory.begin() as session:
        declared_nets.sync_nets(session, flower_settings, clock())
        job_id = enqueue_uc.enqueue_job(
            session,
            flower_settings,
            EnqueueJob(caller_key="k", definition="flower-app", net=NET),
            clock(),
        ).job_id
    (assignment,) = dispatch.claim_and_start(c)
    attempt = assignment.attempt
    assert dispatch.scale_up(c, job_id, NET, attempt).step == Step.DONE
    submitted: list[str] = []

    def duplicate_chain() -> None:
        assert dispatch.check_ready(d, job_id, NET, attempt).step == Step.DONE
        result = dispatch.dispatch(d, job_id, NET, attempt)
        assert result.step == Step.DONE
        submitted.append(result.detail)

    api.meanwhile = duplicate_chain
    assert dispatch.check_ready(c, job_id, NET, attempt).step == Step.SKIPPED

    assert superlink.client.live_runs() == {submitted[0]}, "the job's own run was stopped"
    with sqlite_factory() as session:
        assert records.get_job(session, job_id).state == JobState.RUNNING
