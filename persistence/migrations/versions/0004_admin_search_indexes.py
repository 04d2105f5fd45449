"""indexes of the admin search: correlation id, object id, process id, receive time

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 10:05:00

Admin search pages newest first by (receive_ts, id) with a keyset cursor; each filter that selects few rows has
its own index ordered by receive time, and the receive-time index serves unfiltered pages and time windows.
"""
from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"

INDEXES = {
    "ix_message_receive": ["receive_ts", "id"],
    "ix_message_correlation": ["correlation_id"],
    "ix_message_object": ["object_id", "receive_ts"],
    "ix_message_process": ["process_id", "receive_ts"],
}


def upgrade() -> None:
    with op.batch_alter_table("message", schema=None) as batch_op:
        for name, columns in INDEXES.items():
            batch_op.create_index(name, columns, unique=False)


def downgrade() -> None:
    with op.batch_alter_table("message", schema=None) as batch_op:
        for name in INDEXES:
            batch_op.drop_index(name)
