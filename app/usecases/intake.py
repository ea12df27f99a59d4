"""What a caller asks for, as one use case each, whichever door it comes through (Celery
task, HTTP route, CLI): store it, then send the follow-up work through the outbox after the
commit. A lost follow-up loses nothing: beat's assigner and the reconciler find the rows."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session

from app import names, read_models, traces
from app.db import unit_of_work
from app.errors import CallerKeyConflict, InvalidRequest, quoted
from app.runtime import Runtime
from app.schemas import (
    CALLER_KEY_MAX_CHARS,
    EnqueueJob,
    ReportJobStatus,
    job_id_for,
    recorded_caller_key,
    storable,
    unstorable,
)
from app.usecases import early_aborts, enqueue, id_probe, kicks, records
from models import Job, JobState, ReasonCode

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Misshapen:
    """A request not sent as its one `payload` kwarg (`request_payload`): what it carried,
    taken as its payload only to be refused (`parse_payload`) under the key it names."""

    sent: Any
    reason: str


def request_payload(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A flip-api request's payload as its task was sent: its one `payload` kwarg, or a
    `Misshapen` naming the shape it came in (its fields as the kwargs, the payload as a
    positional argument, or more than the payload): never taken as a request, refused with
    its reason and recorded where that request's refusals are. What it carried (the
    `payload` kwarg, else the other kwargs, else the first positional argument) gives the
    refusal its caller_key."""
    if not args and set(kwargs) == {"payload"}:
        return kwargs["payload"]
    if "payload" in kwargs:
        sent = kwargs["payload"]
    elif kwargs:
        sent = kwargs
    else:
        sent = args[0] if args else None
    return Misshapen(
        sent, f"send one `payload` kwarg: the message came with {_shape(args, kwargs)}"
    )


def _shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = []
    if args:
        parts.append(f"{len(args)} positional argument{'s' if len(args) != 1 else ''}")
    if kwargs:
        names = sorted(kwargs)
        shown = ", ".join(repr(name[:40]) for name in names[:8])
        parts.append(f"kwargs {shown}{', ...' if len(names) > 8 else ''}")
    return " and ".join(parts) or "no arguments"


def parse_payload(model: type[M], payload: Any) -> M:
    """A public task's payload as its model; one pydantic refuses is an InvalidRequest
    naming each field's problem (the task and the simulator's mirror of it share this), and
    a misshapen message's (`Misshapen`) names its shape, whatever it carried."""
    if isinstance(payload, Misshapen):
        raise InvalidRequest(payload.reason)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(f"invalid {model.__name__} payload: {problems}") from None


def caller_key_of(payload: Any) -> str | None:
    """The caller_key a refused payload carries, if any, whole: cut, it could name another
    request (`recorded_caller_key` stores a long one without losing which one it was)."""
    if isinstance(payload, Misshapen):
        payload = payload.sent  # refused for its shape, under the key it carried
    key = payload.get("caller_key") if isinstance(payload, dict) else None
    if isinstance(key, uuid.UUID):
        key = str(key)  # kombu's json decodes a UUID a Python caller sent as its key
    if isinstance(key, int) and not isinstance(key, bool):
        # A JSON number (a caller whose run ids are numbers): refused by the model, but
        # under its decimal text, so the caller can tie the refusal to its request.
        try:
            key = str(key)
        except ValueError:  # more digits than str() writes (4,300)
            return None
    if isinstance(key, bytes):
        # kombu's json carries bytes back as bytes, and the payload's model reads them as
        # their UTF-8 text: the refusal is that key's too.
        try:
            key = key.decode()
        except UnicodeDecodeError:
            return None
    return key if isinstance(key, str) and key else None


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submitted:
    """An enqueue's result, and whether the assigner was told (None: nothing to tell)."""

    enqueued: enqueue.Enqueued
    notified: bool | None

    def answer(self) -> read_models.Enqueued:
        """As POST /jobs and the CLI's `enqueue --json` answer it."""
        result = self.enqueued
        return read_models.Enqueued(
            job_id=result.job_id, state=result.state, created=result.created, notified=self.notified
        )


class RefusedBefore(Exception):
    """The broker message of an enqueue that would create a job was refused before (another
    copy of it): nothing is stored, the refusal stands (`requests.enqueue_job`)."""


def submit_job(
    rt: Runtime,
    request: EnqueueJob,
    traceparent: str | None = None,
    message_id: str | None = None,
) -> Submitted:
    """Queue a job (idempotent on caller_key), then kick the assigner.

    An existing QUEUED job kicks too: the caller's retry may follow a lost message. With
    traces on, a new job stores its enqueue span's context, a child of `traceparent` (the
    HTTP caller's) or of the current one (app/traces.py). `message_id`: the broker message's
    (Celery's task id); RefusedBefore, nothing stored, if a copy of it was refused before
    (its retry after a lost commit reply, a redelivery, a publish duplicate, judged again
    once the definition's upload was visible: one request is never refused and accepted).
    """
    with traces.enqueue(traceparent) as trace:
        with unit_of_work(rt.sessions) as session:
            # A new job's look for an abort that came first, and for its message's refusal,
            # is read with the kick's marker.
            enqueue_kick = kicks.EnqueueKick(rt, names.ASSIGN_NEXT_JOB, message_id)
            result = enqueue.enqueue_job(
                session,
                rt.settings,
                request,
                rt.clock(),
                traceparent=trace.traceparent,
                abort_waits=enqueue_kick.abort_waits,
            )
            # A copy of a refused message whose key names a job since (flip-api's repeat,
            # accepted once the upload showed up) is not that job's repeat either: a read
            # more, on a repeat only.
            refused = (
                enqueue_kick.refused
                if result.created
                else (message_id is not None and enqueue.refused_before(session, message_id))
            )
            if refused:
                raise RefusedBefore(f"message {message_id} was refused before")  # rolled back
            queued = result.state == JobState.QUEUED
            # The kick's marker is decided in the job's own transaction (one commit).
            kick = enqueue_kick.after_commit(session) if queued else None
        if result.created:  # once committed: a copy of a refused message rolls back above
            log.info(
                "job enqueued", extra={"job": str(result.job_id), "caller_key": request.caller_key}
            )
        trace.done(result.job_id, result.created, result.state)
        notified = kick() if kick is not None else None
    return Submitted(result, notified)


def record_refusal(
    rt: Runtime,
    caller_key: str | None,
    reason: str,
    code: ReasonCode = ReasonCode.REJECTED,
    *,
    message_id: str | None = None,
    digest: str | None = None,
) -> ReasonCode:
    """Record a refused enqueue for REJECTED_RETENTION_S and say so in one log line. With
    CALLBACK_URL set the record is also a `rejected` event: the commit kicks its delivery
    like any job move's (`callbacks.send_after_commit`), and beat's sweep finds it if that
    kick is lost; nothing here waits for the receiver. `message_id`, `digest`: the broker
    message's id and the payload's (`enqueue.record_rejection`). Returns the code recorded,
    the first one for a retry or a repeat."""
    with unit_of_work(rt.sessions) as session:
        return _record(rt, session, caller_key, reason, code, message_id=message_id, digest=digest)


def _record(
    rt: Runtime,
    session: Session,
    caller_key: str | None,
    reason: str,
    code: ReasonCode,
    *,
    message_id: str | None,
    digest: str | None,
) -> ReasonCode:
    shown = recorded_caller_key(caller_key) if caller_key is not None else None
    log.warning(
        "enqueue rejected",
        extra={"caller_key": shown, "reason": storable(reason), "code": str(code)},
    )
    kept = enqueue.record_rejection(
        session,
        caller_key,
        reason,
        rt.clock(),
        rt.settings.rejected_retention_s,
        callbacks=rt.settings.callbacks_enabled,
        code=code,
        message_id=message_id,
        digest=digest,
    )
    return _known_code(kept.reason_code, code)  # an unknown one: as judged now


def refuse_enqueue(
    rt: Runtime,
    payload: Any,
    exc: InvalidRequest,
    message_id: str | None = None,
) -> ReasonCode | enqueue.Enqueued:
    """Record a refused enqueue with its code: `caller_key_conflict` when the key names a
    job enqueued with another payload, `rejected` for anything else. Returns the code (the
    one first recorded, for a retry of the message `message_id` or a repeat of `payload`),
    or the job the same request became since it was judged: another copy of its message,
    or flip-api's repeat of it, accepted once the definition's upload showed up. A request
    is never both refused and a job; the look for that job waits for an enqueue of its id
    in flight (`id_probe`), and that enqueue's look for this message's refusal (`submit_job`)
    comes after its insert, so one of the two always sees the other."""
    caller_key = caller_key_of(payload)
    # A misshapen message's digest names its shape: not the same request as its fields
    # sent rightly (and refused for another reason).
    sent = (
        {"misshapen": payload.sent, "shape": payload.reason}
        if isinstance(payload, Misshapen)
        else payload
    )
    digest = enqueue.payload_digest(sent)
    request = _as_request(payload)
    with (
        unit_of_work(rt.sessions) as session,
        _job_named(rt, session, caller_key, probe=request is not None) as job,
    ):
        accepted = _accepted_as(rt, session, job, request, message_id)
        if accepted is not None:
            return accepted
        conflict = isinstance(exc, CallerKeyConflict) or job is not None
        code = ReasonCode.CALLER_KEY_CONFLICT if conflict else ReasonCode.REJECTED
        reason = str(exc)
        if conflict and not isinstance(exc, CallerKeyConflict):
            # A payload that fails validation under a key that already names a job is
            # not a repeat of it either: the job is unchanged, and must not read as
            # rejected.
            reason = (
                f"caller_key {quoted(caller_key or '')} already names a job; this payload is "
                f"invalid: {exc}"
            )
        return _record(rt, session, caller_key, reason, code, message_id=message_id, digest=digest)


def _as_request(payload: Any) -> EnqueueJob | None:
    """`payload` as an enqueue, if it is one (refused for what it names, not its shape)."""
    if isinstance(payload, Misshapen):
        return None
    try:
        return EnqueueJob.model_validate(payload)
    except ValidationError:
        return None


@contextmanager
def _job_named(
    rt: Runtime, session: Session, caller_key: str | None, *, probe: bool
) -> Iterator[Job | None]:
    """The job `caller_key` names (None for a key no job can have: none, too long, or one
    the database cannot store). `probe`: read as `id_probe` reads it, for a request a copy
    may have had accepted meanwhile; a payload no enqueue could accept (its shape or fields
    refused) is only read, so a flood of bad requests writes no placeholder rows."""
    if not caller_key or len(caller_key) > CALLER_KEY_MAX_CHARS or unstorable(caller_key):
        yield None
        return
    job_id = job_id_for(caller_key)
    if not probe:
        yield session.get(Job, job_id)
        return
    with id_probe.job_or_hold(session, job_id, rt.clock(), "refusal") as job:
        yield job


def _accepted_as(
    rt: Runtime,
    session: Session,
    job: Job | None,
    request: EnqueueJob | None,
    message_id: str | None,
) -> enqueue.Enqueued | None:
    """The job, if `request` is the one it was enqueued with (a repeat: `enqueue_job`'s
    rule) and this message was not refused before (a copy's refusal stands)."""
    if job is None or request is None:
        return None
    try:
        same = enqueue.repeat_of(job, request, rt.settings)
    except CallerKeyConflict:
        return None
    return None if enqueue.refused_before(session, message_id) else same


def refusal_of_message(rt: Runtime, message_id: str | None) -> tuple[str, ReasonCode] | None:
    """The reason and code of the refusal recorded for broker message `message_id`, if any
    (`RefusedBefore`'s answer)."""
    if not message_id:
        return None
    with rt.sessions() as session:
        kept = enqueue.refusal_of_message(session, message_id)
        if kept is None:
            return None
        return kept.reason, _known_code(kept.reason_code, ReasonCode.REJECTED)


def _known_code(stored: str, otherwise: ReasonCode) -> ReasonCode:
    # A code this release does not know (written by a newer one, before a rollback).
    return ReasonCode(stored) if stored in {c.value for c in ReasonCode} else otherwise


@dataclass(frozen=True)
class AbortRequested:
    """An abort's result in SQL, and whether the follow-up was sent."""

    decision: records.AbortDecision
    notified: bool | None

    def answer(self) -> read_models.AbortRequested:
        """As POST /jobs/{id}/abort and the CLI's `abort --json` answer it."""
        decision = self.decision
        return read_models.AbortRequested(
            job_id=decision.job_id,
            state=decision.state,
            needs_server_abort=decision.needs_server_abort,
            notified=self.notified,
        )


def request_abort(rt: Runtime, job_id: uuid.UUID, reason: str) -> AbortRequested:
    """Abort as far as SQL can; an active job's run is aborted on its server by a worker
    (`abort_on_server`), a job that held a net frees it for the next one (kick)."""
    with unit_of_work(rt.sessions) as session:
        decision = records.abort_job(session, job_id, reason, rt.clock())
    if decision.needs_server_abort:
        notified = rt.outbox.send(names.ABORT_ON_SERVER, job_id=str(job_id))
    else:
        notified = rt.outbox.send(names.ASSIGN_NEXT_JOB)
    return AbortRequested(decision, notified)


def keep_early_abort(
    rt: Runtime, job_id: uuid.UUID, reason: str, code: ReasonCode = ReasonCode.ABORTED
) -> datetime | None:
    """An abort (or flip-api's `stopped`) for a job id that names no job, which flip-api
    knows before its enqueue is stored: kept for REJECTED_RETENTION_S, and carried out by
    the enqueue that creates the job (`early_aborts`). Returns until when it is kept, or
    None if the job exists after all (its enqueue committed since): abort it as any."""
    with unit_of_work(rt.sessions) as session:
        return early_aborts.keep(
            session,
            job_id,
            reason,
            code,
            now=rt.clock(),
            retention_s=rt.settings.rejected_retention_s,
        )


def report_status(rt: Runtime, request: ReportJobStatus) -> JobState:
    """flip-api's terminal signal for a job (`records.report_job_status`), then the follow-up:
    a DISPATCHING job's server abort; for a job that was RUNNING or ABORTING, the settling of
    its run, which may still be live (recorded as a stray: the net takes no new job until its
    server says the run is over, aborting it if need be); otherwise a kick for the freed
    net."""
    with unit_of_work(rt.sessions) as session:
        job = records.get_job(session, request.job_id, lock=True)
        # An ABORTING job's run may be live too: its abort may not have reached the server.
        was_running = job.state in (JobState.RUNNING, JobState.ABORTING)
        net_name = job.net_name
        state = records.report_job_status(session, request, rt.clock())
    if state == JobState.ABORTING:
        rt.outbox.send(names.ABORT_ON_SERVER, job_id=str(request.job_id))
        return state
    if was_running and net_name is not None:
        rt.outbox.send(names.SETTLE_STRAY_RUNS, net_name=net_name)
    rt.outbox.send(names.ASSIGN_NEXT_JOB)
    return state
