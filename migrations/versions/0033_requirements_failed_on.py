"""requirements_failed_on: the hosts where a waiting job's requirements could not be
installed while it waited (`worker.prepare`), said in its reason.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-07 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("requirements_failed_on", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("requirements_failed_on")
