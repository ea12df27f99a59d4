"""status callbacks for rejected enqueues: each rejected request's delivery state

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("rejected_requests") as batch_op:
        batch_op.add_column(
            sa.Column("callback_settled_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(
            sa.Column("callback_failed", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch_op.add_column(
            sa.Column("callback_tries", sa.Integer(), server_default=sa.text("0"), nullable=False)
        )
        batch_op.add_column(
            sa.Column(
                "callback_rejections", sa.Integer(), server_default=sa.text("0"), nullable=False
            )
        )
        batch_op.add_column(
            sa.Column("callback_next_attempt_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(sa.Column("callback_last_error", sa.Text(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("rejected_requests") as batch_op:
        batch_op.drop_column("callback_last_error")
        batch_op.drop_column("callback_next_attempt_at")
        batch_op.drop_column("callback_rejections")
        batch_op.drop_column("callback_tries")
        batch_op.drop_column("callback_failed")
        batch_op.drop_column("callback_settled_at")
