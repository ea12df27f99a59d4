"""An enqueue stored: a new job (its definition checked, its caller key answering a repeat
with the same job and refusing another payload under it), or, refused, the rejection kept
for a while so the job's id can say "rejected". SQL only, like `records`."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, delete, exists, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.s3_definition import parse_s3_definition
from app.errors import CallerKeyConflict, InvalidRequest, TransientError, quoted, quoted_all
from app.metrics.figures import CALLBACK_FAILED_PRUNED
from app.schemas import EnqueueJob, job_id_for, recorded_caller_key, storable, unstorable
from app.settings import Settings
from app.usecases import declared_nets, early_aborts
from models import Job, JobState, MetricTotal, ReasonCode, RefusedMessage, RejectedRequest

# Refusals under one caller key are recorded one at a time: on PostgreSQL with a
# transaction-scoped advisory lock keyed (this, hashtext(key)); SQLite's BEGIN IMMEDIATE
# already takes the write lock. Two int4 keys: a key space apart from the bigint locks of
# app.beat and app.metrics.fold.
_REJECTION_LOCK = 0x666C726A  # "flrj"
# A definition's path the file system refuses to look up for what it is, whatever the disk
# holds: a name longer than a directory entry may be, a symlink loop.
_UNNAMEABLE = frozenset({errno.ENAMETOOLONG, errno.ELOOP})


# Whether an abort waits for the job id an enqueue just created (`early_aborts`), read after
# the job's insert in the enqueue's transaction: on its own by default, or with the kick's
# marker in one statement (`kicks.EnqueueKick.abort_waits`).
AbortWaits = Callable[[Session, uuid.UUID, datetime], bool]


@dataclass(frozen=True)
class Enqueued:
    """The job a caller's key maps to, and whether this call created it."""

    job_id: uuid.UUID
    created: bool
    state: JobState


def resolve_definition(settings: Settings, definition: str) -> str:
    """Validate a job definition: an `s3://` URI, or a folder inside `JOB_ROOT` that exists.

    Returns the normalised form stored on the job (the path relative to the root).
    """
    if definition.startswith("s3://"):
        return parse_s3_definition(definition).uri  # network-free checks; raises InvalidRequest
    relative = PurePosixPath(definition)
    named = quoted(definition)  # a caller's text: short and escaped in what is answered
    if relative.is_absolute() or ".." in relative.parts:
        raise InvalidRequest(
            f"definition {named} must be a relative folder under the job root, without '..'"
        )
    root = settings.job_root.resolve()
    try:
        folder = (root / relative).resolve()
        # resolve() follows symlinks, so a link pointing outside the root is caught here too.
        if not folder.is_relative_to(root):
            raise InvalidRequest(f"definition {named} escapes the job root")
        if not folder.is_dir():
            raise InvalidRequest(f"definition {named} is not a folder under the job root")
    except RuntimeError:  # pathlib's word for a symlink loop
        raise InvalidRequest(f"definition {named} is a symlink loop") from None
    except OSError as exc:
        if exc.errno not in _UNNAMEABLE:
            # The file system failing (EIO, a network mount that cannot answer now): not the
            # request's fault, and no reason to drop it either (an OSError fails a request
            # task for good, acknowledged away unrecorded): kept and tried again, as a
            # database that cannot answer now.
            raise TransientError(
                f"definition {named} cannot be looked up now: {exc.strerror or exc}"
            ) from exc
        # Raised, it failed the task for good, unrecorded, and was a 500 over HTTP.
        reason = os.strerror(exc.errno or 0)
        raise InvalidRequest(f"definition {named} cannot be looked up: {reason}") from None
    if not re.fullmatch(r"[A-Za-z0-9._-]+", folder.name):
        # NVFLARE refuses other characters in the job folder's name (2.9.0 submit_job).
        raise InvalidRequest(
            f"definition folder name {quoted(folder.name)} may hold only letters, digits, "
            "'.', '_', '-'"
        )
    return str(relative)


def enqueue_job(
    session: Session,
    settings: Settings,
    request: EnqueueJob,
    now: datetime,
    traceparent: str | None = None,
    *,
    abort_waits: AbortWaits = early_aborts.waits,
) -> Enqueued:
    """Queue a job; the same caller key twice with the same payload returns the first job,
    with another payload is a CallerKeyConflict. A new job whose id an abort came for first
    (`early_aborts`) is created ABORTED, as that abort would have left it.

    The job is inserted without a read first: its key is unique, so an insert that fails on
    it says a job has the key (an earlier enqueue, or a concurrent one that won), and only
    then is that job read. A request that fails validation is also answered by the job its
    key names, if any (a repeat is the first request, whatever changed since)."""
    try:
        job = _new_job(settings, request, now, traceparent)
    except InvalidRequest:
        existing = _by_key(session, request.caller_key)
        if existing is None:
            raise
        return repeat_of(existing, request, settings)
    try:
        _insert(session, job)
    except IntegrityError:
        existing = _by_key(session, request.caller_key)
        if existing is not None:
            return repeat_of(existing, request, settings)
        # No job has the key: the insert failed on the net it names, whose row no worker
        # has created yet (a deploy that added it). Create the declared nets' rows, again.
        declared_nets.ensure_net_rows(session, settings, now)
        job = _new_job(settings, request, now, traceparent)
        try:
            _insert(session, job)
        except IntegrityError:
            # A job under the key now: a concurrent enqueue of it committed meanwhile (a repeat).
            winner = _by_key(session, request.caller_key)
            if winner is None:
                raise
            return repeat_of(winner, request, settings)
    # After the insert, never before: on PostgreSQL an abort committing meanwhile either
    # made this insert wait for its commit, or finds this job itself (early_aborts).
    if abort_waits(session, job.id, now):
        early_aborts.carry_out(session, job, now)
    return Enqueued(job.id, created=True, state=job.state)


def _by_key(session: Session, caller_key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.caller_key == caller_key))


def _insert(session: Session, job: Job) -> None:
    """Insert the job and its first event; IntegrityError if the key or the net says no."""
    # A savepoint, so a failed insert leaves the outer transaction usable.
    with session.begin_nested():
        session.add(job)


def _new_job(
    settings: Settings, request: EnqueueJob, now: datetime, traceparent: str | None = None
) -> Job:
    """The job a valid request makes, QUEUED (not stored); InvalidRequest otherwise."""
    sites = list(request.required_sites)
    if request.net is not None:
        try:
            net_config = settings.net(request.net)
        except KeyError:
            known = ", ".join(n.name for n in settings.nets) or "none"
            raise InvalidRequest(f"unknown net {quoted(request.net)} (known: {known})") from None
        sites = sites or list(net_config.required_sites)
        lacking = net_config.lacks(sites)
        if lacking:
            assert net_config.sites is not None  # lacks() finds nothing otherwise
            raise InvalidRequest(
                f"required sites {quoted_all(lacking)} are not on net {net_config.name}: "
                f"{net_config.name} has {', '.join(net_config.sites)}"
            )
    if not sites:
        raise InvalidRequest("required_sites is empty and no net default applies")
    if not settings.nets:
        raise InvalidRequest("no nets are configured, so no job can run")
    if request.net is None and all(n.lacks(sites) for n in settings.nets):
        # Every net declares its sites and none has them all: the job could never start.
        raise InvalidRequest(
            f"no net has every site in {quoted_all(sites)}; "
            + "; ".join(f"{n.name} has {', '.join(n.sites or ())}" for n in settings.nets)
        )
    definition = resolve_definition(settings, request.definition)
    job = Job.new(
        caller_key=request.caller_key,
        definition=definition,
        required_sites=sites,
        requested_net=request.net,
        priority=request.priority,
        max_attempts=request.max_attempts or settings.max_attempts,
        now=now,
        job_id=job_id_for(request.caller_key),
        metadata=request.metadata,
        request_digest=_as_stored(request, settings).digest(),
        sent_digest=request.sent_digest(),
        # Advisory: a key naming no live prewarm is kept all the same and gives no preference.
        prewarm_key=request.prewarm_key,
        # Its field, or FLIP's metadata.project_id (the claim's fair share, issue 40).
        project_id=request.project(),
    )
    job.traceparent = traceparent  # its enqueue span's, with TRACES on (app/traces.py)
    return job


def _as_stored(request: EnqueueJob, settings: Settings) -> EnqueueJob:
    """The request with the defaults the job is stored with filled in (MAX_ATTEMPTS, the
    net's default sites), so that spelling a default out is the same request as omitting it."""
    sites = list(request.required_sites)
    if not sites and request.net is not None and settings.has_net(request.net):
        sites = list(settings.net(request.net).required_sites)
    return request.model_copy(
        update={
            "max_attempts": request.max_attempts or settings.max_attempts,
            "required_sites": sites,
        }
    )


def repeat_of(existing: Job, request: EnqueueJob, settings: Settings) -> Enqueued:
    """A repeat of an enqueue: the same request (a retry) names the existing job; another
    payload under the same key is refused, since answering with the first job would let the
    caller believe its new request was queued. The same request is the one sent again as it
    was (whatever defaults a redeploy changed since), or one that spells out or leaves out
    a default as today's settings fill it in; a repeat that leaves out a value the first one
    sent is another request unless today's default is that value."""
    if existing.request_digest is None:
        return Enqueued(existing.id, created=False, state=existing.state)  # before 0009
    as_sent = existing.sent_digest is not None and existing.sent_digest == request.sent_digest()
    if not as_sent and existing.request_digest != _as_stored(request, settings).digest():
        raise CallerKeyConflict(
            # No job state in the text: the same conflict retried (a lost commit reply) must
            # read the same, to be the one refusal already recorded.
            f"caller_key {quoted(request.caller_key)} already names job {existing.id}, "
            f"enqueued with a different payload"
            f"{_differences(existing, request)}; a new job needs a new caller_key"
        )
    return Enqueued(existing.id, created=False, state=existing.state)


def _differences(job: Job, request: EnqueueJob) -> str:
    """The fields that visibly differ, for the message (the digest decides)."""
    differ = [
        name
        for name, sent, kept in (
            ("net", request.net, job.requested_net),
            ("priority", request.priority, job.priority),
            ("metadata", request.metadata, job.metadata_),
            ("prewarm_key", request.prewarm_key, job.prewarm_key),
            ("project_id", request.project(), job.project_id),
        )
        if sent != kept
    ]
    if request.required_sites and sorted(request.required_sites) != sorted(job.required_sites):
        differ.append("required_sites")
    if request.max_attempts is not None and request.max_attempts != job.max_attempts:
        differ.append("max_attempts")
    return f" (differs in: {', '.join(differ)})" if differ else ""


def record_rejection(
    session: Session,
    caller_key: str | None,
    reason: str,
    now: datetime,
    retention_s: float,
    *,
    callbacks: bool = False,
    code: ReasonCode = ReasonCode.REJECTED,
    message_id: str | None = None,
    digest: str | None = None,
) -> RejectedRequest:
    """Keep a refused enqueue for a while (so `GET /jobs/{id}` can say "rejected") and drop
    rejections older than the retention. `callbacks` (CALLBACK_URL is set): the row is also
    the `rejected` event to deliver, so one not yet delivered (or given up) is kept past the
    retention until it is. `message_id`: the broker message's id, the same across its
    retries; a refusal already recorded for it is the one returned, whatever its key.
    `digest`: the payload's (`payload_digest`), which tells flip-api's own repeat of the
    request (the same refusal) from another payload under the key (another refusal)."""
    # A key that cannot be stored (NUL, a lone surrogate) is kept escaped, so the refusal
    # itself is never lost; no job could ever have had such a key, hence no job id.
    valid_key = caller_key is not None and unstorable(caller_key) is None
    recorded = recorded_caller_key(caller_key) if caller_key is not None else None
    message = recordable_message_id(message_id)
    lock_on = recorded if recorded is not None else message
    if lock_on is not None and session.get_bind().dialect.name == "postgresql":
        # Held until the commit, so a copy of this refusal handled at the same time (two
        # workers, flip-api's retry of a send it was unsure of) waits, then finds this row:
        # its look, a statement of its own, reads what was committed meanwhile.
        session.execute(select(func.pg_advisory_xact_lock(_REJECTION_LOCK, func.hashtext(lock_on))))
    expired = RejectedRequest.at < now - timedelta(seconds=retention_s)
    if callbacks:
        expired = and_(expired, RejectedRequest.callback_settled_at.is_not(None))
    pruned = session.scalars(
        delete(RejectedRequest).where(expired).returning(RejectedRequest.callback_failed)
    ).all()
    _count_pruned_failures(session, sum(pruned))
    shown = storable(reason)[:4000]
    # The same refusal again (a retry after a commit whose reply was lost, the caller's own
    # repeat, a copy handled at the same time) is the one already kept: one row, one
    # `rejected` event. A retry of the same message is found by its id first: judged
    # again it may read otherwise (no key to match; or the corrected request created the
    # job meanwhile, and the same payload now reads as a conflict with it).
    same = refusal_of_message(session, message)
    answered = same is not None  # this message's own refusal: nothing to add
    same = same or _same_rejection(session, recorded, digest, (str(code), shown))
    if same is None:
        same = RejectedRequest(
            job_id=job_id_for(caller_key) if caller_key and valid_key else None,
            caller_key=recorded,
            reason=shown,
            reason_code=code,
            at=now,
            payload_digest=digest,
        )
        session.add(same)
        session.flush()  # its id, for the message's row
    if message is not None and not answered:
        # Every message this refusal answered (flip-api's repeat matched to it too): no copy
        # of any of them creates a job or a second refusal.
        session.add(RefusedMessage(message_id=message, rejection_id=same.id))
    return same


MESSAGE_ID_MAX_CHARS = 255  # refused_messages.message_id; Celery's own ids are 36


def recordable_message_id(message_id: str | None) -> str | None:
    """A message id as stored and looked up (None: no id): as sent when it fits the column
    and can be stored, else (a sender may name its own ids: longer, a NUL, a lone surrogate)
    its escaped head, an ellipsis and the whole id's SHA-256, so every copy of the message
    still finds its refusal (dropped, a copy judged again once the upload showed up became
    a job for a request answered `rejected`)."""
    if not message_id:
        return None
    if len(message_id) <= MESSAGE_ID_MAX_CHARS and unstorable(message_id) is None:
        return message_id
    digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
    return storable(message_id)[: MESSAGE_ID_MAX_CHARS - 65] + "\u2026" + digest


# Whether a refusal was recorded for the broker message `refused_message`: a column an
# enqueue that created a job reads with its kick's marker (app.usecases.kicks.EnqueueKick),
# in the statement it reads anyway. A NULL id (no message) matches nothing. Built once.
REFUSED: ColumnElement[bool] = exists().where(
    RefusedMessage.message_id == bindparam("refused_message")
)
_REFUSED = select(REFUSED)


def refused_before(session: Session, message_id: str | None) -> bool:
    """`REFUSED` read on its own (a door whose kicks are not coalesced)."""
    message = recordable_message_id(message_id)
    return message is not None and bool(session.scalar(_REFUSED, {"refused_message": message}))


def refusal_of_message(session: Session, message_id: str | None) -> RejectedRequest | None:
    """The refusal recorded for the broker message `message_id`, if any."""
    message = recordable_message_id(message_id)
    if message is None:
        return None
    return session.scalar(
        select(RejectedRequest)
        .join(RefusedMessage, RefusedMessage.rejection_id == RejectedRequest.id)
        .where(RefusedMessage.message_id == message)
    )


def payload_digest(payload: Any) -> str | None:
    """sha256 of a refused payload as sent (keys sorted); a value JSON has no form for (a
    UUID or datetime kombu's json decoded) by its type and repr. None only for a payload
    that cannot be told apart at all (keys that cannot be sorted, a cycle)."""
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=_named)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _named(value: object) -> str:
    return f"{type(value).__qualname__}:{value!r}"


def _same_rejection(
    session: Session,
    recorded: str | None,
    digest: str | None,
    code_and_reason: tuple[str, str],
) -> RejectedRequest | None:
    """The refusal already kept for this key and payload (flip-api's own repeat, another
    message); else, for a row or a call without a digest, for this key, code and reason.
    Not another payload under the key: that is another request."""
    if recorded is None:
        return None
    code, reason = code_and_reason
    as_before = and_(RejectedRequest.reason_code == code, RejectedRequest.reason == reason)
    if digest is not None:
        unkept = and_(RejectedRequest.payload_digest.is_(None), as_before)
        as_before = or_(RejectedRequest.payload_digest == digest, unkept)
    # Key-share locked (PostgreSQL): this message's row will point at it, and another
    # worker's prune (its clock a little ahead) must not delete it under that insert (a
    # foreign-key violation would fail the request): a delete already made waits for its
    # commit and the row is not found; one not made yet waits for this commit.
    return session.scalar(
        select(RejectedRequest)
        .where(RejectedRequest.caller_key == recorded, as_before)
        .limit(1)
        .with_for_update(read=True, key_share=True)
    )


def _count_pruned_failures(session: Session, pruned: int) -> None:
    """Add the given-up rejected events just pruned (counted from the rows the DELETE
    removed, so two refusals pruning at once count each row once) to their running total:
    the failed-events counter (`callbacks.backlog`) is a counter, and a fall would read to
    Prometheus as a reset (a false "given up within the hour" page)."""
    if not pruned:
        return
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    stmt = insert(MetricTotal).values(metric=CALLBACK_FAILED_PRUNED, labels="", value=pruned)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=[MetricTotal.metric, MetricTotal.labels],
            set_={"value": MetricTotal.value + stmt.excluded.value},
        )
    )


def get_rejection(session: Session, job_id: uuid.UUID) -> RejectedRequest | None:
    """The latest rejection of an enqueue that would have created this job, if any."""
    return session.scalar(
        select(RejectedRequest)
        .where(RejectedRequest.job_id == job_id)
        .order_by(RejectedRequest.at.desc(), RejectedRequest.id.desc())
        .limit(1)
    )
