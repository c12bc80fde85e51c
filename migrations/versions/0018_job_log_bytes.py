"""job_log_bytes: what each job's log lines and metric points took, all attempts together,
counted toward a cap per job and shown per member on the Usage page

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 07:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("log_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("metric_points", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("metric_points")
        batch.drop_column("log_bytes")
