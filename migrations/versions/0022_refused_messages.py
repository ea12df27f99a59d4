"""refused_messages and rejected_requests.payload_digest: which messages and which payload a
refusal answered

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
    # 0019, 0020); rows kept from before have none, and a repeat of their request after the
    # upgrade is matched by its caller_key, code and reason, as before. And a new table.
    op.add_column(
        "rejected_requests", sa.Column("payload_digest", sa.String(length=64), nullable=True)
    )
    op.create_table(
        "refused_messages",
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.Column(
            "rejection_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["rejection_id"],
            ["rejected_requests.id"],
            name=op.f("fk_refused_messages_rejection_id_rejected_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("message_id", name=op.f("pk_refused_messages")),
    )
    op.create_index(op.f("ix_refused_messages_rejection_id"), "refused_messages", ["rejection_id"])


def downgrade() -> None:
    """Downgrade schema."""
    # The messages' refusals are forgotten: a copy handled by 0021's code is judged again.
    op.drop_index(op.f("ix_refused_messages_rejection_id"), table_name="refused_messages")
    op.drop_table("refused_messages")
    op.drop_column("rejected_requests", "payload_digest")
