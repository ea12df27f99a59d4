"""early_cancels: a cancel_prewarm for a prewarm key whose prewarm has not been stored yet

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # A new table, no ALTER of a hot one (as 0021): a process still on 0022 never reads it,
    # so the migration can run before or after the new code starts.
    op.create_table(
        "early_cancels",
        sa.Column("caller_key", sa.String(length=200), nullable=False),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kept_until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("caller_key", name=op.f("pk_early_cancels")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    # The cancels still waiting are lost: the code of 0022 could not apply them anyway.
    op.drop_table("early_cancels")
