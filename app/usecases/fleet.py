"""One reconcile round's read of the fleet: every declared net's row with its active job
and stray-run count, in one statement whatever the size of the fleet."""

from __future__ import annotations

import uuid
from dataclasses import KW_ONLY, dataclass
from datetime import datetime

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from app.runtime import Runtime
from app.usecases.step_leases import LEASED_COLUMNS, Leased
from models import ACTIVE_JOB_STATES, Job, JobState, Net, NetState, StrayRun


@dataclass(frozen=True)
class NetRow:
    """A net as one reconcile round read it (decisions re-check under the row lock)."""

    state: NetState
    changed_at: datetime
    job_id: uuid.UUID | None = None
    job_state: JobState | None = None
    attempt: int = 0
    _: KW_ONLY  # the net's own fields, by keyword only: a job's fields (*job) end before them
    strays: int = 0
    stop_due_at: datetime | None = None  # the lease of a scale-down call (stop_net)


@dataclass(frozen=True)
class Fleet:
    """Every net as one reconcile round read it, in one statement: its row (`NetRow`), when a
    process last declared it, and the jobs in the dispatch chain or aborting on it (the
    round's leases and stuck jobs: an active job always has a net)."""

    rows: dict[str, NetRow]
    declared_at: dict[str, datetime | None]
    chain_jobs: list[Leased]


_STRAYS = (
    select(StrayRun.net_name, func.count().label("strays")).group_by(StrayRun.net_name).subquery()
)
# Built once at import (issue 37): one row per net, with its active job (at most one: the
# database enforces it) and its stray-run count.
_FLEET = (
    select(
        Net.name,
        Net.state,
        Net.state_changed_at,
        Net.stop_due_at,
        Net.declared_at,
        *LEASED_COLUMNS,
        _STRAYS.c.strays,
    )
    .outerjoin(Job, and_(Job.net_name == Net.name, Job.state.in_(ACTIVE_JOB_STATES)))
    .outerjoin(_STRAYS, _STRAYS.c.net_name == Net.name)
)
CHAIN_STATES = (JobState.ASSIGNED, JobState.DISPATCHING, JobState.ABORTING)


def read_fleet(session: Session) -> Fleet:
    """Every net with its active job and stray-run count, in one statement whatever the
    size of the fleet (not three per net)."""
    rows: dict[str, NetRow] = {}
    declared: dict[str, datetime | None] = {}
    chain: list[Leased] = []
    # On the session's connection, not through the ORM: plain rows, a fraction of the cost
    # at 1,000 nets.
    fleet = session.connection().execute(_FLEET).all()
    for name, state, changed_at, stop_due_at, declared_at, *job, strays in fleet:
        job_id, job_state, _, attempt, job_changed_at, due_at = job
        # One constructor with or without a job: the net's own fields are set in one place.
        active = (job_id, job_state, attempt) if job_id is not None else ()
        rows[name] = NetRow(state, changed_at, *active, strays=strays or 0, stop_due_at=stop_due_at)
        declared[name] = declared_at
        if job_state in CHAIN_STATES:
            chain.append(Leased(job_id, job_state, name, attempt, job_changed_at, due_at))
    return Fleet(rows, declared, chain)


def net_rows(rt: Runtime) -> dict[str, NetRow]:
    """Every net with its active job and stray-run count (`read_fleet`)."""
    with rt.sessions() as session:
        return read_fleet(session).rows
