"""wait_held_s: the seconds a job spent on hold before its first start, which the wait
figures (`towerq usage`, the usage page, Prometheus' queue wait) leave out, as the
scheduler's order leaves out all its time on hold (`held_s`).

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05 22:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("wait_held_s", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("wait_held_s")
