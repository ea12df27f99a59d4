"""Fair share between projects (issue 40): the order in which QUEUED jobs are claimed, defined
once, in SQL, for every reader (the claim itself, its preference for a prewarmed net, a job's
place in line), and which projects are at their cap. SQL only.

The order (app/usecases/README.md "The claim's order"): a job QUEUED for AGING_S since its
enqueue is *aged* and comes before every job that is not, the oldest first. The others come
by their project's usage, the nets it holds (its jobs in ACTIVE_JOB_STATES) divided by its
weight (PROJECT_SHARES; 1 without an entry, and for the default project of jobs that name
none), lowest first: the project furthest below its share; then priority, highest first, then
age. A job whose project holds its `max_nets` nets is not taken at all.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Subquery,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    tuple_,
)
from sqlalchemy.orm import aliased

from app.project_shares import Shares
from models import ACTIVE_JOB_STATES, Job

# The active jobs a project's usage counts (its own alias: the reader's Job is the job
# ordered, and may be correlated).
_HELD = aliased(Job, name="held")


def held_by(project: Any) -> ColumnElement[int]:
    """SQL: how many nets this project holds now (its jobs in ACTIVE_JOB_STATES), for the
    project column of the reader's job (correlated; a NULL project counts the default
    project's jobs). The active jobs are few, at most one per net (ix_jobs_active_project)."""
    return (
        select(func.count())
        .select_from(_HELD)
        .where(_HELD.state.in_(ACTIVE_JOB_STATES), _HELD.project_id.is_not_distinct_from(project))
        .correlate_except(_HELD)
        .scalar_subquery()
    )


def held_by_project() -> Subquery:
    """SQL: each project holding nets and how many (`project_id`, `active`), to join to a
    queue once instead of counting per job (the claim's `_next_jobs`)."""
    return (
        select(_HELD.project_id.label("project_id"), func.count().label("active"))
        .where(_HELD.state.in_(ACTIVE_JOB_STATES))
        .group_by(_HELD.project_id)
        .subquery("held_by_project")
    )


def _weight(job: Any, shares: Shares) -> ColumnElement[float]:
    return case(*((job.project_id == p, w) for p, w in shares.weights), else_=1.0)


def order_key(job: Any, held: Any, shares: Shares, aged_before: Any) -> tuple[Any, ...]:
    """SQL: the claim's order of `job` (Job or an alias of it), ascending: the first job is
    the one taken. `held`: the nets its project holds (`held_by`, or a join's column);
    `aged_before`: the claim's now - AGING_S (a bind parameter)."""
    aged = job.created_at < aged_before
    usage = cast(held, Float) / _weight(job, shares) if shares.weights else held
    return (
        case((aged, 0), else_=1),
        # Aged jobs by age alone: whatever their project's usage and their priority.
        case((aged, literal(0)), else_=usage),
        case((aged, 0), else_=-job.priority),
        job.created_at,
        job.id,  # pragma: no mutate (a tie-break)
    )


def comes_before(ahead: Any, job: Any, shares: Shares, aged_before: Any) -> ColumnElement[bool]:
    """SQL: `ahead` comes before `job` in the claim's order (both Job or aliases of it, each
    with its project's usage counted by `held_by`)."""
    return tuple_(*order_key(ahead, held_by(ahead.project_id), shares, aged_before)) < tuple_(
        *order_key(job, held_by(job.project_id), shares, aged_before)
    )


def below_cap(job: Any, held: Any, shares: Shares) -> tuple[ColumnElement[bool], ...]:
    """SQL: the job's project holds fewer nets than its max_nets (no clause without caps).
    A NULL project, or one without a cap, is never at one."""
    if not shares.caps:
        return ()
    cap = case(*((job.project_id == p, n) for p, n in shares.caps), else_=None)
    return (or_(cap.is_(None), held < cap),)
