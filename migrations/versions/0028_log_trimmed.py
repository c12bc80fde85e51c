"""log_trimmed_through: the newest of a job's log lines trimmed from the database (its
`log.txt` keeps them all), so that a reader who had not read that far is told some lines are
not there (`service.core.attempts.trim_logs`, `/api/jobs/{id}/logs`). None: none was.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05 16:05:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("log_trimmed_through", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("log_trimmed_through")
