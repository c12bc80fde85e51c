"""users may be allowed high priority; jobs record where batch norm is synchronised

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 13:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_priority", sa.String(length=8), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_norm", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("batch_norm")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("max_priority")
