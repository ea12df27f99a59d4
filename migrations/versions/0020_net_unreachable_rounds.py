"""a net's runs are lost after the grace and that many failed monitor rounds in a row

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 11:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE, as in 0014 and 0019: SQLite's batch mode would copy the table. A net
    # unreachable at the upgrade starts its count at 0: its runs are lost a few rounds later.
    op.add_column(
        "nets",
        sa.Column("unreachable_rounds", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("nets", "unreachable_rounds")
