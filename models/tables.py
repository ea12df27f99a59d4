"""The tables: nets, jobs and their append-only histories.

Transition methods live on the models; each one checks the move against the table in
`models.states` and adds its history row to the same session, so the move and its record
commit (or roll back) together.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    Uuid,
    text,
)
from sqlalchemy.orm import Mapped, WriteOnlyMapped, mapped_column, relationship

from models.attempts import attempt_number
from models.base import Base, UTCDateTime
from models.columns import ACTIVE_SQL, EVENT_ID, state_enum, uncounted_index
from models.reasons import ReasonCode, allowed
from models.states import (
    ACTIVE_JOB_STATES,
    JOB_TRANSITIONS,
    NET_TRANSITIONS,
    TERMINAL_JOB_STATES,
    IllegalTransition,
    JobState,
    NetState,
)


class Net(Base):
    """A net's fl-server as the dispatcher knows it; its configuration lives in Settings."""

    __tablename__ = "nets"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    state: Mapped[NetState] = mapped_column(state_enum(NetState, "net_state"))
    state_changed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # When the net last became free (READY without a job); idle scale-down counts from here.
    idle_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When the server last stopped answering while it should be up (grace for lost jobs).
    unreachable_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The monitor rounds in a row that found it so: with the grace, what makes its runs lost
    # (SERVER_LOST_ROUNDS): two unlucky calls the grace apart are no lost server.
    unreachable_rounds: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # The NVFLARE server's start time seen when the current job was dispatched: a different
    # value later means the server restarted under the job.
    server_start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # When a process last found the net in its NETS (each reconcile, each start). A net that
    # no process has declared for a while was removed; one that only some process lacks is
    # being added or removed by a rolling deploy, and is left alone.
    declared_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Until when a worker's scale-down call is taken to be in flight: reconcile re-drives a
    # STOPPING or UNHEALTHY net only after it, so a net is not stopped, claimed and started
    # again while the first call can still land (app.usecases.scaling.stop_net).
    stop_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Why the net goes MISCONFIGURED once its active job ends: a worker start found its files
    # wrong while it ran a job, which is left to finish (records.release_net applies it).
    misconfigured_after_job: Mapped[str | None] = mapped_column(Text, nullable=True)
    version: Mapped[int] = mapped_column(Integer, server_default=text("1"))

    events: WriteOnlyMapped[NetEvent] = relationship(
        back_populates="net", passive_deletes=True, order_by="NetEvent.id"
    )

    # Every ORM UPDATE is `... WHERE version = :seen`: a concurrent writer makes it fail
    # loudly (StaleDataError) instead of silently overwriting.
    __mapper_args__: dict[str, Any] = {"version_id_col": version}

    def transition(
        self,
        target: NetState,
        now: datetime,
        reason: str,
    ) -> None:
        """Move to `target` if the table allows it, and record the move."""
        if target == self.state:
            return
        if target not in NET_TRANSITIONS[self.state]:
            raise IllegalTransition("net", self.name, self.state, target)
        self.events.add(
            NetEvent(
                net_name=self.name,  # pragma: no mutate (write-only `events` sets it at flush)
                from_state=self.state,
                to_state=target,
                at=now,
                reason=reason,
            )
        )
        self.state = target
        self.state_changed_at = now
        if target != NetState.READY:
            self.idle_since = None
        if target in (NetState.STOPPED, NetState.STOPPING):
            self.server_start_time = None
            self.answered()

    def missed(self, now: datetime, *, counts: bool = True) -> tuple[float, int]:
        """A monitor round found the server unreachable: for how long, and how many rounds
        (`counts` off: the grace starts, no round is counted)."""
        if self.unreachable_since is None:
            self.unreachable_since = now
        if counts:
            self.unreachable_rounds += 1
        return (now - self.unreachable_since).total_seconds(), self.unreachable_rounds

    def answered(self) -> None:
        """The server answered (or is no longer expected to): the lost-server count restarts."""
        self.unreachable_since = None
        self.unreachable_rounds = 0

    def mark_idle(self, now: datetime) -> None:
        """The net is READY and has no job: the idle grace starts now."""
        self.transition(NetState.READY, now, "no active job")
        self.idle_since = now


class Job(Base):
    """One training job from flip-api."""

    __tablename__ = "jobs"
    __table_args__ = (
        # At most one active job per net, enforced by the database itself (both dialects
        # support partial indexes), so no code path can put two jobs on one server.
        Index(
            "uq_jobs_one_active_per_net",
            "net_name",
            unique=True,
            postgresql_where=text(ACTIVE_SQL),
            sqlite_where=text(ACTIVE_SQL),
        ),
        Index("ix_jobs_state_priority_created", "state", "priority", "created_at"),
        # Which nets the queue waits for: a claim that cannot place any job knows so from
        # this index alone (app.usecases.claims.claim_next_job).
        Index(
            "ix_jobs_queued_requested_net",
            "requested_net",
            postgresql_where=text("state = 'QUEUED'"),
            sqlite_where=text("state = 'QUEUED'"),
        ),
        # Jobs whose retries app.metrics has not counted yet: `retries - retries_counted > 0`.
        # An expression index, not a partial one: the planner keeps statistics on the
        # expression, so it knows how few rows match.
        Index("ix_jobs_retries_uncounted", text("(retries - retries_counted)")),
        # The nets page's recent jobs (app.usecases.net_history), newest change first: of
        # all nets, and of one net.
        Index("ix_jobs_state_changed_at", "state_changed_at"),
        Index("ix_jobs_net_name_state_changed_at", "net_name", "state_changed_at"),
        # The nets each project holds (app.usecases.fair_share): its active jobs, few
        # (at most one per net), found without reading the project's history.
        Index(
            "ix_jobs_active_project",
            "project_id",
            postgresql_where=text(ACTIVE_SQL),
            sqlite_where=text(ACTIVE_SQL),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    caller_key: Mapped[str] = mapped_column(String(200), unique=True)
    # app.schemas.EnqueueJob.digest() of the request that created it: a repeat with another
    # payload is a conflict, not the same job. NULL on jobs enqueued before migration 0009.
    request_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # EnqueueJob.sent_digest(): the request as sent, an omitted field left out (migration 0015).
    sent_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    definition: Mapped[str] = mapped_column(String(1024))
    required_sites: Mapped[list[str]] = mapped_column(JSON)
    # flip-api's own JSON object (model_id, project_id, ...), returned in every view and
    # event; `metadata` itself is SQLAlchemy's name for the table metadata.
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON, nullable=True)
    requested_net: Mapped[str | None] = mapped_column(ForeignKey("nets.name"), nullable=True)
    # The caller_key of the prewarm sent for it (advisory): its claim prefers the net that
    # prewarm holds, and ends that hold wherever the job goes (app.usecases.claims).
    prewarm_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    traceparent: Mapped[str | None] = mapped_column(String(55))  # enqueue span (app/traces.py)
    # The FLIP project it belongs to (app.schemas.EnqueueJob.project): the claim shares the
    # nets between projects (app.usecases.fair_share). NULL: the default project.
    project_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    net_name: Mapped[str | None] = mapped_column(ForeignKey("nets.name"), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    state: Mapped[JobState] = mapped_column(state_enum(JobState, "job_state"))
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # Transient-error retries of this job's pipeline steps (all attempts), for metrics.
    retries: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # The part of `retries` app.metrics has added to its running total.
    retries_counted: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(Integer)
    submit_token: Mapped[str | None] = mapped_column(String(80), nullable=True)
    nvflare_job_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Why it ended (models.reasons.ReasonCode), set with its terminal move; NULL while active.
    reason_code: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    state_changed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    assigned_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # While DISPATCHING: when the worker holding the submit (a try, or its retry) must be
    # heard of again. Past it the reconciler knows that worker is gone and re-sends at once,
    # instead of waiting out the whole retry budget.
    step_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    version: Mapped[int] = mapped_column(Integer, server_default=text("1"))

    events: WriteOnlyMapped[JobEvent] = relationship(
        back_populates="job", passive_deletes=True, order_by="JobEvent.id"
    )

    __mapper_args__: dict[str, Any] = {"version_id_col": version}

    @classmethod
    def new(
        cls,
        *,
        caller_key: str,
        definition: str,
        required_sites: list[str],
        requested_net: str | None,
        priority: int,
        max_attempts: int,
        now: datetime,
        job_id: uuid.UUID | None = None,
        metadata: dict[str, Any] | None = None,
        request_digest: str | None = None,
        sent_digest: str | None = None,
        prewarm_key: str | None = None,
        project_id: str | None = None,
    ) -> Job:
        """A QUEUED job with its creation recorded in the history."""
        job = cls(
            id=job_id or uuid.uuid4(),
            caller_key=caller_key,
            request_digest=request_digest,
            sent_digest=sent_digest,
            definition=definition,
            required_sites=required_sites,
            requested_net=requested_net,
            prewarm_key=prewarm_key,
            project_id=project_id,
            metadata_=metadata,
            priority=priority,
            state=JobState.QUEUED,
            attempts=0,
            retries=0,  # pragma: no mutate (dropped or None: the server default 0 is stored)
            max_attempts=max_attempts,
            created_at=now,
            state_changed_at=now,
        )
        job.events.add(
            JobEvent(
                job_id=job.id,  # pragma: no mutate (write-only `events` sets it at flush)
                from_state=None,  # pragma: no mutate (dropped, it is None by default: the same row)
                to_state=JobState.QUEUED,
                at=now,
                reason="enqueued",
                attempt=0,
            )
        )
        return job

    @property
    def is_active(self) -> bool:
        """The job holds a net."""
        return self.state in ACTIVE_JOB_STATES

    def transition(
        self,
        target: JobState,
        now: datetime,
        reason: str,
        *,
        nvflare_job_id: str | None = None,
        code: ReasonCode | None = None,
    ) -> None:
        """Move to `target` if the table allows it, and record the move with the attempt and
        the NVFLARE run it concerns (`nvflare_job_id`: a run the move itself starts). A move
        to a terminal state needs a `code` that `models.reasons.REASONS` lists for it, so
        no end reaches flip-api without its machine-readable reason."""
        if target not in JOB_TRANSITIONS[self.state]:
            raise IllegalTransition("job", str(self.id), self.state, target)
        if (target in TERMINAL_JOB_STATES) != (code is not None) or (
            code is not None and not allowed(code, target)
        ):
            raise IllegalTransition("job", f"{self.id} (reason code {code})", self.state, target)
        self.events.add(
            JobEvent(
                job_id=self.id,  # pragma: no mutate (write-only `events` sets it at flush)
                from_state=self.state,
                to_state=target,
                at=now,
                reason=reason,
                attempt=self.attempts,
                nvflare_job_id=nvflare_job_id or self.nvflare_job_id,
                reason_code=code,
            )
        )
        self.state = target
        self.state_changed_at = now
        if code is not None:
            self.finished_at = now
            self.reason_code = code

    def assign(self, net_name: str, now: datetime) -> None:
        """Reserve `net_name` for this job."""
        self.transition(JobState.ASSIGNED, now, f"net {net_name} reserved")
        self.net_name = net_name
        self.assigned_at = now

    def start_dispatch(self, now: datetime, *, earlier: Sequence[int | None] = ()) -> str:
        """Store the submit token before submitting, so a retry reuses it; returns it.
        `earlier`: the attempt of each time this job went DISPATCHING before (its history;
        None for moves written before migration 0004)."""
        self.transition(JobState.DISPATCHING, now, "server ready, submitting")
        # One token per dispatch: a retry of it cannot start a second run, while a requeued
        # job on a server that kept its job store is not answered with the earlier run.
        # Usually one dispatch per attempt (`<id>-<attempt>`); a requeue that counted no
        # attempt (a misconfigured net) brings a second dispatch at the same attempt, which
        # the count of earlier dispatches tells apart (`<id>-<attempt>.<dispatches>`, new
        # since that count only grows). A move without its attempt (before migration 0004)
        # may have been at this one: suffixed too.
        self.submit_token = f"{self.id}-{self.attempts}"
        if self.attempts in earlier or None in earlier:
            self.submit_token += f".{len(earlier)}"
        return self.submit_token

    def mark_running(self, nvflare_job_id: str, now: datetime) -> None:
        """The server accepted the job."""
        self.transition(
            JobState.RUNNING,
            now,
            f"submitted as {nvflare_job_id}",
            nvflare_job_id=nvflare_job_id,
        )
        self.nvflare_job_id = nvflare_job_id
        self.dispatched_at = now

    def requeue(self, reason: str, now: datetime, *, count_attempt: bool = True) -> bool:
        """Back to QUEUED with one more attempt counted, net released; FAILED when the
        attempts are used up. Returns True if the job was requeued. A requeue that is not the
        job's fault (its net is misconfigured) does not count an attempt."""
        if count_attempt:
            self.attempts += 1
        self.last_error = reason
        self.net_name = None
        self.nvflare_job_id = None
        self.submit_token = None
        if self.attempts >= self.max_attempts:
            self.transition(
                JobState.FAILED,
                now,
                f"attempts exhausted ({self.attempts} of {self.max_attempts}): {reason}",
                code=ReasonCode.MAX_ATTEMPTS,
            )
            return False
        upcoming = f"{attempt_number(self.attempts, self.max_attempts)} of {self.max_attempts}"
        self.transition(JobState.QUEUED, now, f"requeued for attempt {upcoming}: {reason}")
        return True

    def fail(self, reason: str, now: datetime, code: ReasonCode) -> None:
        """A final failure with its reason."""
        self.last_error = reason
        self.transition(JobState.FAILED, now, reason, code=code)


class StrayRun(Base):
    """A run that exists, or may exist, on a net's server while no job counts it: a submit
    that landed for a job that had moved on, a run left behind by a requeue or an abort that
    could not be confirmed. The net takes no new job until each one is settled (aborted, or
    gone with its server), so a job never runs twice at once."""

    __tablename__ = "stray_runs"

    id: Mapped[int] = mapped_column(EVENT_ID, primary_key=True, autoincrement=True)
    net_name: Mapped[str] = mapped_column(ForeignKey("nets.name", ondelete="CASCADE"), index=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    # None: the submit's outcome is unknown, the run is known only by its token.
    nvflare_job_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    submit_token: Mapped[str | None] = mapped_column(String(80), nullable=True)
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Not settled before this time, whatever its status reads: a run aborted before its
    # server's job runner started it may still be started (app.usecases.abort).
    settle_after: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class JobEvent(Base):
    """Append-only history of a job's moves."""

    __tablename__ = "job_events"
    # ix_job_events_at: the nets page's window (app.usecases.net_history), a day of a year.
    __table_args__ = (uncounted_index("job_events"), Index("ix_job_events_at", "at"))

    id: Mapped[int] = mapped_column(EVENT_ID, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[JobState | None] = mapped_column(
        state_enum(JobState, "job_event_from"), nullable=True
    )
    to_state: Mapped[JobState] = mapped_column(state_enum(JobState, "job_event_to"))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))
    # The job's attempt and NVFLARE run when the move happened: a status callback delivered
    # late (its receiver was down across a requeue) must still tell the truth about its own
    # move, not about the job's later state. NULL on rows written before migration 0004.
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    nvflare_job_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    # A terminal move's models.reasons.ReasonCode (NULL on other moves, and on terminal rows
    # written before migration 0009).
    reason_code: Mapped[str | None] = mapped_column(String(40), nullable=True)
    # Folded into app.metrics' running totals yet? Written false (the server default), set
    # once by the scrape that counts the row.
    counted: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))

    job: Mapped[Job] = relationship(back_populates="events")


class NetEvent(Base):
    """Append-only history of a net's moves."""

    __tablename__ = "net_events"
    # The nets page's window of a page's nets (app.usecases.net_history): a day of a year.
    __table_args__ = (
        uncounted_index("net_events"),
        Index("ix_net_events_net_name_at", "net_name", "at"),
    )

    id: Mapped[int] = mapped_column(EVENT_ID, primary_key=True, autoincrement=True)
    net_name: Mapped[str] = mapped_column(ForeignKey("nets.name", ondelete="CASCADE"), index=True)
    from_state: Mapped[NetState | None] = mapped_column(
        state_enum(NetState, "net_event_from"), nullable=True
    )
    to_state: Mapped[NetState] = mapped_column(state_enum(NetState, "net_event_to"))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))
    # Folded into app.metrics' running totals yet? Written false (the server default), set
    # once by the scrape that counts the row.
    counted: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))

    net: Mapped[Net] = relationship(back_populates="events")


class ScaleEvent(Base):
    """Append-only record of every scale decision and what the driver said."""

    __tablename__ = "scale_events"
    __table_args__ = (uncounted_index("scale_events"),)

    id: Mapped[int] = mapped_column(EVENT_ID, primary_key=True, autoincrement=True)
    net_name: Mapped[str] = mapped_column(ForeignKey("nets.name", ondelete="CASCADE"), index=True)
    action: Mapped[str] = mapped_column(String(32))  # scale_up, scale_down
    replicas: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))
    outcome: Mapped[str] = mapped_column(String(200))  # ok, or the classified error
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Folded into app.metrics' running totals yet? Written false (the server default), set
    # once by the scrape that counts the row.
    counted: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
