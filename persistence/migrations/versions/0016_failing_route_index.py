"""the console's failing routes from the store's counts: a partial index of the FAILED and PARTLY_FAILED messages
by route (as expressions), last_update_ts and id, in place of 0015's (last_update_ts)

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


#: the route as the index keys it: ``service || ''`` and ``operation || ''``, not the columns. A search by route
#: and a failed state (``service = ... AND operation = ... AND state = 'FAILED'``) matches the columns and implies
#: the predicate, and PostgreSQL took this small index for it in a BitmapAnd that read every failed message of
#: the route (service, operation, FAILED and a source system at 1M rows: 9,498 heap pages, 32 ms, where
#: ``ix_message_service_op_state`` reads 52 rows). Only the dashboard's lookup names these expressions.
ROUTE_KEY = [sa.text("(service || '')"), sa.text("(operation || '')")]


def upgrade() -> None:
    # indexes only (no column or constraint changes): plain CREATE / DROP INDEX on both dialects, no batch copy
    # the id last: the lookup's order (last change, then id, newest first) is the index's, so it stops at the first
    # entry whatever the planner estimates (an expression's statistics exist only after an ANALYZE; estimating one
    # row, it sorted a route's 10,000 failures rather than read them in order up to the first change)
    op.create_index("ix_message_failing_route", "message", [*ROUTE_KEY, "last_update_ts", "id"],
                    postgresql_where=FAILING_STATES, sqlite_where=FAILING_STATES)
    op.drop_index("ix_message_failing_update", table_name="message")


def downgrade() -> None:
    op.create_index("ix_message_failing_update", "message", ["last_update_ts"], postgresql_where=FAILING_STATES,
                    sqlite_where=FAILING_STATES)
    op.drop_index("ix_message_failing_route", table_name="message")
