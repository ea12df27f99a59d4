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
    CTE,
    ColumnElement,
    Float,
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


# The join key of a job's project: '' (no project id has it) for the default project, so
# PostgreSQL can hash the join (IS NOT DISTINCT FROM it can only loop over).
def project_key(job: Any) -> ColumnElement[str]:
    """SQL: the job's project as a join key ('' for the default project)."""
    return func.coalesce(job.project_id, "")


def usage(project: Any, held: Any, shares: Shares) -> ColumnElement[Any]:
    """SQL: a project's usage, what the claim orders projects by: the nets it holds
    (`held`) per its weight."""
    if not shares.weights:
        return held  # type: ignore[no-any-return]
    weight = case(*((project == p, w) for p, w in shares.weights), else_=1.0)
    return cast(held, Float) / weight


def usage_by_project(shares: Shares) -> CTE:
    """SQL: each project holding nets (`project`: `project_key`), how many (`held`) and its
    `usage`, to join to a queue once instead of counting per job (the claim's `_next_jobs`;
    a project holding no net has no row: it holds 0, its usage is 0)."""
    held = func.count()
    return (
        select(
            project_key(_HELD).label("project"),
            held.label("held"),
            usage(_HELD.project_id, held, shares).label("usage"),
        )
        .where(_HELD.state.in_(ACTIVE_JOB_STATES))
        .group_by(_HELD.project_id)
        .cte("usage_by_project")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )


def order_key(job: Any, used: Any, aged_before: Any) -> tuple[Any, ...]:
    """SQL: the claim's order of `job` (Job or an alias of it), ascending: the first job is
    the one taken. `used`: its project's `usage`; `aged_before`: the claim's now - AGING_S
    (a bind parameter)."""
    aged = job.created_at < aged_before
    return (
        case((aged, 0), else_=1),
        # Aged jobs by age alone: whatever their project's usage and their priority.
        case((aged, literal(0)), else_=used),
        case((aged, 0), else_=-job.priority),
        job.created_at,
        job.id,  # a tie-break: one order on every read, not the rows' written order
    )


def comes_before(ahead: Any, job: Any, shares: Shares, aged_before: Any) -> ColumnElement[bool]:
    """SQL: `ahead` comes before `job` in the claim's order (both Job or aliases of it, each
    with its project's usage counted by `held_by`)."""
    return tuple_(*_key(ahead, shares, aged_before)) < tuple_(*_key(job, shares, aged_before))


def _key(job: Any, shares: Shares, aged_before: Any) -> tuple[Any, ...]:
    return order_key(job, usage(job.project_id, held_by(job.project_id), shares), aged_before)


def below_cap(job: Any, held: Any, shares: Shares) -> tuple[ColumnElement[bool], ...]:
    """SQL: the job's project holds fewer nets than its max_nets (no clause without caps).
    A NULL project, or one without a cap, is never at one."""
    if not shares.caps:
        return ()
    cap = case(*((job.project_id == p, n) for p, n in shares.caps), else_=None)
    return (or_(cap.is_(None), held < cap),)
