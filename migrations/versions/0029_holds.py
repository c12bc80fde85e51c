"""on_hold_by, on_hold_at, held_s: a queued job put on hold (`towerq hold`, as Slurm's
`scontrol hold`) waits, left out of every pass, until its holder (or an admin) releases it;
the time it spent on hold is not counted as waiting (`held_s`, all its holds together).

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-05 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("on_hold_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("on_hold_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("held_s", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("held_s")
        batch.drop_column("on_hold_at")
        batch.drop_column("on_hold_by")
