"""The dispatch chain: claim jobs onto nets, scale up, wait until ready, submit.

Every step acts only on the (job, net, attempt) it was started for, so a step of a chain
that gave up, or a duplicate delivery, never touches the job's next attempt on another net.
Every function is idempotent: it re-reads the rows it acts on, does nothing if the work is
done, and keeps calls to a driver or an NVFLARE server OUTSIDE any transaction that holds a
row lock (a slow server must never block the queue). Follow-up tasks go out through
`rt.outbox` only after the transaction that made them necessary has committed.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session

from app import names, traces
from app.adapters.backend import Readiness
from app.adapters.jobdefs import check_available, materialize, prepare
from app.db import unit_of_work
from app.errors import (
    DispatcherError,
    InvalidRequest,
    JobOutcomeError,
    MisconfigurationError,
    TransientError,
)
from app.net_config import NetConfig
from app.runtime import Runtime
from app.usecases import (
    adopted_runs,
    claims,
    records,
    refused_definitions,
    revived_runs,
    unknown_submit,
)
from app.usecases.outages import start_age_s
from app.usecases.retries import submit_try_s
from app.usecases.scaling import (
    kick,
    net_misconfigured,
    scale_down_or_log,
    scale_net,
)
from app.usecases.step_leases import hold, poll_lease_s, step_try_s
from models import Job, JobState, NetState

log = logging.getLogger(__name__)


class Step(StrEnum):
    """What a pipeline step did."""

    DONE = "done"
    SKIPPED = "skipped"  # the job moved on (aborted, requeued, already done): nothing to do
    NOT_READY = "not_ready"  # poll again
    GAVE_UP = "gave_up"  # past the deadline: job requeued, net marked
    DISPATCHED = "dispatched"  # a warm net: the whole chain's work was done in this step

    @property
    def ends_chain(self) -> bool:
        """A chain stops after a step that skipped or gave up (its attempt is over), or that
        already submitted the job (nothing is left for the later steps)."""
        return self in (Step.SKIPPED, Step.GAVE_UP, Step.DISPATCHED)


@dataclass(frozen=True)
class StepResult:
    """A step's outcome with a reason for the log and the test."""

    step: Step
    detail: str = ""
    warm: bool = False  # scale_up: the server was up already (nothing had to be started)


def claim_and_start(
    rt: Runtime,
    limit: int = 50,  # a bound per round: the next round claims the rest
) -> list[claims.Assignment]:
    """Claim QUEUED jobs onto free nets, one transaction per claim, and start a pipeline
    for each after its claim has committed."""
    claimed = []
    for _ in range(limit):
        started = traces.clock()
        with unit_of_work(rt.sessions) as session:
            assignment = claims.claim_next_job(session, rt.settings, rt.clock())
        if assignment is None:
            break
        job_id, net, attempt = str(assignment.job_id), assignment.net_name, assignment.attempt
        with traces.claimed(assignment, started):  # the chain carries the job's trace
            rt.outbox.start_pipeline(job_id, net, attempt)
        claimed.append(assignment)
    return claimed


def _ours(job: Job, state: JobState, net_name: str, attempt: int) -> bool:
    return job.state == state and job.net_name == net_name and job.attempts == attempt


def _assigned(session: Session, job_id: uuid.UUID, net_name: str, attempt: int) -> Job | None:
    job = records.get_job(session, job_id)
    return job if _ours(job, JobState.ASSIGNED, net_name, attempt) else None


@traces.job_step("scale_up")
def scale_up(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int) -> StepResult:
    """Step 1: check the job's bundle is there (a missing one fails the job before any
    scale-up), ask the net's driver for one replica (no-op for a warm or always-on net), and
    fetch the bundle while the server boots, so the download does not add to a cold start."""
    if not rt.settings.has_net(net_name):
        return _undeclared(net_name)
    with unit_of_work(rt.sessions) as session:
        job = _assigned(session, job_id, net_name, attempt)
        if job is None:
            # A chain retried from its first step after its submit's reply was lost: if the
            # job adopted a run of this attempt meanwhile, the token is looked up as in
            # `_dispatch`, outside the transaction (simulation seed 508: else the token's
            # later run lives on).
            adopted = adopted_runs.adopted_token(
                records.get_job(session, job_id), net_name, attempt
            )
        else:
            # Its worker is heard of again by the end of this try: killed in it, the job is
            # re-driven soon after (step_leases), not only past the readiness deadline.
            hold(job, rt.clock(), step_try_s(rt.settings))
            net_state = records.get_net(session, net_name).state
            definition = job.definition
    if job is None:
        if adopted is not None:
            adopted_runs.look_up(rt, net_name, adopted)  # TransientError: the step retries
        return StepResult(Step.SKIPPED, "job no longer assigned to this net and attempt")
    try:
        check_available(rt.settings, definition)  # TransientError -> the task retries
    except (InvalidRequest, JobOutcomeError) as exc:
        return _reject_definition(rt, job_id, net_name, (JobState.ASSIGNED, attempt), exc)
    try:
        warm = True
        net_config = rt.settings.net(net_name)
        if net_config.always_on and not _left_at_zero(rt, net_config, net_state):
            detail = "always-on net: never scaled"
        elif net_config.always_on:
            # Claimed from a state scale-to-zero mode left (STOPPED at zero replicas) before
            # reconcile's watch asked for its replica: nothing else would ever ask for it.
            scale_net(rt, net_name, 1, "always-on net: one replica")
            detail = "driver asked for 1 replica"
            warm = False
        elif net_state in (NetState.READY, NetState.BUSY) and rt.driver(net_name).observe().is_up:
            # A warm net is reused as is; but one whose server died unnoticed is scaled again.
            detail = "server already up"
        else:
            scale_net(rt, net_name, 1, f"job {job_id} assigned")
            detail = "driver asked for 1 replica"
            warm = False
    except MisconfigurationError as exc:
        return _misconfigured(rt, net_name, job_id, exc, (JobState.ASSIGNED, attempt))
    try:
        materialize(rt.settings, definition, job_id)  # cached: dispatch finds it there
    except (InvalidRequest, JobOutcomeError) as exc:
        return _reject_definition(rt, job_id, net_name, (JobState.ASSIGNED, attempt), exc)
    return StepResult(Step.DONE, detail, warm=warm)


def _left_at_zero(rt: Runtime, net_config: NetConfig, net_state: NetState) -> bool:
    """A scalable always-on net claimed from a down state with no replica asked for."""
    return (
        net_config.driver.kind != "static"
        and net_state == NetState.STARTING
        and rt.driver(net_config.name).observe().desired < 1
    )


def start(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int) -> StepResult:
    """The chain's first step: scale_up, and on a warm net the rest of the chain in the same
    task. A net whose server is up already and ready at once gets its job submitted here,
    which saves two task round trips (wait_ready, dispatch) on the broker; anything else
    (a server being started, a site missing) is left to the chain's wait_ready and dispatch.

    A retry of this step after its submit failed transiently finds the job DISPATCHING for
    this attempt and resumes the submit with the stored token, as a retried dispatch step
    does; every other step of the chain keeps its (job, net, attempt) guard.
    """
    scaled = scale_up(rt, job_id, net_name, attempt)
    # `and`: only a skipped scale_up pays the read (test_a_warm_start_does_not_ask_whether_
    # the_job_is_resuming).
    if scaled.step == Step.SKIPPED and _resuming(rt, job_id, net_name, attempt):
        return _whole_chain(dispatch(rt, job_id, net_name, attempt))
    if scaled.step != Step.DONE or not scaled.warm:
        return scaled
    # scale_up has just seen the server up: readiness need not ask the driver again.
    ready = check_ready(rt, job_id, net_name, attempt, server_seen_up=True)
    if ready.step != Step.DONE:
        return ready  # NOT_READY: wait_ready polls on; SKIPPED/GAVE_UP: the chain ends
    return _whole_chain(dispatch(rt, job_id, net_name, attempt))


def _undeclared(net_name: str) -> StepResult:
    """A step in flight for a net a redeploy removed from NETS: nothing here can reach it any
    more. The chain ends; reconcile settles the job once the net is known removed."""
    return StepResult(Step.SKIPPED, f"net {net_name} is no longer declared (NETS)")


def _resuming(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int) -> bool:
    # Asked only when scale_up skipped, so the warm path pays no extra transaction.
    with rt.sessions() as session:
        return _ours(records.get_job(session, job_id), JobState.DISPATCHING, net_name, attempt)


def _whole_chain(result: StepResult) -> StepResult:
    if result.step == Step.DONE:
        return StepResult(Step.DISPATCHED, result.detail)
    return result


def _reject_definition(
    rt: Runtime,
    job_id: uuid.UUID,
    net_name: str,
    attempt: tuple[JobState, int],
    exc: DispatcherError,
    *,
    may_have_sent: bool = True,
) -> StepResult:
    moved_on = refused_definitions.fail_job(
        rt, job_id, net_name, attempt, exc, may_have_sent=may_have_sent
    )
    if moved_on is not None:
        return StepResult(Step.SKIPPED, f"job moved on ({moved_on}); not failed")
    return StepResult(Step.GAVE_UP, str(exc))


def _misconfigured(
    rt: Runtime,
    net_name: str,
    job_id: uuid.UUID,
    exc: MisconfigurationError,
    ours: tuple[JobState, int],
) -> StepResult:
    """A step met a misconfigured net: it marks the net and requeues its job, then fails
    loud (the error is raised, the chain ends); a step whose job moved on meanwhile (a late
    or duplicate one: its job is RUNNING, or on another attempt) leaves both to the job's
    owner and ends quietly, instead of raising for a net it did not mark."""
    if net_misconfigured(rt, net_name, job_id, str(exc), attempt=ours):
        raise exc
    return StepResult(Step.SKIPPED, f"job moved on; net {net_name} misconfigured: {exc}")


@traces.job_step("readiness_poll")
def check_ready(
    rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int, *, server_seen_up: bool = False
) -> StepResult:
    """Step 2: is the net ready for this job? Driver running, the server answering an admin
    command (the live session's, else a fresh login's), every required site connected. Past
    the readiness deadline: give up."""
    if not rt.settings.has_net(net_name):
        return _undeclared(net_name)
    return _check_ready(rt, job_id, net_name, attempt, server_seen_up=server_seen_up)


def _check_ready(
    rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int, *, server_seen_up: bool
) -> StepResult:
    now = rt.clock()
    net_config = rt.settings.net(net_name)
    with unit_of_work(rt.sessions) as session:
        job = _assigned(session, job_id, net_name, attempt)
        if job is None:
            return StepResult(Step.SKIPPED, "job no longer assigned to this net and attempt")
        # This poll, then READY_POLL_S until the next one: a worker killed in either is
        # known gone one lease later.
        hold(job, now, poll_lease_s(rt.settings))
        required = list(job.required_sites)
        assigned_at = job.assigned_at or now

    readiness: Readiness | None = None
    detail: str  # set on every path below that goes on to read it
    try:
        skip_driver = net_config.always_on or server_seen_up
        observation = None if skip_driver else rt.driver(net_name).observe()
        if observation is not None and observation.failure:
            return _give_up_readiness(
                rt, job_id, net_name, attempt, f"driver: {observation.failure}"
            )
        if observation is not None and not observation.is_up:
            detail = (
                f"driver: desired={observation.desired} running={observation.running} "
                f"pending={observation.pending}"
            )
        else:
            readiness, detail = _server_readiness(rt, job_id, net_name, attempt, required)
    except MisconfigurationError as exc:  # wrong kit or CA, missing service: never "down"
        return _misconfigured(rt, net_name, job_id, exc, (JobState.ASSIGNED, attempt))
    except TransientError as exc:
        detail = f"transient: {exc}"

    if readiness is not None and readiness.ready:
        with unit_of_work(rt.sessions) as session:
            net = records.get_net(session, net_name, lock=True)
            # Re-checked under the lock: a duplicate chain may have dispatched the job while
            # this check ran, and a late "ready" must never flip a BUSY net back to READY.
            if _assigned(session, job_id, net_name, attempt) is None:
                return StepResult(Step.SKIPPED, "job moved on while its net was checked")
            if net.state in (NetState.STARTING, NetState.UNHEALTHY, NetState.OUTAGE):
                net.transition(NetState.READY, rt.clock(), f"ready for job {job_id}")
            if readiness.server_start_time is not None:
                net.server_start_time = readiness.server_start_time
            net.answered()
        return StepResult(Step.DONE, "ready")

    # From the claim, or from the first ask for the replica when the chain's scale_up ran
    # late (its message waited out a broker outage): a boot is never given up at its ask.
    # Only an ask the driver took: a try it refused was retried, maybe late (the outage).
    if start_age_s(rt, net_name, assigned_at, now, taken=True) > net_config.ready_timeout_s:
        reason = f"not ready after {net_config.ready_timeout_s:.0f}s: {detail}"
        if readiness is not None and readiness.missing_sites:
            # The server answers; only the job's sites never came: the job's problem (a
            # typo, a site offline), never the net's health.
            return _give_up_on_sites(rt, job_id, net_name, attempt, reason)
        return _give_up_readiness(rt, job_id, net_name, attempt, reason)
    return StepResult(Step.NOT_READY, detail)


def _server_readiness(
    rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int, required: list[str]
) -> tuple[Readiness | None, str]:
    """The server's readiness for the job and why it is not ready; a server that answers
    with every site connected is not ready either while it holds runs no job counts
    (`revived_runs`: stopped first)."""
    readiness = rt.admin(net_name).is_ready(required)
    detail = readiness.detail or f"missing sites {list(readiness.missing_sites)}"
    if readiness.ready:
        held = revived_runs.stop_before_submit(rt, job_id, net_name, attempt)
        if held is not None:
            return None, held
    return readiness, detail


def _give_up_on_sites(
    rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int, reason: str
) -> StepResult:
    """Requeue (an attempt spent) a job whose required sites never connected to a server
    that answers; the net stays as it is, to its idle grace or the next job."""
    with unit_of_work(rt.sessions) as session:
        if _assigned(session, job_id, net_name, attempt) is None:
            return StepResult(Step.SKIPPED, "job moved on before the readiness deadline")
        net = records.get_net(session, net_name, lock=True)
        records.requeue_job(session, job_id, reason, rt.clock())
        if net.state == NetState.STARTING:
            net.transition(NetState.READY, rt.clock(), "up; the job's sites never came")
            net.idle_since = rt.clock()
    log.warning("required sites never connected", extra={"net": net_name, "job": str(job_id)})
    kick(rt)
    return StepResult(Step.GAVE_UP, reason)


def _give_up_readiness(
    rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int, reason: str
) -> StepResult:
    """Requeue the job and mark the net: UNHEALTHY (scaled down) or, always-on, OUTAGE."""
    always_on = rt.settings.net(net_name).always_on
    with unit_of_work(rt.sessions) as session:
        if _assigned(session, job_id, net_name, attempt) is None:
            return StepResult(Step.SKIPPED, "job moved on before the readiness deadline")
        records.requeue_job(session, job_id, reason, rt.clock())
        net = records.get_net(session, net_name, lock=True)
        target = NetState.OUTAGE if always_on else NetState.UNHEALTHY
        if net.state in (NetState.STARTING, NetState.READY):
            net.transition(target, rt.clock(), reason)
        net.last_error = reason
    log.error(
        "net not ready past its deadline",
        extra={"net": net_name, "job": str(job_id), "reason": reason},
    )
    if not always_on:
        scale_down_or_log(rt, net_name, "readiness deadline passed")
    kick(rt)
    return StepResult(Step.GAVE_UP, reason)


@traces.job_step("submit")
def dispatch(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int) -> StepResult:
    """Step 3: submit with the submit token stored FIRST, so a retry after an unknown
    outcome or a redelivered message finds the same NVFLARE job instead of a second run."""
    if not rt.settings.has_net(net_name):
        return _undeclared(net_name)
    return _dispatch(rt, job_id, net_name, attempt)


@dataclass(frozen=True)
class _Submit:
    """What a submit sends, read under the job's lock as the submit begins."""

    token: str
    definition: str
    sites: list[str]
    metadata: dict[str, Any] | None
    # This try stored the token (ASSIGNED -> DISPATCHING): no earlier try sent a submit with it.
    fresh: bool = False


def _begin_submit(
    rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int
) -> _Submit | tuple[StepResult, str | None]:
    """The submit to send for this attempt (its token stored first, its lease renewed), or
    the step's skip and this attempt's token if the job adopted a run of it meanwhile."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        fresh = _ours(job, JobState.ASSIGNED, net_name, attempt)
        if fresh:
            token = job.start_dispatch(rt.clock(), earlier=records.dispatches_of(session, job_id))
        elif _ours(job, JobState.DISPATCHING, net_name, attempt) and job.submit_token:
            token = job.submit_token
        else:
            result = StepResult(Step.SKIPPED, f"job is {job.state} (attempt {job.attempts})")
            return result, adopted_runs.adopted_token(job, net_name, attempt)
        job.step_due_at = rt.clock() + timedelta(seconds=submit_try_s(rt.settings))
        return _Submit(token, job.definition, list(job.required_sites), job.metadata_, fresh)


def _dispatch(rt: Runtime, job_id: uuid.UUID, net_name: str, attempt: int) -> StepResult:
    begun = _begin_submit(rt, job_id, net_name, attempt)
    if not isinstance(begun, _Submit):
        # Outside the transaction: the lookup is a call to the server.
        result, adopted = begun
        if adopted is not None:
            adopted_runs.look_up(rt, net_name, adopted)  # TransientError: the step retries
        return result
    token, definition, sites, metadata = begun.token, begun.definition, begun.sites, begun.metadata

    admin = rt.admin(net_name)
    ours = (JobState.DISPATCHING, attempt)
    sending = False
    try:
        bundle = materialize(rt.settings, definition, job_id)
        folder = prepare(rt.settings, bundle, job_id, sites, metadata)
        if not unknown_submit.hold_submit(rt, job_id, net_name, attempt, token):
            return StepResult(Step.SKIPPED, "job moved on while its copy was prepared")
        sending = True
        nvflare_job_id = admin.submit(  # TransientError -> the task retries
            folder,
            token,
            required_sites=sites,
            resource_spec=(metadata or {}).get("resource_spec"),
        )
    except (InvalidRequest, JobOutcomeError) as exc:
        # A refusal of the submit itself is after it was sent: a stray is kept then too.
        sent = sending or not begun.fresh
        return _reject_definition(rt, job_id, net_name, ours, exc, may_have_sent=sent)
    except MisconfigurationError as exc:
        return _misconfigured(rt, net_name, job_id, exc, ours)
    except TransientError:
        adopted_runs.after_unknown_submit(rt, job_id, net_name, attempt)
        raise
    try:
        start_time: float | None = admin.server_start_time()
    except DispatcherError:
        start_time = None  # keep the one readiness stored; monitor fills a missing one

    abort_needed: bool = False  # annotated: mypy refuses None here, which reads as False
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, job_id, lock=True)
        if job.state == JobState.DISPATCHING and job.submit_token == token:
            records.mark_dispatched(session, job_id, nvflare_job_id, start_time, rt.clock())
        elif job.state == JobState.ABORTING and job.submit_token == token:
            # Aborted while the submit was in flight: the run exists now, so stop it.
            job.nvflare_job_id = nvflare_job_id
            abort_needed = True
        elif job.nvflare_job_id == nvflare_job_id:
            pass  # a repeated delivery already recorded it
        else:
            # The job moved on while the submit was in flight (flip-api ended it, or it was
            # requeued): this run counts for nobody, so it is stopped, never left running.
            records.add_stray_run(
                session,
                net_name=net_name,
                job_id=job_id,
                nvflare_job_id=nvflare_job_id,
                submit_token=token,
                reason=f"submit landed for a job that is {job.state}",
                now=rt.clock(),
            )
            abort_needed = True
    if abort_needed:
        rt.outbox.send(names.ABORT_ON_SERVER, job_id=str(job_id))
        rt.outbox.send(names.SETTLE_STRAY_RUNS, net_name=net_name)
        return StepResult(Step.SKIPPED, f"run {nvflare_job_id} landed after the job moved on")
    log.info(
        "job dispatched",
        extra={"job": str(job_id), "net": net_name, "nvflare_job_id": nvflare_job_id},
    )
    return StepResult(Step.DONE, nvflare_job_id)
