"""jobs may wait for other jobs (`after`): the resolved job ids and the condition

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("after_jobs", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("after_condition", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("after_condition")
        batch_op.drop_column("after_jobs")
