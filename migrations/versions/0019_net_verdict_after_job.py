"""a net found misconfigured under a job keeps the verdict until the job ends

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 05:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE, as in 0014: SQLite's batch mode would copy the table. Nullable: most
    # nets hold no verdict; a worker start writes one only for a net it found wrong under a job.
    op.add_column("nets", sa.Column("misconfigured_after_job", sa.Text(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("nets", "misconfigured_after_job")
