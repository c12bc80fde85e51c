"""begin_at: the time before which a queued job may not start (`"begin_at"` in its spec,
`towerq run --begin`, as `sbatch --begin`); each pass leaves it out until then.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-06 04:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("begin_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("begin_at")
