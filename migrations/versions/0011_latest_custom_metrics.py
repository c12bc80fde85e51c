"""jobs keep their latest custom metrics (train and eval), for the jobs list's columns

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 20:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("custom_metrics", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("eval_custom_metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("eval_custom_metrics")
        batch_op.drop_column("custom_metrics")
