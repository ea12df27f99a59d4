"""jobs and prewarms keep the digest of the request as sent

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 23:40:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE, as in 0014. Nullable: the rows stored before it have only the digest
    # with the defaults of their day filled in, which a repeat is still compared with.
    op.add_column("jobs", sa.Column("sent_digest", sa.String(length=64), nullable=True))
    op.add_column("prewarms", sa.Column("sent_digest", sa.String(length=64), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("prewarms", "sent_digest")
    op.drop_column("jobs", "sent_digest")
