"""prewarms: a hold on a net's server until a deadline kept in SQL (models.prewarms)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "prewarms",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("caller_key", sa.String(length=200), nullable=False),
        sa.Column("request_digest", sa.String(length=64), nullable=True),
        sa.Column("net_name", sa.String(length=63), nullable=True),
        sa.Column("required_sites", sa.JSON(), nullable=False),
        sa.Column("within_s", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hold_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=40), nullable=True),
        sa.Column("refused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("detail", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("counted", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(
            ["net_name"],
            ["nets.name"],
            name=op.f("fk_prewarms_net_name_nets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prewarms")),
    )
    op.create_index(
        "uq_prewarms_caller_key_accepted",
        "prewarms",
        ["caller_key"],
        unique=True,
        postgresql_where=sa.text("NOT refused"),
        sqlite_where=sa.text("refused = 0"),
    )
    op.create_index("ix_prewarms_caller_key", "prewarms", ["caller_key"])
    op.create_index("ix_prewarms_net_name_hold_until", "prewarms", ["net_name", "hold_until"])
    op.create_index(
        "ix_prewarms_open",
        "prewarms",
        ["hold_until"],
        postgresql_where=sa.text("outcome IS NULL"),
        sqlite_where=sa.text("outcome IS NULL"),
    )
    op.create_index(
        "ix_prewarms_uncounted",
        "prewarms",
        ["id"],
        postgresql_where=sa.text("outcome IS NOT NULL AND NOT counted"),
        sqlite_where=sa.text("outcome IS NOT NULL AND counted = 0"),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_prewarms_uncounted", table_name="prewarms")
    op.drop_index("ix_prewarms_open", table_name="prewarms")
    op.drop_index("ix_prewarms_net_name_hold_until", table_name="prewarms")
    op.drop_index("ix_prewarms_caller_key", table_name="prewarms")
    op.drop_index("uq_prewarms_caller_key_accepted", table_name="prewarms")
    op.drop_table("prewarms")
