"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 10:52:57.118257

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "nets",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "STOPPED",
                "STARTING",
                "READY",
                "BUSY",
                "STOPPING",
                "UNHEALTHY",
                "OUTAGE",
                "MISCONFIGURED",
                name="net_state",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("state_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("idle_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("unreachable_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("server_start_time", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("version", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nets")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("caller_key", sa.String(length=200), nullable=False),
        sa.Column("definition", sa.String(length=1024), nullable=False),
        sa.Column("required_sites", sa.JSON(), nullable=False),
        sa.Column("requested_net", sa.String(length=63), nullable=True),
        sa.Column("net_name", sa.String(length=63), nullable=True),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "QUEUED",
                "ASSIGNED",
                "DISPATCHING",
                "RUNNING",
                "ABORTING",
                "COMPLETED",
                "FAILED",
                "ABORTED",
                name="job_state",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("retries", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("submit_token", sa.String(length=80), nullable=True),
        sa.Column("nvflare_job_id", sa.String(length=80), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("assigned_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.ForeignKeyConstraint(["net_name"], ["nets.name"], name=op.f("fk_jobs_net_name_nets")),
        sa.ForeignKeyConstraint(
            ["requested_net"], ["nets.name"], name=op.f("fk_jobs_requested_net_nets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("caller_key", name=op.f("uq_jobs_caller_key")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_state_priority_created", ["state", "priority", "created_at"], unique=False
        )
        batch_op.create_index(
            "uq_jobs_one_active_per_net",
            ["net_name"],
            unique=True,
            postgresql_where=sa.text("state IN ('ABORTING', 'ASSIGNED', 'DISPATCHING', 'RUNNING')"),
            sqlite_where=sa.text("state IN ('ABORTING', 'ASSIGNED', 'DISPATCHING', 'RUNNING')"),
        )

    op.create_table(
        "net_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("net_name", sa.String(length=63), nullable=False),
        sa.Column(
            "from_state",
            sa.Enum(
                "STOPPED",
                "STARTING",
                "READY",
                "BUSY",
                "STOPPING",
                "UNHEALTHY",
                "OUTAGE",
                "MISCONFIGURED",
                name="net_event_from",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=True,
        ),
        sa.Column(
            "to_state",
            sa.Enum(
                "STOPPED",
                "STARTING",
                "READY",
                "BUSY",
                "STOPPING",
                "UNHEALTHY",
                "OUTAGE",
                "MISCONFIGURED",
                name="net_event_to",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.ForeignKeyConstraint(
            ["net_name"],
            ["nets.name"],
            name=op.f("fk_net_events_net_name_nets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_net_events")),
    )
    with op.batch_alter_table("net_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_net_events_net_name"), ["net_name"], unique=False)

    op.create_table(
        "scale_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("net_name", sa.String(length=63), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("outcome", sa.String(length=200), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["net_name"],
            ["nets.name"],
            name=op.f("fk_scale_events_net_name_nets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scale_events")),
    )
    with op.batch_alter_table("scale_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_scale_events_net_name"), ["net_name"], unique=False)

    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column(
            "from_state",
            sa.Enum(
                "QUEUED",
                "ASSIGNED",
                "DISPATCHING",
                "RUNNING",
                "ABORTING",
                "COMPLETED",
                "FAILED",
                "ABORTED",
                name="job_event_from",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=True,
        ),
        sa.Column(
            "to_state",
            sa.Enum(
                "QUEUED",
                "ASSIGNED",
                "DISPATCHING",
                "RUNNING",
                "ABORTING",
                "COMPLETED",
                "FAILED",
                "ABORTED",
                name="job_event_to",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_events_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_events_job_id"))

    op.drop_table("job_events")
    with op.batch_alter_table("scale_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scale_events_net_name"))

    op.drop_table("scale_events")
    with op.batch_alter_table("net_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_net_events_net_name"))

    op.drop_table("net_events")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_jobs_one_active_per_net",
            postgresql_where=sa.text("state IN ('ABORTING', 'ASSIGNED', 'DISPATCHING', 'RUNNING')"),
            sqlite_where=sa.text("state IN ('ABORTING', 'ASSIGNED', 'DISPATCHING', 'RUNNING')"),
        )
        batch_op.drop_index("ix_jobs_state_priority_created")

    op.drop_table("jobs")
    op.drop_table("nets")
