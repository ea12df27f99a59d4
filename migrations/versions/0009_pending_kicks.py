"""coalesced kicks: one pending kick per task name

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 16:10:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "pending_kicks",
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task", name=op.f("pk_pending_kicks")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("pending_kicks")
