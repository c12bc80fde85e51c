"""job_pace: a running job's wall-clock seconds per step (evaluations and checkpoints
included) and when its latest step arrived, for an expected end that holds

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 21:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pace_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("step_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("step_at")
        batch.drop_column("pace_s")
