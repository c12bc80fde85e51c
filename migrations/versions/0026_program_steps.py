"""total_steps: None for a command job or a notebook session, whose program alone knows how
many steps it runs (they were given the trainer's default, 1,000: a false progress bar, a false
ETA, and a false end for the scheduler's replays and its elastic rule).

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("spec", sa.JSON), sa.column("total_steps", sa.Integer))


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("total_steps", existing_type=sa.Integer(), nullable=True)
    connection = op.get_bind()
    programs = [
        row.id
        for row in connection.execute(sa.select(jobs.c.id, jobs.c.spec))
        if row.spec.get("command") is not None or row.spec.get("kind") == "notebook"
    ]
    for start in range(0, len(programs), 500):
        chunk = programs[start : start + 500]
        connection.execute(sa.update(jobs).where(jobs.c.id.in_(chunk)).values(total_steps=None))


def downgrade() -> None:
    connection = op.get_bind()
    connection.execute(sa.update(jobs).where(jobs.c.total_steps.is_(None)).values(total_steps=1000))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("total_steps", existing_type=sa.Integer(), nullable=False)
