"""FLIP's job flow: job metadata, the FINISHING state, rejected requests

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 08:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_OLD = (
    "QUEUED",
    "ASSIGNED",
    "DISPATCHING",
    "RUNNING",
    "ABORTING",
    "COMPLETED",
    "FAILED",
    "ABORTED",
)
_NEW = (*_OLD[:4], "FINISHING", *_OLD[4:])
# (table, column, constraint name as the naming convention spells it)
_STATE_CHECKS = (
    ("jobs", "state", "ck_jobs_job_state"),
    ("job_events", "from_state", "ck_job_events_job_event_from"),
    ("job_events", "to_state", "ck_job_events_job_event_to"),
)


def _states_in(column: str, states: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(s) for s in states)})"


def _swap_checks(states: Sequence[str]) -> None:
    # The states are a string column with a CHECK (no native enum), so a new state is a new
    # CHECK; batch mode rebuilds the table on SQLite and alters it in place on PostgreSQL.
    for table in ("jobs", "job_events"):
        with op.batch_alter_table(table) as batch:
            for check_table, column, name in _STATE_CHECKS:
                if check_table != table:
                    continue
                # op.f(): the name is final, the naming convention must not prefix it again.
                batch.drop_constraint(op.f(name), type_="check")
                batch.create_check_constraint(op.f(name), _states_in(column, states))


def _one_active_job_per_net(active: Sequence[str]) -> None:
    # The partial unique index counts a FINISHING job as active too: its net is held.
    op.drop_index("uq_jobs_one_active_per_net", table_name="jobs")
    where = sa.text(_states_in("state", sorted(active)))
    op.create_index(
        "uq_jobs_one_active_per_net",
        "jobs",
        ["net_name"],
        unique=True,
        postgresql_where=where,
        sqlite_where=where,
    )


_ACTIVE_OLD = ("ASSIGNED", "DISPATCHING", "RUNNING", "ABORTING")


def upgrade() -> None:
    """Upgrade schema."""
    _swap_checks(_NEW)
    _one_active_job_per_net((*_ACTIVE_OLD, "FINISHING"))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("metadata", sa.JSON(), nullable=True))
    op.create_table(
        "rejected_requests",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("caller_key", sa.String(length=200), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_rejected_requests_job_id"), "rejected_requests", ["job_id"])
    op.create_index(op.f("ix_rejected_requests_at"), "rejected_requests", ["at"])


def downgrade() -> None:
    """Downgrade schema (FINISHING jobs, if any, must be settled first)."""
    op.drop_index(op.f("ix_rejected_requests_at"), table_name="rejected_requests")
    op.drop_index(op.f("ix_rejected_requests_job_id"), table_name="rejected_requests")
    op.drop_table("rejected_requests")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("metadata")
    _one_active_job_per_net(_ACTIVE_OLD)
    _swap_checks(_OLD)
