"""environment fingerprints of stage runs, content digests of checkpoints

`stage_runs.environment` holds the workers' environment fingerprint (core.fingerprint),
which `baton rerun` compares; `checkpoints.content_digest` identifies a checkpoint by its
content (ckpt.content_digest), equal for reproductions written elsewhere. Rows written
before this revision have neither.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 16:20:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('stage_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('environment', sa.JSON(), nullable=True))
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.add_column(sa.Column('content_digest', sa.String(length=80), nullable=True))
        batch_op.create_index(batch_op.f('ix_checkpoints_content_digest'), ['content_digest'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoints_content_digest'))
        batch_op.drop_column('content_digest')
    with op.batch_alter_table('stage_runs', schema=None) as batch_op:
        batch_op.drop_column('environment')
