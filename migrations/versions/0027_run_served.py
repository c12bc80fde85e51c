"""run_served_gpu_s: the GPU-seconds a job had served when its current run began (it last left
the queue), so that time slicing counts an elastic job's run across its resizes, each of which
starts a new attempt (`service.scheduler.costs.sliceable_from`). None on the rows of jobs
dispatched before: their current attempt counts as their run, as before.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-01 20:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("run_served_gpu_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("run_served_gpu_s")
