"""The cost of the message-count delete triggers (migrations 0014 and 0017) in a bulk delete, on PostgreSQL.

Fills an empty database with 20,000 messages of 10 routes (each with its NEW transition; a quarter moved to OK
before the counts' recount, so their finished minute is kept, and a quarter after the mark), then runs ``EXPLAIN
(ANALYZE)`` of a ``DELETE`` of 10,000 of them three times, each rolled back, and prints the ``Trigger
message_count_delete`` and ``message_finished_delete`` lines with the time per deleted row (and the foreign-key
cascade's trigger beside them, a reference for the machine's load)::

    psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE openroute_counts_bench'
    python benchmarks/counts_delete_bench.py postgresql+psycopg://postgres@127.0.0.1:5432/openroute_counts_bench
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime

from openroute.persistence import MessageStore, NewMessage, message_table
from openroute.persistence.counts import recount, refill_finished

_COPY = {"correlation_id": "correlation_id || '-' || g", "service": "'s' || mod(g, 5)", "operation": "'o' || mod(g, 2)"}


def main(url: str) -> None:
    store = MessageStore(url)
    store.create_schema()
    template = NewMessage(
        service="s",
        operation="o",
        payload="{}",
        content_type="application/json",
        correlation_id="template",
        source_system="crm",
        receive_ts=datetime.now(UTC),
    )
    store.insert_message(template)
    columns = [c.name for c in message_table.c if c.name != "id"]
    values = ", ".join(_COPY.get(name, name) for name in columns)
    transition = "INSERT INTO message_transition (message_id, from_state, to_state, at, attempt, cause) "
    with store.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO message ({', '.join(columns)}) SELECT {values} FROM message, generate_series(1, 20000) g"
        )
        conn.exec_driver_sql("DELETE FROM message_transition")
        conn.exec_driver_sql(transition + "SELECT id, NULL, 'NEW', receive_ts, 1, 'engine' FROM message")
        # a quarter ended OK before the mark (their finished minute is kept: the 0017 trigger takes them out)
        conn.exec_driver_sql(
            transition + "SELECT id, 'NEW', 'OK', receive_ts, 1, 'engine' FROM message WHERE mod(id, 4) = 0"
        )
        conn.exec_driver_sql("UPDATE message SET state = 'OK' WHERE mod(id, 4) = 0")
        recount(conn)
        refill_finished(conn)
        conn.exec_driver_sql(  # and a quarter after it
            transition + "SELECT id, 'NEW', 'OK', receive_ts, 1, 'engine' FROM message WHERE mod(id, 4) = 2"
        )
        conn.exec_driver_sql("UPDATE message SET state = 'OK' WHERE mod(id, 4) = 2")
        conn.exec_driver_sql("ANALYZE message; ANALYZE message_transition")
    for _ in range(3):
        with store.engine.connect() as conn, conn.begin() as transaction:
            plan = [
                row[0]
                for row in conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, BUFFERS) DELETE FROM message"
                    " WHERE id IN (SELECT id FROM message ORDER BY id LIMIT 10000)"
                )
            ]
            transaction.rollback()
        for line in plan:
            found = re.search(r"time=([\d.]+) calls=(\d+)", line)
            if found and ("message_count" in line or "message_transition" in line or "message_finished" in line):
                print(f"{line}  ({1000 * float(found[1]) / int(found[2]):.1f} us per row)")
            elif "Execution Time" in line:
                print(line)
    store.dispose()


if __name__ == "__main__":
    main(sys.argv[1])
