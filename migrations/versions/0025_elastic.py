"""min_gpu_count: an elastic job's least size (None: not elastic). resize_to: where an
elastic job the scheduler stopped to resize starts its next attempt, and for which job
(`service.scheduler.resize`). resumed_steps: the step each resumed attempt started from, by
attempt (the job page marks it on its charts)

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("min_gpu_count", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("resize_to", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("resumed_steps", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("resumed_steps")
        batch.drop_column("resize_to")
        batch.drop_column("min_gpu_count")
