"""drains: nets (or the whole deployment) taken out of the rotation before a redeploy

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 09:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # A new table, no ALTER of a hot one: a deployment still on 0015 never reads it, so the
    # migration can run before or after the new code starts (drain first, then deploy).
    op.create_table(
        "drains",
        sa.Column("scope", sa.String(length=63), nullable=False),
        sa.Column("drained_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_drains")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("drains")
