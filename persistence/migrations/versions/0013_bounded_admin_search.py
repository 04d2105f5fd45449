"""admin search bounded at 1M messages: an operation index, error code with service, leaner trigram indexes

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 09:00:00

What the plans of every admin search filter at 1,000,000 aged messages showed (benchmarks/admin_bench.py --plans):

- ``ix_message_operation`` (operation, receive_ts): the operation alone had no index leading with it; a search for
  an operation that no message has read the whole table (1M rows, about 300 ms).
- ``ix_message_error_service`` (last_error_code, service, receive_ts), messages with an error only: an error code
  with a service reads the matches newest first; before, a code that the service never had read every message
  of the code (8,500 rows). Partial, so messages without an error cost it nothing on write.
- ``ix_message_error_text_trgm`` becomes partial (``last_error_text IS NOT NULL``): the messages without an error
  (most of a store) were indexed as NULL entries in it, and their writes filled its pending list.
- Both trigram (GIN) indexes get ``gin_pending_list_limit = 128`` (kB; the server's default is 4 MB): every text
  search reads the whole pending list of new entries, so a full default list cost 200-300 pages per search.
  Writers merge the list into the index every 128 kB instead of every 4 MB.

Builds the indexes with plain CREATE INDEX: on a large store, run it in a quiet hour (writes wait meanwhile).
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"

_WITH_ERROR = sa.text("last_error_code IS NOT NULL")
_WITH_ERROR_TEXT = sa.text("last_error_text IS NOT NULL")
#: kB of new entries a trigram index keeps apart before merging them in (a search reads them all)
PENDING_LIST_KB = 128


def upgrade() -> None:
    with op.batch_alter_table("message") as batch_op:
        batch_op.create_index("ix_message_operation", ["operation", "receive_ts"], unique=False)
        batch_op.create_index("ix_message_error_service", ["last_error_code", "service", "receive_ts"],
                              unique=False, postgresql_where=_WITH_ERROR, sqlite_where=_WITH_ERROR)
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_message_error_text_trgm", table_name="message")
        op.create_index("ix_message_error_text_trgm", "message", ["last_error_text"], postgresql_using="gin",
                        postgresql_ops={"last_error_text": "gin_trgm_ops"}, postgresql_where=_WITH_ERROR_TEXT,
                        postgresql_with={"gin_pending_list_limit": PENDING_LIST_KB})
        op.execute(f"ALTER INDEX ix_message_payload_trgm SET (gin_pending_list_limit = {PENDING_LIST_KB})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER INDEX ix_message_payload_trgm RESET (gin_pending_list_limit)")
        op.drop_index("ix_message_error_text_trgm", table_name="message")
        op.create_index("ix_message_error_text_trgm", "message", ["last_error_text"], postgresql_using="gin",
                        postgresql_ops={"last_error_text": "gin_trgm_ops"})
    with op.batch_alter_table("message") as batch_op:
        batch_op.drop_index("ix_message_error_service")
        batch_op.drop_index("ix_message_operation")
