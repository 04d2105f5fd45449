"""initial schema: message, external_call, confirmation, node

Revision ID: 0001
Revises:
Create Date: 2026-11-22 21:58:45.892178
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None


def upgrade() -> None:
    _create_message()
    _create_node()
    _create_confirmation()
    _create_external_call()


def _create_message() -> None:
    op.create_table('message',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('correlation_id', sa.String(length=255), nullable=False),
    sa.Column('source_system', sa.String(length=100), nullable=False),
    sa.Column('process_id', sa.String(length=255), nullable=True),
    sa.Column('service', sa.String(length=100), nullable=False),
    sa.Column('operation', sa.String(length=100), nullable=False),
    sa.Column('object_id', sa.String(length=255), nullable=True),
    sa.Column('entity_type', sa.String(length=100), nullable=True),
    sa.Column('funnel_value', sa.String(length=255), nullable=True),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.Column('content_type', sa.String(length=100), nullable=False),
    sa.Column('headers', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('state', sa.Enum('NEW', 'PROCESSING', 'PARTLY_FAILED', 'POSTPONED', 'WAITING_FOR_CHILDREN', 'OK', 'FAILED', 'SKIPPED', 'CANCEL', name='message_state', native_enum=False, length=32), nullable=False),
    sa.Column('failed_count', sa.Integer(), nullable=False),
    sa.Column('receive_ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('msg_ts', sa.DateTime(timezone=True), nullable=True),
    sa.Column('start_process_ts', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_update_ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('node_id', sa.String(length=100), nullable=True),
    sa.Column('custom_data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('business_errors', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('last_error_code', sa.String(length=100), nullable=True),
    sa.Column('last_error_text', sa.Text(), nullable=True),
    sa.Column('parent_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['parent_id'], ['message.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('source_system', 'correlation_id', name='uq_message_source_correlation')
    )
    with op.batch_alter_table('message', schema=None) as batch_op:
        batch_op.create_index('ix_message_entity_object', ['entity_type', 'object_id', 'receive_ts'], unique=False)
        batch_op.create_index('ix_message_funnel_state', ['funnel_value', 'state'], unique=False)
        batch_op.create_index('ix_message_last_update', ['last_update_ts'], unique=False)
        batch_op.create_index('ix_message_node_state', ['node_id', 'state'], unique=False)
        batch_op.create_index('ix_message_parent', ['parent_id'], unique=False)
        batch_op.create_index('ix_message_service_op_state', ['service', 'operation', 'state', 'receive_ts'], unique=False)
        batch_op.create_index('ix_message_state_next_attempt', ['state', 'next_attempt_at'], unique=False)
        batch_op.create_index('ix_message_state_receive', ['state', 'receive_ts'], unique=False)
        batch_op.create_index('ix_message_state_start', ['state', 'start_process_ts'], unique=False)


def _create_node() -> None:
    op.create_table('node',
    sa.Column('id', sa.String(length=100), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )


def _create_confirmation() -> None:
    op.create_table('confirmation',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('source_system', sa.String(length=100), nullable=False),
    sa.Column('outcome_state', sa.Enum('NEW', 'PROCESSING', 'PARTLY_FAILED', 'POSTPONED', 'WAITING_FOR_CHILDREN', 'OK', 'FAILED', 'SKIPPED', 'CANCEL', name='message_state', native_enum=False, length=32), nullable=False),
    sa.Column('status', sa.Enum('PENDING', 'SENT', 'FAILED', name='confirmation_status', native_enum=False, length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('sent_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['message_id'], ['message.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('message_id')
    )
    with op.batch_alter_table('confirmation', schema=None) as batch_op:
        batch_op.create_index('ix_confirmation_status_next', ['status', 'next_attempt_at'], unique=False)


def _create_external_call() -> None:
    op.create_table('external_call',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('message_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('call_key', sa.String(length=255), nullable=False),
    sa.Column('status', sa.Enum('OK', 'FAILED', name='external_call_status', native_enum=False, length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('result', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['message_id'], ['message.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('message_id', 'call_key', name='uq_external_call_message_key')
    )



def downgrade() -> None:

    op.drop_table('external_call')
    with op.batch_alter_table('confirmation', schema=None) as batch_op:
        batch_op.drop_index('ix_confirmation_status_next')

    op.drop_table('confirmation')
    op.drop_table('node')
    with op.batch_alter_table('message', schema=None) as batch_op:
        batch_op.drop_index('ix_message_state_start')
        batch_op.drop_index('ix_message_state_receive')
        batch_op.drop_index('ix_message_state_next_attempt')
        batch_op.drop_index('ix_message_service_op_state')
        batch_op.drop_index('ix_message_parent')
        batch_op.drop_index('ix_message_node_state')
        batch_op.drop_index('ix_message_last_update')
        batch_op.drop_index('ix_message_funnel_state')
        batch_op.drop_index('ix_message_entity_object')

    op.drop_table('message')

