"""the datasets each stage run read (stages.data)

`stage_runs.datasets` lists, per dataset a stage trained or evaluated on, its path,
content digest, rows, format, key mapping, tokenizer and chat-template digests and the
rows read. Null for runs on the built-in tasks and for rows written before this revision.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06 23:30:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0006'
down_revision: Union[str, Sequence[str], None] = '0005'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('stage_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('datasets', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('stage_runs', schema=None) as batch_op:
        batch_op.drop_column('datasets')
