"""the lease of a net's in-flight scale-down call

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 06:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE, as in 0007: SQLite's batch mode would copy the table.
    op.add_column("nets", sa.Column("stop_due_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("nets", "stop_due_at")
