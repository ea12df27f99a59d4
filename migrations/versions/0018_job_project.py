"""a job names its project: the claim shares the nets between projects

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 09:00:00

"""

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The job states that hold a net (models.columns.ACTIVE_SQL when this was written).
_ACTIVE = "state IN ('ABORTING', 'ASSIGNED', 'DISPATCHING', 'FINISHING', 'RUNNING')"
# app.schemas.PROJECT_ID_PATTERN when this was written.
_PROJECT_ID = re.compile(r"[A-Za-z0-9_:@-][A-Za-z0-9._:@-]{0,99}")
_JOBS = sa.table(
    "jobs",
    sa.column("id", sa.Uuid()),
    sa.column("state", sa.String()),
    sa.column("metadata", sa.JSON()),
    sa.column("project_id", sa.String()),
)


def upgrade() -> None:
    """Upgrade schema."""
    # Plain ALTER TABLE, as in 0014: SQLite's batch mode would copy the table. Nullable: a
    # job that names no project is in the default project.
    op.add_column("jobs", sa.Column("project_id", sa.String(length=100), nullable=True))
    # The jobs not yet ended (few: the queue and a job per net) get the project FLIP put in
    # their metadata, as an enqueue now does, so the shares count the nets they hold and the
    # queue is ordered by project from the first claim after the upgrade. Ended jobs keep
    # NULL: nothing reads their project.
    conn = op.get_bind()
    live = conn.execute(
        sa.select(_JOBS.c.id, _JOBS.c.metadata).where(
            _JOBS.c.state.not_in(("COMPLETED", "FAILED", "ABORTED"))
        )
    ).all()
    for job_id, metadata in live:
        project = metadata.get("project_id") if isinstance(metadata, dict) else None
        if isinstance(project, str) and _PROJECT_ID.fullmatch(project):
            conn.execute(sa.update(_JOBS).where(_JOBS.c.id == job_id).values(project_id=project))
    op.create_index(
        "ix_jobs_active_project",
        "jobs",
        ["project_id"],
        unique=False,
        postgresql_where=sa.text(_ACTIVE),
        sqlite_where=sa.text(_ACTIVE),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(
        "ix_jobs_active_project",
        table_name="jobs",
        postgresql_where=sa.text(_ACTIVE),
        sqlite_where=sa.text(_ACTIVE),
    )
    op.drop_column("jobs", "project_id")
