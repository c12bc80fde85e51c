"""attempt_token_hash: the hash of the token an executor's remote side (a Slurm node's batch
script) reports with, scoped to the job's current attempt (`/api/attempts/...`); cleared
when the attempt ends. attempt_reports: the number of the last report stored for it (a
report sent again after a lost answer is stored once)

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 17:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attempt_token_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("attempt_reports", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("attempt_reports")
        batch.drop_column("attempt_token_hash")
