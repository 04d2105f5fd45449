"""Route benchmark: a real route through ``openroute run``, against a floor doing the same SQL and HTTP calls.

    python benchmarks/route_bench.py [--count 2000] [--senders 64] [--repeat 3] [--databases sqlite,postgres]
                                     [--records off,on] [--warm-up 200] [--paced 0.8] [--paced-count 1000]
                                     [--profile FILE]

The route is ``bench/plain`` of ``benchmarks/badday_routes.py``, as users write one: a JSON message, one ``ext_call``
to the external system REMOTE through the shipped ``ExternalHttpClient`` (declared in ``[external_systems.REMOTE]``,
breaker on, the STARTED record of the call's idempotency committed before the call, call records off or on), and an
HTTP JSON confirmation to the source system BENCH (``[confirmations.systems.BENCH] http = ...``). Every run has its
own processes and a fresh database: the remote system (``badday_bench.py remote``: 5 ms per call, the idempotency key
honoured), the confirmation receiver (this script, ``receiver`` mode: the confirmation id honoured) and the server,
one of:

* ``node``: ``openroute run`` (default settings, one node) on the database;
* ``floor``: this script in ``floor`` mode, one asyncio process with the same HTTP server stack (Starlette on
  uvicorn) doing the node's SQL statements and HTTP calls with nothing around them: accept (the ``message`` INSERT
  and its NEW transition row, answered after the commit), claim (the store's claim UPDATE and the PROCESSING row;
  with room in the bound, as the node, the INSERT stores the message claimed with both rows and no claim follows),
  the call's STARTED record (``external_call`` INSERT ... ON CONFLICT DO NOTHING), the call with httpx (the node's
  network transport, the same body and ``Idempotency-Key``), its outcome (``external_call`` UPDATE; with records the
  ``call_record`` INSERT), the final state (``message`` UPDATE, the OK row, the ``confirmation`` INSERT), then the
  confirmation's claim (``confirmation`` UPDATE ... RETURNING and the message rows), its HTTP POST (on the network
  transport too) and its record (``confirmation`` UPDATE to SENT); the breaker's row read at most once a second, as a
  node whose calls succeed reads it; the node's payload indexer and its fold of the message counts (every 2 s) run
  beside. Every write goes through one group-commit writer (the engine's own ``GroupCommitWriter``: one thread, the
  operations queued meanwhile in one transaction, each kind as one statement or one executemany), with the node's
  concurrency: 64 messages in their route, 320 between the claim and the confirmation's record.

The load generator (this process) is a raw asyncio HTTP/1.1 client: ``--senders`` keep-alive connections, each
sending its next request once the previous one was answered (closed loop), ``--count`` requests after a warm-up.
Messages per second run from the first request to the last confirmation recorded SENT (``sent_at``); the accept
latency is the request's round trip: at full load (every sender waiting on its answer) it is about ``--senders``
over the accept rate on either side (Little's law), so a second load measures what a sender feels at a load the
server keeps up with: once the run's work is confirmed, ``--paced-count`` more messages at ``--paced`` times the run's
own rate on a fixed schedule (open loop: each request at its time on an idle keep-alive connection, its latency from
that time, so a slow answer hides no wait), each through the whole route. Runs are interleaved (one repetition
runs node and floor, records off and on, in an order rotated from one repetition to the next) and the script prints
each run, then min / median / max of node / floor per database and variant. Each run also gives the CPU per message
of every process: the server (and its main thread), the remote, the receiver, the load generator and, on PostgreSQL,
the database's processes.

``--profile FILE`` instead runs the node (or with ``--profile-server floor`` the floor) once, on the first database
and variant given, under ``py-spy record --gil -f raw`` (started after the warm-up, stopped at the last
confirmation) and writes the folded stacks to FILE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from benchmarks._common import arguments, free_port, fresh_database, spread  # noqa: E402
from benchmarks.badday_bench import Process, wait_http  # noqa: E402
from benchmarks.http_bench import (  # noqa: E402
    closed_loop,
    local_postgres_cpu_seconds,
    main_thread_cpu_seconds,
    open_loop,
    process_cpu_seconds,
)

#: the engine's defaults (EngineSettings): messages in their route at once, and queued beyond them until their
#: confirmation is recorded
CONCURRENCY, QUEUE_SIZE = 64, 256
CALL_KEY, SYSTEM, SOURCE = "update", "REMOTE", "BENCH"
CONFIG = """\
database_url = "{database}"
routes = "benchmarks.badday_routes:application"

[external_systems.REMOTE]
base_url = "http://127.0.0.1:{remote_port}"
call_timeout = "10s"
timeout = "5s"

[external_systems.REMOTE.breaker]
enabled = true

[external_systems.REMOTE.records]
enabled = {records}

[confirmations.systems.BENCH]
http = "http://127.0.0.1:{receiver_port}/confirm"
"""


# -- the confirmation receiver (its own process) ----------------------------------------------------------------
def serve_receiver(port: int) -> None:
    """The source system's confirmation endpoint: ``POST /confirm`` answers 200 (a repeated confirmation id is
    counted once); ``GET /count`` says how many distinct confirmations arrived."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: set[str] = set()

    async def confirm(request: Request) -> JSONResponse:
        body = await request.json()
        seen.add(request.headers.get("idempotency-key") or str(body.get("confirmationId")))
        return JSONResponse({"received": True})

    async def count(_request: Request) -> JSONResponse:
        return JSONResponse({"count": len(seen)})

    routes = [Route("/confirm", confirm, methods=["POST"]), Route("/count", count, methods=["GET"])]
    uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the floor (its own process) --------------------------------------------------------------------------------
class FloorStatements:
    """The node's statements as SQL text for the DB-API cursor, one method per kind of group-commit operation; each
    takes the writer's connection and the group's items and returns one result per item."""

    def __init__(self, postgres: bool, node_id: str, records: bool) -> None:
        from openroute.persistence._hot_path import INSERT_COLUMNS, POSTGRES_CLAIM

        self.postgres, self.node_id, self.records = postgres, node_id, records
        mark = self.mark = "%s" if postgres else "?"
        self.columns = INSERT_COLUMNS
        self.insert_row = "(" + ", ".join(mark for _ in INSERT_COLUMNS) + ")"
        self.insert_one = (f"INSERT INTO message ({', '.join(INSERT_COLUMNS)}) VALUES {self.insert_row} "
                           "ON CONFLICT (source_system, correlation_id) DO NOTHING RETURNING id")
        self.postgres_claim = POSTGRES_CLAIM
        self.transition = (
            "INSERT INTO message_transition (message_id, from_state, to_state, at, node_id, attempt, error_code, "
            f"error_text, error_trace, cause) VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, "
            f"(SELECT failed_count + {mark} FROM message WHERE id = {mark}), NULL, NULL, NULL, {mark})")
        self.call_row = f"({', '.join([mark] * 10)})"
        self.end_sql = (f"UPDATE external_call SET status = {mark}, result = {mark}, last_error = {mark}, "
                         f"updated_at = {mark} WHERE external_call.message_id = {mark} AND external_call.call_key = "
                         f"{mark} AND external_call.status = {mark}")
        self.call_record = ("INSERT INTO call_record (message_id, system, call_key, started_at, duration_ms, outcome, "
                            f"request, response, error) VALUES ({', '.join([mark] * 9)}) RETURNING call_record.id")
        # the store writes only the columns an outcome changes: for a first attempt's OK, none but these
        self.outcome = (f"UPDATE message SET state = {mark}, version = {mark}, last_update_ts = {mark} "
                        f"WHERE id = {mark} AND version = {mark}")
        self.pending = ("INSERT INTO confirmation (message_id, source_system, outcome_state, status, attempts, "
                        "next_attempt_at, created_at, updated_at, confirmation_id) VALUES "
                        f"({', '.join([mark] * 9)}) ON CONFLICT (message_id) DO NOTHING RETURNING confirmation.id")
        self.sent = (f"UPDATE confirmation SET status = {mark}, next_attempt_at = {mark}, updated_at = {mark}, "
                     f"sent_at = {mark} WHERE confirmation.id = {mark} AND confirmation.status = {mark} AND "
                     f"confirmation.attempts = {mark}")

    def at(self, value: datetime) -> Any:
        """A timestamp as the store writes it: aware on PostgreSQL, naive UTC text on SQLite."""
        return value if self.postgres else value.astimezone(UTC).isoformat(" ", "microseconds")[:-6]

    def marks(self, count: int) -> str:
        return ", ".join([self.mark] * count)

    @staticmethod
    def _cursor(connection: sa.Connection) -> Any:
        return connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]

    def _transitions(self, cursor: Any, ids: Sequence[int], before: str | None, after: str, at: Any) -> None:
        cursor.executemany(self.transition, [(i, before, after, at, self.node_id, 1, i, "engine") for i in ids])

    def insert(self, connection: sa.Connection, items: list[tuple[str, str, datetime]],
               claimed: bool = False) -> list[int]:
        """Accept: the ``message`` rows (payload, correlation id, received at) and their NEW transition rows;
        ``claimed``: stored claimed for the node as well (PROCESSING, the claim's columns, the PROCESSING rows), as
        the node stores a message whose accept found room in its queue."""
        cursor = self._cursor(connection)
        rows = []
        claimed_at = self.at(datetime.now(UTC)) if claimed else None
        for payload, correlation_id, now in items:
            at = self.at(now)
            if claimed:
                rows.append([correlation_id, SOURCE, None, "bench", "plain", None, None, None, payload,
                             "application/json", '{"endpoint": "json"}', "PROCESSING", 0, at, None, claimed_at,
                             claimed_at, None, self.node_id, "{}", "[]", None, None, None, 1, None])
                continue
            rows.append([correlation_id, SOURCE, None, "bench", "plain", None, None, None, payload,
                         "application/json", '{"endpoint": "json"}', "NEW", 0, at, None, None, at, None, None, "{}",
                         "[]", None, None, None, 0, None])
        ids: list[int] = []
        if self.postgres:  # the store's: one text for any group, executemany pipelined with each row's id
            cursor.executemany(self.insert_one, rows, returning=True)
            while True:
                ids.append(int(cursor.fetchone()[0]))
                if not cursor.nextset():
                    break
        else:  # the store's: multi-row INSERTs in chunks of powers of two (their texts repeat, compiled once)
            first = 0
            while first < len(rows):
                size = 1 << ((len(rows) - first).bit_length() - 1)
                chunk = rows[first:first + size]
                cursor.execute(f"INSERT INTO message ({', '.join(self.columns)}) VALUES "
                               f"{', '.join([self.insert_row] * size)} ON CONFLICT (source_system, correlation_id) "
                               "DO NOTHING RETURNING id, correlation_id", [v for row in chunk for v in row])
                made = dict((cid, i) for i, cid in cursor.fetchall())
                ids.extend(made[row[0]] for row in chunk)
                first += size
        self._transitions(cursor, ids, None, "NEW", self.at(items[0][2]))
        if claimed_at is not None:
            self._transitions(cursor, ids, "NEW", "PROCESSING", claimed_at)
        cursor.close()
        return ids

    def insert_claimed(self, connection: sa.Connection, items: list[tuple[str, str, datetime]]) -> list[int]:
        """:meth:`insert` claimed for the node."""
        return self.insert(connection, items, claimed=True)

    def claim(self, connection: sa.Connection, ids: list[int]) -> list[bool]:
        """NEW -> PROCESSING by id and version (the store's claim) and the PROCESSING transition rows."""
        cursor = self._cursor(connection)
        at = self.at(datetime.now(UTC))
        if self.postgres:
            cursor.execute(self.postgres_claim, ["PROCESSING", self.node_id, at, at, ids, [0] * len(ids)])
        else:
            cursor.execute("UPDATE message SET state = ?, version = version + 1, node_id = ?, start_process_ts = ?, "
                           f"last_update_ts = ? WHERE id IN ({self.marks(len(ids))}) AND (id, version) IN "
                           f"({', '.join(['(?, ?)'] * len(ids))}) RETURNING id",
                           ["PROCESSING", self.node_id, at, at, *ids, *[v for i in ids for v in (i, 0)]])
        won = {row[0] for row in cursor.fetchall()}
        self._transitions(cursor, [i for i in ids if i in won], "NEW", "PROCESSING", at)
        cursor.close()
        return [i in won for i in ids]

    def call_start(self, connection: sa.Connection, items: list[tuple[int, str]]) -> list[bool]:
        """The STARTED records of a group's calls (message id, idempotency key): one multi-row INSERT."""
        cursor = self._cursor(connection)
        at = self.at(datetime.now(UTC))
        values = [v for message_id, key in items
                  for v in (message_id, CALL_KEY, "STARTED", key, self.node_id, at, 1, 0, at, at)]
        cursor.execute("INSERT INTO external_call (message_id, call_key, status, idempotency_key, node_id, started_at, "
                       "attempts, refused, created_at, updated_at) VALUES "
                       f"{', '.join([self.call_row] * len(items))} ON CONFLICT (message_id, call_key) DO NOTHING "
                       "RETURNING external_call.message_id, external_call.call_key", values)
        started = {row[0] for row in cursor.fetchall()}
        cursor.close()
        return [message_id in started for message_id, _key in items]

    def call_end(self, connection: sa.Connection, items: list[tuple[int, str, datetime, int, str, str]]) -> list[None]:
        """The calls' outcomes (message id, result JSON, started at, ms, request, response): one executemany; with
        records on, the ``call_record`` rows too."""
        cursor = self._cursor(connection)
        at = self.at(datetime.now(UTC))
        cursor.executemany(self.end_sql, [("OK", result, None, at, message_id, CALL_KEY, "STARTED")
                                           for message_id, result, *_rest in items])
        if self.records:
            for message_id, _result, started, millis, request, response in items:
                cursor.execute(self.call_record, (message_id, SYSTEM, CALL_KEY, self.at(started), millis, "OK",
                                                  request, response, None))
                cursor.fetchall()
        cursor.close()
        return [None] * len(items)

    def finish(self, connection: sa.Connection, ids: list[int]) -> list[None]:
        """PROCESSING -> OK by id and version, the OK transition rows and the PENDING confirmation rows."""
        cursor = self._cursor(connection)
        now = datetime.now(UTC)
        at = self.at(now)
        cursor.executemany(self.outcome, [("OK", 2, at, i, 1) for i in ids])
        self._transitions(cursor, ids, "PROCESSING", "OK", at)
        for i in ids:  # the final-state hook: one INSERT per message, as the node's
            cursor.execute(self.pending, (i, SOURCE, "OK", "PENDING", 0, at, at, at, str(uuid.uuid4())))
            cursor.fetchall()
        cursor.close()
        return [None] * len(ids)

    def confirmation_claim(self, connection: sa.Connection, ids: list[int]) -> list[tuple[int, int, dict[str, Any]]]:
        """Claim the group's due confirmations (one UPDATE ... RETURNING) and read their messages: per message its
        (confirmation row id, attempt, the JSON to send)."""
        cursor = self._cursor(connection)
        now = datetime.now(UTC)
        at, lease = self.at(now), self.at(now + timedelta(seconds=15))
        cursor.execute(
            f"UPDATE confirmation SET attempts = (confirmation.attempts + {self.mark}), next_attempt_at = {self.mark}, "
            f"updated_at = {self.mark}, claimed_by = {self.mark} WHERE confirmation.message_id IN "
            f"({self.marks(len(ids))}) AND confirmation.status = {self.mark} AND confirmation.next_attempt_at <= "
            f"{self.mark} RETURNING confirmation.id, confirmation.message_id, confirmation.outcome_state, "
            "confirmation.attempts, confirmation.next_attempt_at, confirmation.confirmation_id",
            [1, lease, at, self.node_id, *ids, "PENDING", at])
        claimed = {row[1]: row for row in cursor.fetchall()}
        # the whole message rows, as the node reads them (``confirmations.messages``)
        cursor.execute(f"SELECT * FROM message WHERE id IN ({self.marks(len(ids))})", ids)
        names = [column[0] for column in cursor.description]
        messages = {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
        cursor.close()
        results = []
        for i in ids:
            row, message = claimed[i], messages[i]
            finished = _as_utc(message["last_update_ts"])
            results.append((row[0], row[3], {
                "correlationId": message["correlation_id"], "messageId": i, "sourceSystem": message["source_system"],
                "processId": message["process_id"], "service": message["service"],
                "operation": message["operation"], "state": row[2], "finishedAt": finished.isoformat(),
                "businessErrors": [], "errorCode": message["last_error_code"],
                "errorText": message["last_error_text"], "confirmationId": row[5]}))
        return results

    def confirmation_sent(self, connection: sa.Connection, items: list[tuple[int, int]]) -> list[None]:
        """The sent confirmations (row id, attempt): SENT, one executemany."""
        cursor = self._cursor(connection)
        at = self.at(datetime.now(UTC))
        cursor.executemany(self.sent, [("SENT", None, at, at, row_id, "PENDING", attempt) for row_id, attempt in items])
        cursor.close()
        return [None] * len(items)


class Floor:
    """The floor's server: the node's work for each message (see the module docstring) and nothing else."""

    def __init__(self, url: str, remote_port: int, receiver_port: int, records: bool) -> None:
        import httpx
        from openroute.persistence import MessageStore

        from openroute.engine._writer import GroupCommitWriter, Grouped
        from openroute.outbound import network_transport

        self.store = MessageStore(url)  # the store's own engine: the same pragmas, pool and durability
        self.sql = sql = FloorStatements(self.store.dialect == "postgresql", "floor", records)
        self.records = records
        self.writer = GroupCommitWriter(self.store.engine)
        self.groups = {name: Grouped(run, name, urgent=name.startswith("insert")) for name, run in (
            ("insert", sql.insert), ("insert claimed", sql.insert_claimed), ("claim", sql.claim),
            ("call start", sql.call_start), ("call end", sql.call_end),
            ("finish", sql.finish), ("confirmation claim", sql.confirmation_claim),
            ("confirmation sent", sql.confirmation_sent))}
        self.queue: asyncio.Queue[tuple[int, str, bool]] = asyncio.Queue()
        self.room = asyncio.Semaphore(CONCURRENCY + QUEUE_SIZE)
        self.remote_url = f"http://127.0.0.1:{remote_port}/call"
        self.receiver_url = f"http://127.0.0.1:{receiver_port}/confirm"
        # the node's clients: ExternalHttpClient's and the confirmation's, both httpx on openroute's network transport
        self.remote = httpx.AsyncClient(transport=network_transport())
        self.receiver = httpx.AsyncClient(timeout=10, transport=network_transport())
        self.timeout = httpx.Timeout(5.0)
        self.breaker_read_at = float("-inf")
        self.tasks: set[asyncio.Future[Any]] = set()

    def submit(self, group: str, item: Any) -> asyncio.Future[Any]:
        return self.writer.enqueue_grouped(self.groups[group], item)

    def read_breaker(self) -> None:
        """The breaker's row, stored CLOSED first when it has none (``BreakerStore.load``)."""
        with self.store.engine.begin() as connection:
            cursor = FloorStatements._cursor(connection)
            mark = self.sql.mark
            select = ("SELECT system, state, changed_at, open_until, trials, trial_successes, forced, reason, version "
                      f"FROM circuit_breaker WHERE system = {mark}")
            cursor.execute(select, [SYSTEM])
            if cursor.fetchone() is None:
                cursor.execute("INSERT INTO circuit_breaker (system, state, changed_at, open_until, trials, "
                               f"trial_successes, forced, reason, version) VALUES ({self.sql.marks(9)})",
                               [SYSTEM, "CLOSED", self.sql.at(datetime.now(UTC)), None, "[]", 0, False, None, 0])
            cursor.close()

    async def accept(self, payload: str, correlation_id: str) -> int:
        """The node's accept: with room in the bound the message is stored claimed (its room taken now, its worker
        makes no claim), else stored NEW for a worker's claim once room frees."""
        claimed = not self.room.locked()
        if claimed:
            await self.room.acquire()  # free: returns at once
        try:
            message_id: int = await self.submit("insert claimed" if claimed else "insert",
                                                (payload, correlation_id, datetime.now(UTC)))
        except BaseException:
            if claimed:
                self.room.release()
            raise
        self.queue.put_nowait((message_id, correlation_id, claimed))
        return message_id

    async def work(self) -> None:
        """One of the node's 64 workers: claim, call, outcome; the confirmation goes on in the background. A failure
        ends the floor's process (its traceback in the run's log)."""
        try:
            await self._work()
        except asyncio.CancelledError:
            raise
        except BaseException:
            traceback.print_exc()
            os._exit(3)  # the run stops at once, and says why

    async def _work(self) -> None:
        while True:
            message_id, correlation_id, claimed = await self.queue.get()
            if not claimed:
                await self.room.acquire()
            try:
                if not claimed and not await self.submit("claim", message_id):
                    # its row was locked for a moment (SKIP LOCKED: the payload indexer's insert holds a key-share
                    # lock on it): taken again later, as the node's feeder takes a lost claim from the store
                    self.room.release()
                    self.queue.put_nowait((message_id, correlation_id, False))
                    await asyncio.sleep(0.01)
                    continue
                await self.call(message_id, correlation_id)
                finished = self.submit("finish", message_id)
            except BaseException:
                self.room.release()
                raise
            task = asyncio.ensure_future(self.confirm(message_id, finished))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def call(self, message_id: int, correlation_id: str) -> None:
        key = f"{correlation_id}:{CALL_KEY}"
        if not await self.submit("call start", (message_id, key)):
            raise RuntimeError(f"floor: call of message {message_id} already recorded")
        if time.monotonic() - self.breaker_read_at >= 1.0:  # the node reads the breaker's row behind its calls
            self.breaker_read_at = time.monotonic()
            read = asyncio.ensure_future(asyncio.to_thread(self.read_breaker))
            self.tasks.add(read)
            read.add_done_callback(self.tasks.discard)
        started, clock = datetime.now(UTC), time.perf_counter()
        body = json.dumps({"correlationId": correlation_id}, ensure_ascii=False).encode()
        response = await self.remote.request("POST", self.remote_url, content=body, timeout=self.timeout,
                                             headers={"Idempotency-Key": key, "Content-Type": "application/json"})
        if response.status_code >= 400:
            raise RuntimeError(f"floor: the remote answered {response.status_code}")
        result = response.json()
        millis = int((time.perf_counter() - clock) * 1000)
        request = response_text = None
        if self.records:
            request = f"POST {self.remote_url}\n{body.decode()}"
            response_text = f"HTTP {response.status_code}\n{response.content.decode()}"
        await self.submit("call end", (message_id, json.dumps(result), started, millis, request, response_text))

    async def confirm(self, message_id: int, finished: asyncio.Future[Any]) -> None:
        try:
            await self._confirm(message_id, finished)
        except BaseException:
            traceback.print_exc()
            os._exit(3)

    async def _confirm(self, message_id: int, finished: asyncio.Future[Any]) -> None:
        try:
            await finished
            row_id, attempt, document = await self.submit("confirmation claim", message_id)
            response = await self.receiver.post(self.receiver_url, json=document, headers={
                "Idempotency-Key": document["confirmationId"], "X-Confirmation-Id": document["confirmationId"]})
            if not response.is_success:
                raise RuntimeError(f"floor: the receiver answered {response.status_code}")
            await self.submit("confirmation sent", (row_id, attempt))
        finally:
            self.room.release()


def floor_app(url: str, remote_port: int, receiver_port: int, records: bool) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    floor = Floor(url, remote_port, receiver_port, records)

    async def plain(request: Request) -> Response:
        body = await request.body()
        text = body.decode()
        if not isinstance(json.loads(text), dict):  # the node's check of a JSON route: an object
            return JSONResponse({"error": "VALIDATION_ERROR"}, 400)
        correlation_id = request.headers.get("x-correlation-id") or uuid.uuid4().hex
        message_id = await floor.accept(text, correlation_id)
        return JSONResponse({"messageId": message_id, "correlationId": correlation_id, "status": "ACCEPTED",
                             "state": "NEW"}, 202)

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        from openroute.jobs.counts import MessageCounts
        from openroute.jobs.payload_indexer import PayloadIndexer

        await asyncio.to_thread(floor.read_breaker)
        workers = [asyncio.ensure_future(floor.work()) for _ in range(CONCURRENCY)]
        # the payload search's index, written behind the commit by the node's indexer, and the message counts folded
        # every 2 s by the node's loop: the same database work
        stop = asyncio.Event()
        jobs = [asyncio.create_task(PayloadIndexer(floor.store).run(stop)),
                asyncio.create_task(MessageCounts(floor.store).run(stop))]
        from openroute.runtime import collector

        collector.tune_for_serving()  # as `openroute run` does once it serves
        yield
        stop.set()
        await asyncio.gather(*jobs)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await floor.remote.aclose()
        await floor.receiver.aclose()
        await asyncio.get_running_loop().run_in_executor(None, floor.writer.close)
        floor.store.dispose()

    return Starlette(routes=[Route("/api/bench/plain", plain, methods=["POST"]), Route("/health", health)],
                     lifespan=lifespan)


def serve_floor(url: str, port: int, remote_port: int, receiver_port: int, records: bool) -> None:
    import uvicorn

    uvicorn.run(floor_app(url, remote_port, receiver_port, records), host="127.0.0.1", port=port,
                log_level="warning", access_log=False)


# -- the load generator -----------------------------------------------------------------------------------------
def requests_for(run_id: str, count: int) -> list[bytes]:
    """The raw HTTP/1.1 requests of one load, built before the clock starts."""
    built = []
    for n in range(count):
        body = json.dumps({"object": f"o-{n}", "n": n}).encode()
        built.append((f"POST /api/bench/plain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"X-Correlation-Id: {run_id}-{n}\r\nX-Source-System: {SOURCE}\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    return built


async def confirmed(port: int) -> int:
    import httpx

    async with httpx.AsyncClient(timeout=5) as client:
        return int((await client.get(f"http://127.0.0.1:{port}/count")).json()["count"])


def wait_confirmed(port: int, total: int, timeout: float, processes: Sequence[Process]) -> None:
    """Poll the receiver until ``total`` confirmations arrived; RuntimeError after ``timeout`` or when a process
    died."""
    deadline = time.monotonic() + timeout
    while True:
        got = asyncio.run(confirmed(port))
        if got >= total:
            return
        for process in processes:
            if process.process.poll() is not None:
                raise RuntimeError(f"{process.log.name} exited with {process.process.returncode} ({got} of {total} "
                                   "confirmed)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {got} of {total} confirmations within {timeout:.0f} s")
        time.sleep(0.05)


def _as_utc(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def store_figures(url: str, total: int, records: bool, timeout: float = 30) -> datetime:
    """Check the store holds the run's whole work (every message OK with its call OK, its confirmation SENT and, with
    records, its call record) and return the last ``sent_at``."""
    engine = sa.create_engine(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as connection:
                sent = connection.execute(sa.text(
                    "SELECT count(*) FROM confirmation WHERE status = 'SENT'")).scalar_one()
                if sent >= total:
                    ok = connection.execute(sa.text("SELECT count(*) FROM message WHERE state = 'OK'")).scalar_one()
                    calls = connection.execute(sa.text(
                        "SELECT count(*) FROM external_call WHERE status = 'OK'")).scalar_one()
                    recorded = connection.execute(sa.text("SELECT count(*) FROM call_record")).scalar_one()
                    last = connection.execute(sa.text("SELECT max(sent_at) FROM confirmation")).scalar_one()
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{sent} of {total} confirmations recorded SENT within {timeout:.0f} s")
            time.sleep(0.05)
    finally:
        engine.dispose()
    if (ok, calls, recorded) != (total, total, total if records else 0):
        raise RuntimeError(f"the run is wrong: {ok} OK messages, {calls} OK calls, {recorded} call records of {total}")
    return _as_utc(last)


def show_logs(processes: Sequence[Process]) -> None:
    """The end of each process's log, before its folder goes."""
    for process in processes:
        lines = process.log.read_text(errors="replace").splitlines()[-25:]
        print(f"--- {process.log.name}:", *lines, sep="\n  ", file=sys.stderr)


class PortTaken(RuntimeError):
    """A process of a run could not start (its port was taken between ``free_port`` and its bind)."""


def run_once_more(kind: str, database: str, records: bool, args: Any) -> dict[str, float]:
    """:func:`run` in a temporary folder, tried a second time when a process could not take its port."""
    for attempt in (1, 2):
        with tempfile.TemporaryDirectory(prefix="route-bench-") as folder:
            try:
                return run(kind, database, records, args, Path(folder))
            except PortTaken:
                if attempt == 2:
                    raise
    raise AssertionError("unreachable")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(kind: str, database: str, records: bool, args: Any, folder: Path,
        profile: Path | None = None) -> dict[str, float]:
    """One run of ``kind`` (node or floor) on a fresh database of kind ``database``: its figures."""
    remote_port, receiver_port, port = free_port(), free_port(), free_port()
    processes: list[Process] = []
    spy: subprocess.Popen[bytes] | None = None
    with fresh_database(database, "route_bench", folder) as url:
        try:
            remote = Process([sys.executable, str(ROOT / "benchmarks" / "badday_bench.py"), "remote", "--port",
                              str(remote_port)], folder / "remote.log")
            receiver = Process([sys.executable, __file__, "receiver", "--port", str(receiver_port)],
                               folder / "receiver.log")
            processes += [remote, receiver]
            if kind == "node":
                config = folder / "openroute.toml"
                config.write_text(CONFIG.format(database=url, remote_port=remote_port, receiver_port=receiver_port,
                                                records=str(records).lower()))
                server = Process([sys.executable, "-m", "openroute", "run", "--config", str(config), "--port",
                                  str(port)], folder / "node.log")
            else:
                server = Process([sys.executable, __file__, "floor", "--database", url, "--port", str(port),
                                  "--remote-port", str(remote_port), "--receiver-port", str(receiver_port),
                                  "--records", "on" if records else "off"], folder / "floor.log")
            processes.append(server)
            asyncio.run(wait_http(f"http://127.0.0.1:{remote_port}/call", 60))
            asyncio.run(wait_http(f"http://127.0.0.1:{receiver_port}/count", 60))
            asyncio.run(wait_http(f"http://127.0.0.1:{port}/health", 60))
            time.sleep(0.5)
            for process in processes:  # a free port taken meanwhile (an outbound connection's): the run is retried
                if process.process.poll() is not None:
                    raise PortTaken(f"{process.log.name}: exited with {process.process.returncode} at start")
            run_id = uuid.uuid4().hex[:8]
            if args.warm_up:
                asyncio.run(closed_loop(port, requests_for(f"warm-{run_id}", args.warm_up), args.senders))
                wait_confirmed(receiver_port, args.warm_up, args.timeout, processes)
            requests = requests_for(run_id, args.count)
            pids = {"server": server.process.pid, "remote": remote.process.pid, "receiver": receiver.process.pid}
            before = {name: process_cpu_seconds(pid) or 0.0 for name, pid in pids.items()}
            main_before = main_thread_cpu_seconds(server.process.pid) or 0.0
            database_before = local_postgres_cpu_seconds() if database != "sqlite" else None
            if profile is not None:
                spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p",
                                        str(server.process.pid), "--gil", "-f", "raw", "-o", str(profile)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)
            client_before, started_at, started = time.process_time(), datetime.now(UTC), time.perf_counter()
            latencies, errors = asyncio.run(closed_loop(port, requests, args.senders))
            accepted = time.perf_counter() - started
            client_cpu = time.process_time() - client_before
            wait_confirmed(receiver_port, args.warm_up + args.count, args.timeout, processes)
            after = {name: process_cpu_seconds(pid) or 0.0 for name, pid in pids.items()}
            main_after = main_thread_cpu_seconds(server.process.pid) or 0.0
            database_after = local_postgres_cpu_seconds() if database != "sqlite" else None
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            last_sent = store_figures(url, args.warm_up + args.count, records)
            paced = paced_run(url, port, receiver_port, run_id, args.count / (last_sent - started_at).total_seconds(),
                              records, args, processes)
        except BaseException as error:
            if not isinstance(error, PortTaken):
                show_logs(processes)
            raise
        finally:
            if spy is not None and spy.poll() is None:
                spy.kill()
            for process in reversed(processes):
                process.stop()
    elapsed = (last_sent - started_at).total_seconds()
    count = args.count
    figures = {
        "rate": count / elapsed, "seconds": elapsed, "accept_rate": count / accepted, "errors": errors,
        "p50": percentile(latencies, 0.5) * 1000, "p99": percentile(latencies, 0.99) * 1000,
        "server_us": (after["server"] - before["server"]) / count * 1e6,
        "main_us": (main_after - main_before) / count * 1e6,
        "remote_us": (after["remote"] - before["remote"]) / count * 1e6,
        "receiver_us": (after["receiver"] - before["receiver"]) / count * 1e6,
        "client_us": client_cpu / count * 1e6, "client_busy": client_cpu / accepted,
    }
    if database_before is not None and database_after is not None:
        figures["database_us"] = (database_after - database_before) / count * 1e6
    return figures | paced


def paced_run(url: str, port: int, receiver_port: int, run_id: str, rate: float, records: bool, args: Any,
              processes: Sequence[Process]) -> dict[str, float]:
    """The accept latency at a steady load the server keeps up with: ``--paced-count`` messages sent at ``--paced``
    times ``rate`` (the run's own messages a second) on a fixed schedule (open loop), each through the whole route;
    their accept p50 / p99 (from each request's scheduled time) once all are confirmed. Nothing when ``--paced`` is
    0."""
    if not args.paced or not args.paced_count:
        return {}
    paced_rate = args.paced * rate
    latencies, errors = asyncio.run(open_loop(port, requests_for(f"paced-{run_id}", args.paced_count), paced_rate))
    wait_confirmed(receiver_port, args.warm_up + args.count + args.paced_count, args.timeout, processes)
    store_figures(url, args.warm_up + args.count + args.paced_count, records)
    return {"paced_rate": paced_rate, "paced_p50": percentile(latencies, 0.5) * 1000,
            "paced_p99": percentile(latencies, 0.99) * 1000, "paced_errors": errors}


def describe(figures: dict[str, float]) -> str:
    cpu = (f"CPU us/msg: server {figures['server_us']:.0f} (main thread {figures['main_us']:.0f}), remote "
           f"{figures['remote_us']:.0f}, receiver {figures['receiver_us']:.0f}, client {figures['client_us']:.0f}")
    if "database_us" in figures:
        cpu += f", database {figures['database_us']:.0f}"
    paced = ""
    if "paced_rate" in figures:
        paced = (f"; paced at {figures['paced_rate']:.0f}/s: p50 {figures['paced_p50']:.1f} ms, p99 "
                 f"{figures['paced_p99']:.1f} ms, {figures['paced_errors']:.0f} refused")
    return (f"{figures['rate']:6.0f} msg/s ({figures['seconds']:.1f} s; accepted at {figures['accept_rate']:.0f}/s, "
            f"p50 {figures['p50']:.1f} ms, p99 {figures['p99']:.1f} ms, {figures['errors']:.0f} refused); {cpu}; "
            f"client busy {figures['client_busy']:.0%}{paced}")


def main() -> None:
    parser = arguments(__doc__, count=2000, senders=64, databases="sqlite,postgres")
    parser.add_argument("--records", default="off,on", help="call records: off, on or both (default)")
    parser.add_argument("--warm-up", type=int, default=200, help="messages sent and confirmed before each run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take to confirm everything")
    parser.add_argument("--paced", type=float, default=0.8,
                        help="after each run, the accept latency at this fraction of its rate, open loop (0: not)")
    parser.add_argument("--paced-count", type=int, default=1000, help="messages of the paced load (default 1000)")
    parser.add_argument("--profile", type=Path, help="instead: profile one server run with py-spy into this file")
    parser.add_argument("--profile-server", choices=["node", "floor"], default="node",
                        help="the server --profile profiles (default: the node)")
    args = parser.parse_args()
    databases = [name.strip() for name in args.databases.split(",") if name.strip()]
    variants = [name.strip() == "on" for name in args.records.split(",") if name.strip()]
    if not databases or not set(databases) <= {"sqlite", "postgres"} or not variants:
        parser.error("--databases takes sqlite and/or postgres, --records off and/or on")
    if args.profile is not None:
        with tempfile.TemporaryDirectory(prefix="route-bench-") as folder:
            figures = run(args.profile_server, databases[0], variants[0], args, Path(folder),
                          profile=args.profile.resolve())
        print(f"profiled {args.profile_server}, {databases[0]}, records {'on' if variants[0] else 'off'}: "
              f"{describe(figures)}")
        return
    print(f"route benchmark: {args.count} messages per run ({args.warm_up} before, not counted), {args.senders} "
          f"senders (closed loop), {args.repeat} interleaved repetitions, {os.cpu_count()} CPUs")
    cases = [(kind, records) for records in variants for kind in ("node", "floor")]
    results: dict[tuple[str, bool, str], list[dict[str, float]]] = {}
    for repetition in range(args.repeat):
        for database in databases:
            shift = repetition % len(cases)
            for kind, records in cases[shift:] + cases[:shift]:
                figures = run_once_more(kind, database, records, args)
                results.setdefault((database, records, kind), []).append(figures)
                print(f"  rep {repetition + 1} {database:8} records {'on ' if records else 'off'} {kind:5} "
                      f"{describe(figures)}", flush=True)
    print(f"\n{'database':8} {'records':7} {'floor msg/s':>18} {'node msg/s':>18} {'node / floor':>18} "
          f"{'node p50 ms':>18} {'node p99 ms':>20} {'floor p99 ms':>18}   (min / median / max)")
    for database in databases:
        for records in variants:
            node, floor = results[(database, records, "node")], results[(database, records, "floor")]
            ratios = [n["rate"] / f["rate"] for n, f in zip(node, floor, strict=True)]
            print(f"{database:8} {'on' if records else 'off':7} {spread([f['rate'] for f in floor]):>18} "
                  f"{spread([n['rate'] for n in node]):>18} {spread(ratios, 2):>18} "
                  f"{spread([n['p50'] for n in node], 1):>18} {spread([n['p99'] for n in node], 1):>20} "
                  f"{spread([f['p99'] for f in floor], 1):>18}")
    if args.paced and args.paced_count:
        print(f"\naccept latency at {args.paced:g} of each run's own rate, open loop ({args.paced_count} messages): "
              "min / median / max")
        print(f"{'database':8} {'records':7} {'node msg/s':>18} {'node p50 ms':>18} {'node p99 ms':>20} "
              f"{'floor msg/s':>18} {'floor p99 ms':>20}")
        for database in databases:
            for records in variants:
                node, floor = results[(database, records, "node")], results[(database, records, "floor")]
                columns = [spread([n["paced_rate"] for n in node]), spread([n["paced_p50"] for n in node], 1),
                           spread([n["paced_p99"] for n in node], 1), spread([f["paced_rate"] for f in floor]),
                           spread([f["paced_p99"] for f in floor], 1)]
                print(f"{database:8} {'on' if records else 'off':7} {columns[0]:>18} {columns[1]:>18} "
                      f"{columns[2]:>20} {columns[3]:>18} {columns[4]:>20}")
    print("\nCPU per message, medians (us): server (main thread) / remote / receiver / client / database")
    for (database, records, kind), runs in results.items():
        parts = [statistics.median(r[key] for r in runs) for key in ("server_us", "main_us", "remote_us",
                                                                      "receiver_us", "client_us")]
        database_us = statistics.median(r["database_us"] for r in runs) if "database_us" in runs[0] else None
        print(f"  {database:8} records {'on ' if records else 'off'} {kind:5} {parts[0]:6.0f} ({parts[1]:.0f}) / "
              f"{parts[2]:.0f} / {parts[3]:.0f} / {parts[4]:.0f}"
              + (f" / {database_us:.0f}" if database_us is not None else "")
              + f"; client at most {max(r['client_busy'] for r in runs):.0%} busy")


def _mode() -> None:
    """The child processes' modes: ``receiver --port P`` and ``floor --database URL --port P --remote-port R
    --receiver-port C --records on|off``."""
    options = dict(zip(sys.argv[2::2], sys.argv[3::2], strict=False))
    if sys.argv[1] == "receiver":
        serve_receiver(int(options["--port"]))
    else:
        serve_floor(options["--database"], int(options["--port"]), int(options["--remote-port"]),
                    int(options["--receiver-port"]), options["--records"] == "on")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("receiver", "floor"):
        _mode()
    else:
        main()
