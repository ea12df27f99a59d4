"""reason codes: why a job ended, or why an enqueue was refused (models.reasons)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 17:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE on every database (see 0007). Rows written before stay NULL: their
    # reason was free text only, and guessing a code from it would be a contract we never
    # made. Old rejections read `rejected`, which is what every one of them was.
    op.add_column("job_events", sa.Column("reason_code", sa.String(length=40), nullable=True))
    op.add_column("jobs", sa.Column("reason_code", sa.String(length=40), nullable=True))
    # Jobs enqueued before keep NULL: any repeat of their caller_key counts as the same.
    op.add_column("jobs", sa.Column("request_digest", sa.String(length=64), nullable=True))
    op.add_column(
        "rejected_requests",
        sa.Column(
            "reason_code",
            sa.String(length=40),
            server_default=sa.text("'rejected'"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("rejected_requests", "reason_code")
    op.drop_column("jobs", "request_digest")
    op.drop_column("jobs", "reason_code")
    op.drop_column("job_events", "reason_code")
