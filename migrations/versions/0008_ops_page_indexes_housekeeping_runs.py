"""ops: the nets page's history windows, and when beat's loops last ran

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 16:00:00

The nets page (GET /nets) reads its nets' last day: an index on net_events' (net_name, at)
and one on job_events' `at` find a day's moves in a year of history, and one on jobs'
`state_changed_at` (and by (net_name, state_changed_at), of one net) the most recently
changed jobs. `housekeeping_runs` keeps when each beat
loop last finished a round, for the metric that tells beat (or every worker) has stopped.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index("ix_net_events_net_name_at", "net_events", ["net_name", "at"])
    op.create_index("ix_job_events_at", "job_events", ["at"])
    op.create_index("ix_jobs_state_changed_at", "jobs", ["state_changed_at"])
    op.create_index("ix_jobs_net_name_state_changed_at", "jobs", ["net_name", "state_changed_at"])
    op.create_table(
        "housekeeping_runs",
        sa.Column("loop", sa.String(length=64), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("loop", name=op.f("pk_housekeeping_runs")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("housekeeping_runs")
    op.drop_index("ix_jobs_net_name_state_changed_at", table_name="jobs")
    op.drop_index("ix_jobs_state_changed_at", table_name="jobs")
    op.drop_index("ix_job_events_at", table_name="job_events")
    op.drop_index("ix_net_events_net_name_at", table_name="net_events")
