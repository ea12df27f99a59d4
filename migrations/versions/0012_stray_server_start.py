"""stray_runs.server_start_time: the start time of the server process a stray run lived on

A stray recorded while its server could not be reached may be long dead once the server
answers again after a restart (NVFLARE 2.9 reports a killed run RUNNING for ever and refuses
to abort it): a different start time settles it (app.usecases.abort.settle_stray_runs).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 00:00:00

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
    with op.batch_alter_table("stray_runs") as batch:
        batch.add_column(sa.Column("server_start_time", sa.Float(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("stray_runs") as batch:
        batch.drop_column("server_start_time")
