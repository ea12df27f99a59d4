"""status callbacks: delivery cursors, the receiver row, each event's attempt and run

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 09:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EVENT_REF = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "callback_receiver",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("lease_owner", sa.String(length=36), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("wake_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "callback_cursors",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("settled_through", _EVENT_REF, server_default=sa.text("0"), nullable=False),
        sa.Column("delivered", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("failed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("tries", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("rejections", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    # Nullable: rows written before this revision do not know their attempt or run.
    with op.batch_alter_table("job_events") as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("nvflare_job_id", sa.String(length=80), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("job_events") as batch_op:
        batch_op.drop_column("nvflare_job_id")
        batch_op.drop_column("attempt")
    op.drop_table("callback_cursors")
    op.drop_table("callback_receiver")
