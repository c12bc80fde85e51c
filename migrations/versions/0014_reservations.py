"""reservations: GPUs kept for a group over a window

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("group", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.String(length=200), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reservations")),
    )
    op.create_index(op.f("ix_reservations_end_at"), "reservations", ["end_at"], unique=False)
    op.create_index(op.f("ix_reservations_group"), "reservations", ["group"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_reservations_group"), table_name="reservations")
    op.drop_index(op.f("ix_reservations_end_at"), table_name="reservations")
    op.drop_table("reservations")
