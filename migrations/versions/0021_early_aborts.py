"""early_aborts: an abort for a job id whose enqueue has not been stored yet

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 17:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # A new table, no ALTER of a hot one (as 0017): a process still on 0020 never reads it,
    # so the migration can run before or after the new code starts.
    op.create_table(
        "early_aborts",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("reason_code", sa.String(length=40), nullable=False),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kept_until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_early_aborts")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    # The aborts still waiting are lost: the code of 0020 could not apply them anyway.
    op.drop_table("early_aborts")
