"""where each checkpoint's copies live (checkpoint tiers)

`checkpoints.locations` maps a tier (persistent, memory, peer, remote) to the outcome of
its copy: {"ok": true, "where": ...} or {"ok": false, "error": ...}. Null for rows written
before this revision and for checkpoints saved without tiers (the run directory only).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 05:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.add_column(sa.Column('locations', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_column('locations')
