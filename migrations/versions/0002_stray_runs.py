"""stray runs: runs a server may hold that no job counts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 08:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "stray_runs",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("net_name", sa.String(length=63), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("nvflare_job_id", sa.String(length=80), nullable=True),
        sa.Column("submit_token", sa.String(length=80), nullable=True),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["net_name"], ["nets.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_stray_runs_net_name"), "stray_runs", ["net_name"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f("ix_stray_runs_net_name"), table_name="stray_runs")
    op.drop_table("stray_runs")
