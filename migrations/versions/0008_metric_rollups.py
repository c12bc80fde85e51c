"""metric_rollups: each job's series in buckets of 64 steps (lowest and highest loss), for
charts of long jobs

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 19:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("split", sa.String(length=8), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("min_step", sa.Integer(), nullable=False),
        sa.Column("min_loss", sa.Float(), nullable=False),
        sa.Column("max_step", sa.Integer(), nullable=False),
        sa.Column("max_loss", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "split", "bucket"),
    )


def downgrade() -> None:
    op.drop_table("metric_rollups")
