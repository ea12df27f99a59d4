"""metric totals: history folded into running totals, claims that fail in one query

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 09:00:00

A scrape of /metrics used to read the whole history; now it folds the rows written since
the last scrape into running totals (app.metrics): a `counted` flag on the three history
tables (and `retries_counted` on jobs) with partial indexes that find the rows not counted
yet, and the two tables of totals. Existing history starts uncounted: `fl-dispatcher db
upgrade` folds it once after migrating (app.metrics.catch_up). Also an index on the queued
jobs' requested nets, so a claim that cannot place any job costs one query.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HISTORY = ("job_events", "net_events", "scale_events")


def upgrade() -> None:
    """Upgrade schema."""
    for table in _HISTORY:
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("counted", sa.Boolean(), server_default=sa.text("false"), nullable=False)
            )
        op.create_index(
            f"ix_{table}_uncounted",
            table,
            ["id"],
            postgresql_where=sa.text("NOT counted"),
            sqlite_where=sa.text("counted = 0"),
        )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("retries_counted", sa.Integer(), server_default=sa.text("0"), nullable=False)
        )
    op.create_index("ix_jobs_retries_uncounted", "jobs", [sa.text("(retries - retries_counted)")])
    op.create_index(
        "ix_jobs_queued_requested_net",
        "jobs",
        ["requested_net"],
        postgresql_where=sa.text("state = 'QUEUED'"),
        sqlite_where=sa.text("state = 'QUEUED'"),
    )
    op.create_table(
        "metric_totals",
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("labels", sa.String(length=512), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("metric", "labels", name=op.f("pk_metric_totals")),
    )
    op.create_table(
        "metric_net_clocks",
        sa.Column("net_name", sa.String(length=63), nullable=False),
        sa.Column("starting_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("up_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("uptime_us", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["net_name"],
            ["nets.name"],
            name=op.f("fk_metric_net_clocks_net_name_nets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("net_name", name=op.f("pk_metric_net_clocks")),
    )


def downgrade() -> None:
    """Downgrade schema (the totals are dropped; the history still holds everything)."""
    op.drop_table("metric_net_clocks")
    op.drop_table("metric_totals")
    op.drop_index("ix_jobs_queued_requested_net", table_name="jobs")
    op.drop_index("ix_jobs_retries_uncounted", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("retries_counted")
    for table in _HISTORY:
        op.drop_index(f"ix_{table}_uncounted", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("counted")
