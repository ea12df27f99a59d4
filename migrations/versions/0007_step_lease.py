"""the lease of a job's in-flight submit, and when a net was last declared

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 16:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE on every database: SQLite's batch mode would copy the table and lose
    # its expression index (ix_jobs_retries_uncounted).
    op.add_column("jobs", sa.Column("step_due_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("nets", sa.Column("declared_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("nets", "declared_at")  # SQLite 3.35+ drops a column in place
    op.drop_column("jobs", "step_due_at")
