"""jobs keep the W3C traceparent of their enqueue span

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-10 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Nullable: a job enqueued with TRACES off (or before this revision) has no trace, and its
    # later steps make no job spans (app/traces.py).
    op.add_column("jobs", sa.Column("traceparent", sa.String(length=55), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("jobs", "traceparent")
