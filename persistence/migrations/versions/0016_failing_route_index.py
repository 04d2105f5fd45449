"""the console's failing routes from the store's counts: a partial index (service, operation, last_update_ts) of
the FAILED and PARTLY_FAILED messages, in place of 0015's (last_update_ts)

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 00:45:00

The dashboard counted the failing messages of the last 24 hours per route by reading each of them (0015's index
gave the window's rows): 2,590 failures a day cost 5.4 ms, and an outage that fails 100,000 messages made every
view of the dashboard read 100,000 rows. It now takes each route's failing messages from the store's kept counts
(``message_count``, migration 0014) and reads only each failing route's latest failure: this index's first
entry for the route, newest first. 0015's index served only that read. Partial, as before: messages in other
states cost it nothing on write.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

#: the failing states, written as SQL so that both dialects keep the index to them
FAILING_STATES = sa.text("state IN ('FAILED', 'PARTLY_FAILED')")


def upgrade() -> None:
    # indexes only (no column or constraint changes): plain CREATE / DROP INDEX on both dialects, no batch copy
    op.create_index("ix_message_failing_route", "message", ["service", "operation", "last_update_ts"],
                    postgresql_where=FAILING_STATES, sqlite_where=FAILING_STATES)
    op.drop_index("ix_message_failing_update", table_name="message")


def downgrade() -> None:
    op.create_index("ix_message_failing_update", "message", ["last_update_ts"], postgresql_where=FAILING_STATES,
                    sqlite_where=FAILING_STATES)
    op.drop_index("ix_message_failing_route", table_name="message")
