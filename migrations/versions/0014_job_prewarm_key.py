"""a job names the prewarm sent for it

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 04:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE, as in 0013: SQLite's batch mode would copy the table. Nullable:
    # the jobs enqueued before it named no prewarm.
    op.add_column("jobs", sa.Column("prewarm_key", sa.String(length=200), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("jobs", "prewarm_key")
