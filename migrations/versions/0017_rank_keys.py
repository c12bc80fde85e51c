"""rank_keys: each rank's secret for the attempt, which a peer's worker must prove it knows
before its connection reaches the rank's trainer (`worker.trainer.tunnel`)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 07:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rank_addresses") as batch:
        batch.add_column(sa.Column("key", sa.String(length=64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("rank_addresses") as batch:
        batch.drop_column("key")
