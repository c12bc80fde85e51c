"""gpu_use: what a job's GPUs did, by attempt and rank (how busy, the most memory its
processes held), as its worker sampled NVML (`worker.gpu_use`).

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-06 08:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpu_use", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpu_use")
