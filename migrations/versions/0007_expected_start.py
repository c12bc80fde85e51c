"""queued jobs carry the scheduler's expected start time and host

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expected_start_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("expected_host", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("expected_host")
        batch_op.drop_column("expected_start_at")
