"""when a stray run may be settled at the earliest

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 17:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE, as in 0007: SQLite's batch mode would copy the table.
    op.add_column(
        "stray_runs", sa.Column("settle_after", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("stray_runs", "settle_after")
