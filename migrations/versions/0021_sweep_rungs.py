"""sweep_rungs: an adaptive sweep's settings at its rungs (ASHA), the searcher's state; and
notifications.event: a sweep's own webhook when its last job ends

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 04:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweep_rungs",
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("rung", sa.Integer(), primary_key=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        sa.Column("cut", sa.Float(), nullable=True),
        sa.Column("reached_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("notifications") as batch:
        batch.add_column(sa.Column("event", sa.String(16), nullable=False, server_default="job.finished"))


def downgrade() -> None:
    with op.batch_alter_table("notifications") as batch:
        batch.drop_column("event")
    op.drop_table("sweep_rungs")
