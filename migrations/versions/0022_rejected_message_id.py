"""rejected_requests.message_id and payload_digest: which message and which payload a refusal
was recorded for

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 20:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # A nullable column, no default: a plain ALTER TABLE that rewrites nothing (as 0014,
    # 0019, 0020). Rows kept from before have neither: a retry or a repeat of their request
    # after the upgrade is matched by its caller_key, code and reason, as before.
    op.add_column(
        "rejected_requests", sa.Column("message_id", sa.String(length=255), nullable=True)
    )
    op.add_column(
        "rejected_requests", sa.Column("payload_digest", sa.String(length=64), nullable=True)
    )
    op.create_index(op.f("ix_rejected_requests_message_id"), "rejected_requests", ["message_id"])


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_rejected_requests_message_id"), table_name="rejected_requests")
    op.drop_column("rejected_requests", "payload_digest")
    op.drop_column("rejected_requests", "message_id")
