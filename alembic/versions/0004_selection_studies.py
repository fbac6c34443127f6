"""selection studies: which checkpoint of a stage run RL should start from

`studies` holds one study over the checkpoints of a stage run (kind `selection`): its
config, its analysis (correlation table), the winning diagnostic and direction, and a
verdict; `study_candidates` holds each checkpoint's pre-RL diagnostics and the outcome
of the short RL started from it. New tables only: existing rows are untouched.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 20:11:03

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('studies',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('from_stage_run_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('results', sa.JSON(), nullable=True),
    sa.Column('winner_diagnostic', sa.String(length=50), nullable=True),
    sa.Column('winner_direction', sa.Integer(), nullable=True),
    sa.Column('verdict', sa.Text(), nullable=True),
    sa.Column('mlflow_run_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['from_stage_run_id'], ['stage_runs.id'],
                            name=op.f('fk_studies_from_stage_run_id_stage_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_studies'))
    )
    with op.batch_alter_table('studies', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_studies_from_stage_run_id'), ['from_stage_run_id'],
                              unique=False)

    op.create_table('study_candidates',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('checkpoint_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('diagnostics', sa.JSON(), nullable=False),
    sa.Column('outcome', sa.JSON(), nullable=True),
    sa.Column('rl_run_dir', sa.Text(), nullable=True),
    sa.Column('mlflow_run_id', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'],
                            name=op.f('fk_study_candidates_checkpoint_id_checkpoints')),
    sa.ForeignKeyConstraint(['study_id'], ['studies.id'],
                            name=op.f('fk_study_candidates_study_id_studies')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_study_candidates')),
    sa.UniqueConstraint('study_id', 'checkpoint_id',
                        name=op.f('uq_study_candidates_study_id_checkpoint_id'))
    )
    with op.batch_alter_table('study_candidates', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_study_candidates_study_id'), ['study_id'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('study_candidates', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_study_candidates_study_id'))
    op.drop_table('study_candidates')
    with op.batch_alter_table('studies', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_studies_from_stage_run_id'))
    op.drop_table('studies')
