"""Set-based filling of a migrated store: the tables users actually have (aged, large), in one statement each.

Used by the benchmarks (lifecycle aged mode, the 1M-row admin store) and by the plan tests. Every row is
written by one ``INSERT ... SELECT`` over a series (``generate_series`` on PostgreSQL, a recursive CTE on
SQLite), so 1,000,000 rows take seconds, not minutes.

Rows are deterministic functions of their number ``g`` (1..n), so the benchmarks know which values exist:

* ``correlation_id`` = ``{prefix}-{g}`` (unique), ``source_system`` = ``src{g % 4}``
* ``service`` / ``operation`` = ``svc{g % 5}`` / ``op{g % 4}`` (20 routes)
* ``process_id`` = ``p-{g / 10}`` (10 messages per process), ``object_id`` = ``obj-{g % 100000}``,
  ``entity_type`` = ``customer``
* ``receive_ts`` = ``start`` + ``g`` seconds (1M rows span ~11.6 days; one hour holds 3,600 rows)
* ``state``: as given, or for a mixed fill 97 % OK, 2 % FAILED, 1 % PARTLY_FAILED (by ``g % 100``)
* ``payload`` = ``<order id="{g}"/>``; FAILED and PARTLY_FAILED rows of a mixed fill have ``last_error_code``
  ``HLR_DOWN`` (even ``g``) or ``TIMEOUT`` (odd ``g``) and ``last_error_text`` ``hlr {g} is down`` / ``timeout {g}``
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from openroute.persistence import message_table

START = datetime(2024, 1, 1, tzinfo=UTC)

_COLUMNS = (
    "correlation_id, source_system, process_id, service, operation, object_id, entity_type, funnel_value, "
    "payload, content_type, headers, state, failed_count, receive_ts, msg_ts, start_process_ts, last_update_ts, "
    "next_attempt_at, node_id, custom_data, business_errors, last_error_code, last_error_text, parent_id, version"
)

MIXED = "mixed"


def _state_sql(state: str) -> str:
    if state == MIXED:
        return "CASE WHEN g % 100 = 0 THEN 'PARTLY_FAILED' WHEN g % 100 < 3 THEN 'FAILED' ELSE 'OK' END"
    return f"'{state}'"


def fill(
    connection: sa.Connection, n: int, state: str, prefix: str, first: int = 1, route: tuple[str, str] | None = None
) -> None:
    """Insert ``n`` messages (numbers ``first``..``first + n - 1``) in ``state`` (or :data:`MIXED`).

    NEW rows get no start time, no node and version 0; the others look processed (version 2). ``route``
    (service, operation) replaces the 20 generated routes.
    """
    new = state == "NEW"
    last = first + n - 1
    state_sql = _state_sql(state)
    version = "0" if new else "2"
    if connection.dialect.name == "postgresql":
        ts = "(timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second')"
        json_obj, json_list = "'{}'::jsonb", "'[]'::jsonb"
        series = f"generate_series({first}, {last}) AS g"
        concat = "||"
        head = ""
    else:
        # the text form SQLAlchemy writes (microseconds included), so comparisons with bound values are exact
        ts = "(datetime('2024-01-01 00:00:00', '+' || g || ' seconds') || '.000000')"
        json_obj, json_list = "'{}'", "'[]'"
        series = "series"
        concat = "||"
        head = f"WITH RECURSIVE series(g) AS (SELECT {first} UNION ALL SELECT g + 1 FROM series WHERE g < {last}) "
    service, operation = (f"'{route[0]}'", f"'{route[1]}'") if route else (
        f"'svc' {concat} (g % 5)", f"'op' {concat} (g % 4)")
    started = "NULL" if new else ts
    code = text = "NULL"
    if state == MIXED:
        failing = "g % 100 < 3"
        code = f"CASE WHEN {failing} THEN (CASE WHEN g % 2 = 0 THEN 'HLR_DOWN' ELSE 'TIMEOUT' END) END"
        text = (f"CASE WHEN {failing} THEN (CASE WHEN g % 2 = 0 THEN 'hlr ' {concat} g {concat} ' is down' "
                f"ELSE 'timeout ' {concat} g END) END")
    node = "NULL" if new else "'node-aged'"
    select = (
        f"SELECT '{prefix}-' {concat} g, 'src' {concat} (g % 4), 'p-' {concat} (g / 10), "
        f"{service}, {operation}, 'obj-' {concat} (g % 100000), 'customer', NULL, "
        f"'<order id=\"' {concat} g {concat} '\"/>', 'text/xml', {json_obj}, {state_sql}, 0, {ts}, NULL, "
        f"{started}, {ts}, NULL, {node}, {json_obj}, {json_list}, {code}, {text}, NULL, {version} FROM {series}"
    )
    connection.execute(sa.text(f"{head}INSERT INTO message ({_COLUMNS}) {select}"))
    index_payloads(connection)


def index_payloads(connection: sa.Connection) -> None:
    """PostgreSQL: copy every pending payload into the payload search's index table in one statement, what the
    nodes' indexers do a batch at a time (``openroute.persistence.payload_index``): a filled store looks like a live
    one whose indexers kept up. Nothing to do on SQLite."""
    if connection.dialect.name != "postgresql":
        return
    connection.exec_driver_sql(
        "WITH taken AS (DELETE FROM message_payload_pending RETURNING message_id) "
        "INSERT INTO message_payload_text (message_id, payload) "
        "SELECT m.id, m.payload FROM message m JOIN taken t ON t.message_id = m.id ON CONFLICT DO NOTHING")


def analyze(connection: sa.Connection) -> None:
    """Give the planner statistics (what autovacuum does on any live table)."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("ANALYZE message")
        connection.exec_driver_sql("ANALYZE message_payload_text")
    else:
        connection.exec_driver_sql("ANALYZE")


def age(
    engine: sa.Engine, final: int = 100_000, backlog: int = 0, backlog_route: tuple[str, str] | None = None
) -> None:
    """The aged store: ``final`` OK rows, then ``backlog`` NEW rows (of ``backlog_route``), then ANALYZE."""
    with engine.begin() as connection:
        if final:
            fill(connection, final, "OK", "aged")
        if backlog:
            fill(connection, backlog, "NEW", "backlog", first=final + 1, route=backlog_route)
    with engine.begin() as connection:
        analyze(connection)


#: marks a store that :func:`wear` has aged (a table comment, so a reused bench database is known to be aged)
WORN = "openroute bench: worn v2"


def wear(engine: sa.Engine, rows: int) -> None:
    """Age a PostgreSQL :data:`MIXED` fill of ``rows`` messages (ids 1..rows) the way production ages a table.

    In place (the row count stays ``rows``), keeping every value the module docstring promises:

    1. one message in three is written again (a confirmation, a restart that ended as before: version and
       ``last_update_ts`` change, both indexed, so the updates are not HOT and the new row versions land away
       from their receive-time neighbours); then VACUUM ANALYZE, as autovacuum does once 20 % of a table is dead;
    2. a realistic mix: 0.1 % CANCEL and 0.1 % SKIPPED; every seventh failed message has one of 12 rarer error
       codes (``E01``..``E12``, text ``e{code} at {g}``); the newest messages are a backlog (1,000 NEW, 300
       PROCESSING, 300 POSTPONED, 100 WAITING_FOR_CHILDREN: non-failed rows of the last ~2,000 seconds);
    3. the newest 5 % of the messages and one old message in 1,000 (restarts) are written again and left dead
       (below autovacuum's vacuum threshold), and the table is ANALYZEd (autovacuum's analyze threshold is
       10 %): the newest pages are not all-visible, as between two autovacuum runs of a live store.
    """
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE message SET version = version + 1, last_update_ts = last_update_ts + interval '1 second' "
            "WHERE mod(id, 3) = 0")
    with autocommit.connect() as connection:
        connection.exec_driver_sql("VACUUM ANALYZE message")
    newest = rows - 2000
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE message SET state = 'CANCEL' WHERE mod(id, 1000) = 5")
        connection.exec_driver_sql("UPDATE message SET state = 'SKIPPED' WHERE mod(id, 1000) = 7")
        connection.exec_driver_sql(
            "UPDATE message SET last_error_code = 'E' || lpad((1 + mod(id, 12))::text, 2, '0'), "
            "last_error_text = 'e' || lpad((1 + mod(id, 12))::text, 2, '0') || ' at ' || id "
            "WHERE mod(id, 100) IN (1, 2) AND mod(id, 7) = 0")
        backlog = (("NEW", 0, 1000), ("PROCESSING", 1000, 1300), ("POSTPONED", 1300, 1600),
                   ("WAITING_FOR_CHILDREN", 1600, 1700))
        for state, low, high in backlog:
            extra = ", start_process_ts = NULL, node_id = NULL, version = 0" if state == "NEW" else ""
            connection.exec_driver_sql(
                f"UPDATE message SET state = '{state}'{extra} "
                f"WHERE id > {newest + low} AND id <= {newest + high} AND mod(id, 100) >= 3")
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE message SET version = version + 1, last_update_ts = last_update_ts + interval '1 second' "
            f"WHERE id > {rows - rows // 20} OR mod(id, 1000) = 11")
        connection.exec_driver_sql(f"COMMENT ON TABLE message IS '{WORN}'")
    with autocommit.connect() as connection:
        connection.exec_driver_sql("ANALYZE message")


def worn(connection: sa.Connection) -> bool:
    """Whether :func:`wear` aged this (PostgreSQL) store."""
    comment = connection.exec_driver_sql("SELECT obj_description('message'::regclass, 'pg_class')").scalar_one()
    return bool(comment == WORN)


#: how much of a store's newest traffic :func:`bring_up_to_date` moves to the present: the console's widest
#: window (the failing routes of the last 24 h)
RECENT = timedelta(days=1)
#: a store whose newest change is younger than this is left as it is (moving it rewrites a day of rows); an hour
#: left a later run's "last hour" with a fraction of its traffic (327 finished messages 45 minutes on, not 1,850)
UP_TO_DATE = timedelta(minutes=10)


def final_transitions(connection: sa.Connection, since: datetime) -> int:
    """Write the transition that ended each final message changed after ``since`` (PROCESSING to its state, at its
    change time), as live traffic leaves them: the store's counts of what finished per minute are folded from them
    (a fill writes messages only). Recount the store's counts after it (``store.counts.recount()``): they do not
    see raw SQL. Returns the transitions written."""
    statement = sa.text(
        "INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, cause) "
        "SELECT id, 'PROCESSING', state, last_update_ts, 'bench', 1, 'engine' FROM message "
        "WHERE last_update_ts > :since AND state IN ('OK', 'FAILED', 'SKIPPED', 'CANCEL')"
    ).bindparams(sa.bindparam("since", type_=message_table.c.last_update_ts.type))
    written = connection.execute(statement, {"since": since})
    return int(written.rowcount)


def bring_up_to_date(engine: sa.Engine, now: datetime) -> int:
    """Move the newest day of a PostgreSQL fill (its receive, start and change times) so that it ends at ``now``.

    A fill's times are fixed (from :data:`START`), so on a later day the console's windows (what finished in the
    last hour, the routes failing in the last 24 h) would be empty and cost nothing, unlike a live store's. The
    same rows (those changed within :data:`RECENT` of the newest change) move each time; their old versions are
    left dead until autovacuum, as a day of live traffic leaves them, and the table is ANALYZEd. Each moved message
    that is final gets the transition that ended it (at its change time); the caller recounts the store's counts
    (``store.counts.recount()``), which folds them. Returns the rows moved (0 when the newest change is less than
    :data:`UP_TO_DATE` old: the last hour then still holds five sixths of its traffic, the day nearly all of it)."""
    with engine.begin() as connection:
        newest = connection.execute(sa.text("SELECT max(last_update_ts) FROM message")).scalar_one()
        shift = now - newest
        if shift < UP_TO_DATE:
            return 0
        moved = connection.execute(
            sa.text("UPDATE message SET receive_ts = receive_ts + :shift, last_update_ts = last_update_ts + :shift, "
                    "start_process_ts = start_process_ts + :shift WHERE last_update_ts > :since"),
            {"shift": shift, "since": newest - RECENT},
        ).rowcount
        final_transitions(connection, now - RECENT)
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as connection:
        # as autovacuum would soon: unanalyzed, the day's new transitions made the counts' read of the transitions
        # after the mark (a primary-key range, empty) a sequential scan of them (8.8 ms at 84,000)
        connection.exec_driver_sql("ANALYZE message, message_transition")
    return int(moved)
