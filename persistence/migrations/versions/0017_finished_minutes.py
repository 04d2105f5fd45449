"""finished messages per minute kept by the store: ``message_finished_minute`` (transitions into a final state per
UTC minute and state, as of the counts' mark) and ``message_finished_delta`` (a deleted message taken out of it)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 01:00:00

The console's dashboard showed the messages finished in the last hour (per state, and in twelve five-minute bars)
by reading every finished message whose last change was in the hour: 360,000 rows per view at 100 messages/s. It
now reads these minutes plus the transitions after the mark (``persistence/counts.py``): the minutes times the
states. The fold keeps the table, in the same transaction as ``message_count``, and deletes minutes older than
``FINISHED_KEPT``. The upgrade fills it from the transitions already folded (up to the mark) of the last
``FINISHED_KEPT``.

Like ``message_count`` (migration 0014), the table keeps the folded transitions of a deleted message: a second
delete trigger on ``message`` appends, for each of its folded transitions into a final state of the last
``FINISHED_KEPT`` (plus a margin, by the database's clock), a row (at, state, -1) to ``message_finished_delta``
(no key: concurrent deleters never wait for each other), which the reads add and the fold moves into the minutes.
The row copies the transition's ``at`` as stored, so no trigger writes a timestamp in a format of its own. Older
transitions need none: their minutes are gone or going. On PostgreSQL TRUNCATE empties both tables.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from openroute.persistence.counts import FINISHED_DELTA_MARGIN, FINISHED_KEPT, refill_finished
from openroute.persistence.models import FINAL_STATES

revision = "0017"
down_revision = "0016"

#: the window of the delete trigger, in minutes (fixed in the database by this migration)
_WINDOW = int((FINISHED_KEPT + FINISHED_DELTA_MARGIN).total_seconds()) // 60
_FINAL = ", ".join(f"'{state.value}'" for state in sorted(FINAL_STATES))
# the folded transitions into a final state of the deleted message, recent enough that their minute is kept
_FINISHED = (
    "SELECT t.at, t.to_state, -1 FROM message_transition t WHERE t.message_id = OLD.id AND t.id <= {mark} "
    f"AND t.to_state IN ({_FINAL}) AND t.at >= {{since}}"
)

POSTGRES_UP = [
    """CREATE FUNCTION message_finished_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mark bigint;
BEGIN
    -- shared, as in message_count_on_delete (which fired first and holds it already): the mark stays this one
    SELECT transition_id INTO mark FROM message_count_mark WHERE id = 1 FOR SHARE;
    IF NOT FOUND THEN
        RETURN OLD;
    END IF;
    INSERT INTO message_finished_delta (at, state, n) """
    + _FINISHED.format(mark="mark", since=f"now() - interval '{_WINDOW} minutes'")
    + """;
    RETURN OLD;
END $$""",
    # BEFORE: the message's transitions are still there (the cascade deletes them after the row)
    "CREATE TRIGGER message_finished_delete BEFORE DELETE ON message FOR EACH ROW "
    "EXECUTE FUNCTION message_finished_on_delete()",
    """CREATE FUNCTION message_finished_on_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM message_finished_minute;
    DELETE FROM message_finished_delta;
    RETURN NULL;
END $$""",
    "CREATE TRIGGER message_finished_truncate AFTER TRUNCATE ON message FOR EACH STATEMENT "
    "EXECUTE FUNCTION message_finished_on_truncate()",
    "CREATE TRIGGER message_finished_truncate AFTER TRUNCATE ON message_transition FOR EACH STATEMENT "
    "EXECUTE FUNCTION message_finished_on_truncate()",
]
POSTGRES_DOWN = [
    "DROP TRIGGER message_finished_truncate ON message_transition",
    "DROP TRIGGER message_finished_truncate ON message",
    "DROP TRIGGER message_finished_delete ON message",
    "DROP FUNCTION message_finished_on_truncate()",
    "DROP FUNCTION message_finished_on_delete()",
]

# SQLite's datetime() text ('YYYY-MM-DD HH:MM:SS') compares as text with the stored one (the same, with microseconds)
SQLITE_UP = [
    f"""CREATE TRIGGER message_finished_delete BEFORE DELETE ON message FOR EACH ROW BEGIN
    INSERT INTO message_finished_delta (at, state, n) {_FINISHED.format(
        mark="(SELECT transition_id FROM message_count_mark WHERE id = 1)",
        since=f"datetime('now', '-{_WINDOW} minutes')",
    )};
END""",
]
SQLITE_DOWN = ["DROP TRIGGER message_finished_delete"]


def upgrade() -> None:
    op.create_table(
        "message_finished_minute",
        sa.Column("minute", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("state", sa.String(32), primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    op.create_table(  # no key: the delete trigger only appends to it (see persistence/counts.py)
        "message_finished_delta",
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    bind = op.get_bind()
    for statement in POSTGRES_UP if bind.dialect.name == "postgresql" else SQLITE_UP:
        op.execute(statement)
    refill_finished(bind)


def downgrade() -> None:
    for statement in POSTGRES_DOWN if op.get_bind().dialect.name == "postgresql" else SQLITE_DOWN:
        op.execute(statement)
    op.drop_table("message_finished_delta")
    op.drop_table("message_finished_minute")
