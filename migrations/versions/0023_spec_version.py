"""spec_version: the version of the spec's rules each job was admitted under, so that a rule
made stricter by an upgrade does not fail jobs already queued (`towerq.contract.versions`);
every job stored before is version 1

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 12:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("spec_version", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("spec_version")
