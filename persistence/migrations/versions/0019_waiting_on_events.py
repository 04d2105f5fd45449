"""messages wait on events, not on polls: ``message.parked_on`` and the indexes of the due, parked and funnel queues

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 23:00:00

- ``message.parked_on``: the external system a message waits for. A POSTPONED message parked on its open circuit
  breaker has no due time: it is released (made due, in receive order) when the breaker lets calls through again,
  instead of being claimed at every open period to find out it must still wait. A PARTLY_FAILED message whose call
  of the system failed is due by its retry policy, or at once when the breaker closes.
- ``ix_message_due (next_attempt_at, id)``, partial (PARTLY_FAILED / POSTPONED with a due time): the feeder takes
  the due messages in due order from the index, with no sort over the backlog, whatever its size.
- ``ix_message_parked (parked_on, receive_ts, id)``, partial (messages waiting for a system): the release of one
  system's messages in receive order.
- ``ix_message_funnel_queue (funnel_value, receive_ts, id)``, partial (messages queued behind their funnel, error
  code FUNNEL): the message a funnel's release hands the funnel to.

A message POSTPONED for its funnel before this upgrade kept a due time: it is taken once more when it is due and
then waits in the queue like the others.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0019"
down_revision = "0018"

# the predicates as models.py has them today (written out: a later change of the models never rewrites this)
_INDEXES = (
    ("ix_message_due", ["next_attempt_at", "id"],
     "state IN ('PARTLY_FAILED', 'POSTPONED') AND next_attempt_at IS NOT NULL"),
    ("ix_message_parked", ["parked_on", "receive_ts", "id"],
     "state IN ('POSTPONED', 'PARTLY_FAILED') AND parked_on IS NOT NULL"),
    ("ix_message_funnel_queue", ["funnel_value", "receive_ts", "id"],
     "state = 'POSTPONED' AND last_error_code = 'FUNNEL'"),
)


def upgrade() -> None:
    # plain ALTER TABLE and CREATE INDEX on both databases: a batch would copy the table on SQLite (and its triggers
    # would have to be made again)
    op.add_column("message", sa.Column("parked_on", sa.String(100), nullable=True))
    for name, columns, predicate in _INDEXES:
        where = sa.text(predicate)
        op.create_index(name, "message", columns, unique=False, postgresql_where=where, sqlite_where=where)


def downgrade() -> None:
    for name, _columns, _predicate in _INDEXES:
        op.drop_index(name, table_name="message")
    op.execute("ALTER TABLE message DROP COLUMN parked_on")  # SQLite >= 3.35 too, without copying the table
