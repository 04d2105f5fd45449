"""Lifecycle benchmark: completed messages per second against a fair floor, on fresh and aged stores.

    python benchmarks/lifecycle_bench.py [--count 20000] [--repeat 3] [--senders 64] [--databases sqlite,postgres]
                                         [--modes fresh,aged,backlog] [--aged-rows 100000]
                                         [--transition-cost] [--call-start-cost]
                                         [--only engine|floor [--floor-group 63] [--claimed-share 1.0]]

``--call-start-cost`` measures instead what the STARTED record of each external call costs (issue 23): the engine
on fresh stores with a route making two ``ext_call`` s per message to an instant in-process remote (the worst case:
a real remote's latency hides the record), once with the call records as they were before (outcome only, written
after the call) and once as they are (STARTED committed before the call, outcome after), interleaved.

``--only engine`` or ``--only floor`` runs one side alone (``--repeat`` times, the first of ``--databases`` and
``--modes``), without the node's background jobs and the loop-lag pacing, whose work follows the clock rather than
the messages: for counting instructions per message, e.g. ``valgrind --tool=callgrind`` over ``--count 2000`` and
``--count 4000``, the difference over 2,000.

Store modes (each run gets its own database, copied from a prepared template so aging costs nothing per run):

* ``fresh``: an empty, migrated store;
* ``aged``: ``--aged-rows`` OK messages (100,000 by default; issue #45 measures PostgreSQL on 1,000,000), then
  ANALYZE (what autovacuum gives any live table: the planner has statistics);
* ``backlog``: ``aged`` plus 10,000 NEW messages left waiting (nobody queues them: repoll is off).

Two measurements per store, interleaved (one repetition runs every database x mode x {floor, engine} once):

* the **floor**: the engine's own SQL work done with nothing around it: for each message one INSERT of the
  ``message`` row (multi-row ``INSERT ... VALUES ... RETURNING id`` like the store's batch insert), one claim
  UPDATE (NEW -> PROCESSING by id + version, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL) and one outcome UPDATE
  (PROCESSING -> OK by id + version, executemany), plus the ``message_transition`` rows the engine writes per
  message (measured from a warm-up run, 0 before they exist), through the raw driver on the store's own
  engine (same pragmas, same durability), and grouped per commit as the engine's writer grouped them in the same
  repetition (its writes per commit over its writes per message: a message is three writer operations, insert,
  claim and outcome, each with its transition rows, or two when its accept found a free worker and stored it
  claimed), or ``--floor-group`` messages per commit. The share of the engine's messages claimed at their accept
  is inserted claimed by the floor too (PROCESSING, with the claim's columns, in a multi-row INSERT of their own,
  and no claim UPDATE);
Beside both, the node's background jobs that ``openroute run`` runs by default (:func:`node_jobs`: the message
counts folded every 2 s, the payload search's index filled every 0.5 s on PostgreSQL), so that both pay their
database work.

* the **engine**: ``senders`` concurrent clients accept ``count`` messages of a trivial route while one node
  (default settings; start-up objects frozen out of the garbage collector's reach, as ``openroute run`` does)
  processes them (NEW -> PROCESSING -> OK); completed msgs/s = messages that reached a final state / time
  until the last accepted one is OK. In ``backlog`` mode the engine also picks up NEW messages of the route
  at start (up to ``repoll_batch``) and works them with the rest; they count as completed work.

It prints msgs/s, accept latency p50 / p99, process peak RSS, the ratio engine / floor (min / median / max over
the repetitions; goal >= 0.5) and the ratio aged / fresh of the engine's median (goal >= 0.9), beside the floor's own
aged / fresh (what the aged indexes cost the database itself).
The machine is shared: repeat, and read the spread, not one figure. Keep runs at a few seconds or more (the default
count): a 5,000-message run took 0.4 s on SQLite here, and its first WAL checkpoint into the store file, dearer on an
aged store, decided its aged / fresh ratio.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.persistence import ExternalCallStatus, MessageState, MessageStore, StoredMessage
from openroute.persistence._bind import _sqlite_timestamp  # the store's own timestamp text
from openroute.persistence._hot_path import INSERT_COLUMNS, POSTGRES_CLAIM  # the store's own SQL

from benchmarks._common import arguments, concurrently, spread
from benchmarks.store_fill import age
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.jobs.counts import MessageCounts
from openroute.jobs.payload_indexer import PayloadIndexer
from openroute.runtime import collector

POSTGRES_URL = os.environ.get("OPENROUTE_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: the store modes: (OK messages aged in, NEW messages of the benchmark's route waiting); ``--aged-rows`` sets the first
MODES = {"fresh": (0, 0), "aged": (100_000, 0), "backlog": (100_000, 10_000)}

TRANSITION_COLUMNS = ("message_id", "from_state", "to_state", "at", "node_id", "attempt", "error_code", "cause")


@contextmanager
def node_jobs(url: str) -> Iterator[None]:
    """The node's background jobs that ``openroute run`` runs by default, beside a run of the engine or of the floor
    alike: the message counts folded every 2 s and the payload search's index filled every 0.5 s (PostgreSQL), in a
    thread of their own (their work is the database's and their worker threads'; on the node's loop they took under
    1 % of its samples each)."""
    store = MessageStore(url)
    ready, stopping = threading.Event(), threading.Event()

    async def jobs() -> None:
        stop = asyncio.Event()
        running = [asyncio.create_task(MessageCounts(store).run(stop)),
                   asyncio.create_task(PayloadIndexer(store).run(stop))]
        ready.set()
        await asyncio.to_thread(stopping.wait)
        stop.set()
        await asyncio.gather(*running)

    thread = threading.Thread(target=asyncio.run, args=(jobs(),), name="node-jobs", daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield
    finally:
        stopping.set()
        thread.join(60)
        store.dispose()


class Templates:
    """One prepared (migrated, aged) database per database kind and mode; each run gets a copy. Used as a context
    manager: its temporary folder and its PostgreSQL templates are removed on exit."""

    def __init__(self, aged_rows: int = 100_000) -> None:
        self.aged_rows = aged_rows
        self.folder = Path(tempfile.mkdtemp(prefix="openroute-bench-"))
        self.made: dict[tuple[str, str], str] = {}
        self.admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")

    def __enter__(self) -> Templates:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.drop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def template(self, kind: str, mode: str) -> str:
        key = (kind, mode)
        if key not in self.made:
            final, backlog = MODES[mode]
            final = self.aged_rows if final else 0
            if kind == "sqlite":
                url = f"sqlite:///{self.folder / f'template-{mode}.db'}"
            else:
                name = f"openroute_bench_t_{mode}_{uuid.uuid4().hex[:6]}"
                with self.admin.connect() as connection:
                    connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
                url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
            store = MessageStore(url)
            store.create_schema()
            if final or backlog:
                age(store.engine, final=final, backlog=backlog, backlog_route=("bench", "noop"))
            store.dispose()
            self.made[key] = url
        return self.made[key]

    def settle(self) -> None:
        """Let the machine's writing of the last run and of the new copy end before a run starts: the kernel's dirty
        pages written (the copy of a SQLite template) and, once a PostgreSQL database was made, a checkpoint. Left
        to land later, that work fell into whichever run came next (an engine run follows the last run's floor)."""
        os.sync()
        if any(kind == "postgres" for kind, _mode in self.made):
            with self.admin.connect() as connection:
                connection.execute(sa.text("CHECKPOINT"))

    @contextmanager
    def copy(self, kind: str, mode: str) -> Iterator[str]:
        template = self.template(kind, mode)
        if kind == "sqlite":
            target = self.folder / f"run-{uuid.uuid4().hex[:8]}.db"
            shutil.copy(template.removeprefix("sqlite:///"), target)
            self.settle()
            try:
                yield f"sqlite:///{target}"
            finally:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{target}{suffix}").unlink(missing_ok=True)
            return
        name = f"openroute_bench_{uuid.uuid4().hex[:8]}"
        with self.admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template.rsplit("/", 1)[1]}"'))
        self.settle()
        try:
            yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
        finally:
            with self.admin.connect() as connection:
                connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def drop(self) -> None:
        with self.admin.connect() as connection:
            for (kind, _mode), url in self.made.items():
                if kind == "postgres":
                    connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
        self.admin.dispose()


def _sql(dialect: str, text: str) -> str:
    return text.replace("?", "%s") if dialect == "postgresql" else text


def floor(url: str, count: int, chunk: int, transitions_per_message: int, claimed_share: float = 0.0) -> float:
    """Messages/s of the engine's statements alone, the whole work of ``chunk`` messages per commit; the first
    ``claimed_share`` of each chunk's messages are inserted claimed (as an accept that found a free worker stores them),
    the others NEW and claimed by their UPDATE."""
    store = MessageStore(url)
    engine = store.engine
    dialect = store.dialect
    chunk = max(chunk, 1)
    row_marks = "(" + ", ".join("?" for _ in INSERT_COLUMNS) + ")"
    json_obj, json_list = "{}", "[]"
    claim_where = "id IN ({ids}) AND (id, version) IN ({pairs})"  # the store's claim on SQLite
    outcome = _sql(dialect, "UPDATE message SET state = ?, version = ?, last_update_ts = ? "
                            "WHERE id = ? AND version = ?")
    # the store's transition row: the attempt is read from the message row (failed_count + 1)
    transition = _sql(dialect, f"INSERT INTO message_transition ({', '.join(TRANSITION_COLUMNS)}) VALUES "
                               "(?, ?, ?, ?, ?, (SELECT failed_count + 1 FROM message WHERE id = ?), ?, ?)")
    steps = [(None, "NEW"), ("NEW", "PROCESSING"), ("PROCESSING", "OK")][:transitions_per_message]

    def record(cursor: Any, ids: list[int], step: int) -> None:
        if step < len(steps) and ids:
            before, after = steps[step]
            cursor.executemany(transition, [(i, before, after, now, "bench", i, None, "engine") for i in ids])

    def insert(cursor: Any, rows: list[Any], n: int) -> list[int]:
        if not n:
            return []
        cursor.execute(_sql(dialect, f"INSERT INTO message ({', '.join(INSERT_COLUMNS)}) VALUES "
                                     f"{', '.join([row_marks] * n)} ON CONFLICT (source_system, correlation_id) "
                                     "DO NOTHING RETURNING id"), rows)
        return [row[0] for row in cursor.fetchall()]

    collected_before = collector.tune_for_serving()  # the engine's collector treatment (see engine_run)
    started = time.perf_counter()
    for first in range(0, count, chunk):
        n = min(chunk, count - first)
        claimed_n = round(n * claimed_share)
        now: Any = datetime.now(UTC)
        if dialect == "sqlite":
            # bound as the store's text, formatted once as the engine's writer formats it (_hot_path): handed the
            # datetime, sqlite3's default adapter would call isoformat for every parameter (~80,000 instructions a
            # message the engine does not pay) and store another text ("+00:00")
            now = _sqlite_timestamp(now)
        claimed_rows: list[Any] = []
        rows: list[Any] = []
        for i in range(first, first + n):
            if i - first < claimed_n:  # the claim's columns written by the INSERT: PROCESSING, version 1
                claimed_rows.extend((f"f-{i}", "bench", None, "bench", "noop", None, None, None, "<order/>",
                                     "text/xml", json_obj, "PROCESSING", 0, now, None, now, now, None, "bench",
                                     json_obj, json_list, None, None, None, 1, None))
            else:
                rows.extend((f"f-{i}", "bench", None, "bench", "noop", None, None, None, "<order/>", "text/xml",
                             json_obj, "NEW", 0, now, None, None, now, None, None, json_obj, json_list, None, None,
                             None, 0, None))
        with engine.begin() as connection:
            cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            claimed = insert(cursor, claimed_rows, claimed_n)
            ids = insert(cursor, rows, n - claimed_n)
            record(cursor, claimed + ids, 0)
            record(cursor, claimed, 1)
            won: list[int] = []
            if not ids:
                pass
            elif dialect == "postgresql":  # the store's own text: the id and version arrays joined, SKIP LOCKED
                cursor.execute(POSTGRES_CLAIM, ["PROCESSING", "bench", now, now, ids, [0] * len(ids)])
                won = [row[0] for row in cursor.fetchall()]
            else:
                pairs = ", ".join("(?, ?)" for _ in ids)
                claim = _sql(dialect, "UPDATE message SET state = ?, start_process_ts = ?, last_update_ts = ?, "
                                      f"node_id = ?, version = version + 1 "
                                      f"WHERE {claim_where.format(ids=', '.join('?' for _ in ids), pairs=pairs)} "
                                      "RETURNING id")
                cursor.execute(claim, ["PROCESSING", now, now, "bench", *ids, *[v for i in ids for v in (i, 0)]])
                won = [row[0] for row in cursor.fetchall()]
            record(cursor, won, 1)
            processing = claimed + won
            cursor.executemany(outcome, [("OK", 2, now, i, 1) for i in processing])
            record(cursor, processing, 2)
            cursor.close()
    elapsed = time.perf_counter() - started
    collector.untune(collected_before)
    with engine.connect() as connection:
        done = connection.execute(sa.text("SELECT count(*) FROM message WHERE state = 'OK' AND source_system = "
                                          "'bench'")).scalar_one()
    store.dispose()
    if done != count:
        raise SystemExit(f"floor run is wrong: {done} of {count} OK")
    return count / elapsed


async def _two_calls(exchange: Any) -> None:
    async def remote() -> dict[str, bool]:
        return {"ok": True}

    await exchange.ext_call("billing", remote)
    await exchange.ext_call("mno", remote)


def _records_before_issue_23(store: MessageStore) -> None:
    """The call records as they were before the STARTED record: a read before the call, the outcome after."""

    def begin(message_id: int, call_key: str, _key: str, _node: str, _now: datetime, *, hold_in_doubt: bool = False,
              connection: Any = None) -> Any:
        previous = store.calls.get(message_id, call_key, connection)
        return previous, previous is None or previous.status is not ExternalCallStatus.OK

    def finish(message_id: int, call_key: str, ok: bool, now: datetime, result: Any = None, error: Any = None,
               connection: Any = None) -> bool:
        status = ExternalCallStatus.OK if ok else ExternalCallStatus.FAILED
        store.calls.record(message_id, call_key, status, now, result=result, error=error,
                                   connection=connection)
        return True

    store.calls.begin = begin  # type: ignore[method-assign]
    store.calls.finish = finish  # type: ignore[method-assign]


async def engine_run(url: str, count: int, senders: int, calls: str | None = None, *,
                     pacing: bool = True) -> dict[str, float]:
    """One engine run; ``calls``: None (trivial route), "before" or "after" (two ext_calls per message); without
    ``pacing`` the node's loop-lag timer is not started (``--only``: its ticks follow the clock, not the messages)."""
    store = MessageStore(url)
    if calls == "before":
        _records_before_issue_23(store)
    step = _two_calls if calls is not None else (lambda exchange: None)
    routes = RouteRegistry([Route("bench", "noop", [step])])
    engine = Engine(store, routes, EngineSettings(node_id="bench", repoll_interval=None))
    if not pacing:  # internal, as the writer's counters below: a benchmark may look
        engine._queue.pressure.start = lambda: None  # type: ignore[method-assign]
    done = asyncio.Event()
    completed = finals = 0

    async def on_final(message: StoredMessage) -> None:
        nonlocal completed, finals
        finals += 1  # backlog messages the engine picked up at start count as work done too
        if message.source_system == "bench":
            completed += 1
            if completed == count:
                done.set()

    engine.on_final_state(on_final)
    await engine.start()
    # the collector as `openroute run` sets it once it serves (undone after the run, so the runs stay independent)
    collected_before = collector.tune_for_serving()
    latencies: list[float] = []

    async def send(i: int) -> None:
        inbound = InboundMessage("bench", "noop", "<order/>", "text/xml", f"b-{i}", "bench")
        t0 = time.perf_counter()
        await engine.accept(inbound)
        latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await concurrently(count, senders, send)
    accepted_at = time.perf_counter() - started
    await asyncio.wait_for(done.wait(), 600)
    completed_at = time.perf_counter() - started
    with store.engine.connect() as connection:
        ok = connection.execute(sa.text("SELECT count(*) FROM message WHERE source_system = 'bench' AND state = "
                                        f"'{MessageState.OK.value}'")).scalar_one()
        try:
            transitions = connection.execute(sa.text(
                "SELECT count(*) FROM message_transition t JOIN message m ON m.id = t.message_id "
                "WHERE m.source_system = 'bench'")).scalar_one()
        except sa.exc.DBAPIError:
            transitions = 0
    writer = engine._pipeline.writer  # the group-commit writer's own counters (internal: a benchmark may look)
    writer_cpu, commits, writes = writer.cpu_seconds, writer.transactions, writer.operations
    claimed_at_accept = engine.stats.claimed_at_accept
    await engine.stop()
    collector.untune(collected_before)
    if ok != count:
        states = store.count_by_state()
        raise SystemExit(f"benchmark run is wrong: {ok} of {count} OK ({states}; {engine.stats})")
    store.dispose()
    latencies.sort()
    return {
        "accepted": count / accepted_at,
        "completed": finals / completed_at,
        "backlog_done": finals - count,
        "writer_us": writer_cpu / finals * 1e6,
        "per_commit": writes / max(commits, 1),
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "transitions_per_message": transitions / count,
        # how the engine wrote them: writer operations per message (insert, claim, outcome; the claim is the
        # insert's for a message claimed at its accept) and the share claimed at accept, which the floor mirrors
        "writes_per_message": writes / max(finals, 1),
        "claimed_at_accept": claimed_at_accept / max(finals, 1),
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def transition_cost(kinds: list[str], count: int, repeat: int, group: int) -> None:
    """The floor with its three message_transition rows per message against the same floor without them,
    interleaved on fresh stores: what the history (issue #9) costs the database itself."""
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds}
    with Templates() as templates:
        for rep in range(repeat):
            for kind in kinds:
                with templates.copy(kind, "fresh") as url:
                    without = floor(url, count, group, 0)
                with templates.copy(kind, "fresh") as url:
                    with_rows = floor(url, count, group, 3)
                ratios[kind].append(with_rows / without)
                print(f"  rep {rep + 1} {kind:8} floor without transition rows {without:7.0f} msg/s | with "
                      f"{with_rows:7.0f} msg/s | ratio {with_rows / without:4.2f}", flush=True)
    for kind in kinds:
        print(f"{kind}: floor with / without transition rows (min / median / max) {spread(ratios[kind], 2)}")


def call_start_cost(kinds: list[str], count: int, repeat: int, senders: int) -> None:
    """Completed msgs/s with two ext_calls per message, before / after the STARTED record, interleaved."""
    print(f"call start record: {count} messages per run, two ext_calls each (instant remote), {senders} senders, "
          f"{repeat} interleaved repetitions")
    found: dict[tuple[str, str], list[float]] = {}
    with Templates() as templates:
        for rep in range(repeat):
            for kind in kinds:
                order = ("before", "after") if rep % 2 == 0 else ("after", "before")
                for variant in order:
                    with templates.copy(kind, "fresh") as url:
                        run = asyncio.run(engine_run(url, count, senders, calls=variant))
                    found.setdefault((kind, variant), []).append(run["completed"])
                    print(f"  rep {rep + 1} {kind:8} {variant:6} {run['completed']:7.0f} msg/s "
                          f"(accept p50 {run['p50']:.1f} ms)", flush=True)
    for kind in kinds:
        before, after = found[(kind, "before")], found[(kind, "after")]
        cost = 1 - statistics.median(after) / statistics.median(before)
        print(f"{kind}: before {spread(before)} msg/s, after {spread(after)} msg/s (min / median / max); "
              f"cost of the start record {cost:.1%} of the median (goal < 10 % on PostgreSQL)")


def only(side: str, kind: str, mode: str, count: int, repeat: int, senders: int, group: int,
         claimed_share: float, aged_rows: int) -> None:
    """``--only``: ``repeat`` runs of one side alone on one database and store mode, for counting its instructions
    per message (``valgrind --tool=callgrind`` or ``perf stat -e instructions`` over two counts, the difference over
    the extra messages): no node jobs beside it and no loop-lag pacing, whose work follows the clock rather than the
    messages (under callgrind the clock runs 50x slower). The floor writes 3 transition rows a message, as the
    engine does."""
    with Templates(aged_rows) as templates:
        for rep in range(repeat):
            with templates.copy(kind, mode) as url:
                if side == "engine":
                    run = asyncio.run(engine_run(url, count, senders, pacing=False))
                    print(f"  rep {rep + 1} {kind} {mode} engine {run['completed']:7.0f} msg/s | writer CPU "
                          f"{run['writer_us']:.0f} us/msg, {run['per_commit']:.0f} writes/commit, "
                          f"{run['writes_per_message']:.2f} writes/message, {run['claimed_at_accept']:.0%} claimed "
                          "at accept", flush=True)
                else:
                    base = floor(url, count, group, 3, claimed_share)
                    print(f"  rep {rep + 1} {kind} {mode} floor {base:7.0f} msg/s ({group} messages/commit, "
                          f"{claimed_share:.0%} inserted claimed)", flush=True)


def _instead(args: Any, kinds: list[str], modes: list[str]) -> bool:
    """Run what ``--only``, ``--call-start-cost`` or ``--transition-cost`` asks instead of the comparison; False when
    none of them is given."""
    if args.only:
        only(args.only, kinds[0], modes[0], args.count, args.repeat, args.senders, args.floor_group or 63,
             args.claimed_share, args.aged_rows)
    elif args.call_start_cost:
        call_start_cost(kinds, args.count, args.repeat, args.senders)
    elif args.transition_cost:
        transition_cost(kinds, args.count, args.repeat, args.floor_group or 63)
    else:
        return False
    return True


def main() -> None:
    # runs of a few seconds at least: on SQLite a short run is dominated by its first WAL checkpoint into the store
    # file (costlier on an aged store), which a longer run, like a server's, amortises
    parser = arguments(__doc__, count=20000, senders=64, databases="sqlite,postgres")
    parser.add_argument("--floor-group", type=int, default=None, metavar="MESSAGES",
                        help="messages per floor commit (default: as the engine grouped them in the same repetition)")
    parser.add_argument("--modes", default="fresh,aged,backlog")
    parser.add_argument("--aged-rows", type=int, default=100_000, metavar="MESSAGES",
                        help="OK messages in the aged and backlog stores (default 100,000)")
    parser.add_argument("--transition-cost", action="store_true",
                        help="instead: the floor with and without its message_transition rows (fresh stores, "
                             "--floor-group or 63 messages per commit), what keeping the history costs the database")
    parser.add_argument("--call-start-cost", action="store_true",
                        help="instead: two ext_calls per message, call records before / after the STARTED record")
    parser.add_argument("--only", choices=("engine", "floor"), default=None,
                        help="instead: one side alone on the first database and mode, --repeat runs, no node jobs and "
                             "no loop-lag pacing (for instruction counts: run it under callgrind for two counts)")
    parser.add_argument("--claimed-share", type=float, default=1.0, metavar="SHARE",
                        help="with --only floor: the share of messages inserted claimed (default 1.0, as the engine "
                             "claims every message at its accept while its queue has room)")
    args = parser.parse_args()
    kinds, modes = args.databases.split(","), args.modes.split(",")
    if _instead(args, kinds, modes):
        return
    print(f"lifecycle benchmark: {args.count} messages per run, {args.senders} concurrent senders, trivial route, "
          f"{args.repeat} interleaved repetitions; the floor commits "
          f"{args.floor_group or 'as many messages as the engine did'} at a time")
    per_message: dict[str, int] = {}
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    with Templates(args.aged_rows) as templates:
        for kind in kinds:
            with templates.copy(kind, "fresh") as url:  # warm-up: how many transition rows the engine writes
                per_message[kind] = round(asyncio.run(engine_run(url, 200, args.senders))["transitions_per_message"])
            print(f"{kind}: the engine writes {per_message[kind]} message_transition rows per message; "
                  "the floor writes as many")
        for rep in range(args.repeat):
            for kind in kinds:
                for mode in modes:
                    entry = results.setdefault((kind, mode), {k: [] for k in
                                                              ("floor", "completed", "accepted", "p50", "p99",
                                                               "ratio", "writer_us", "per_commit")})
                    with templates.copy(kind, mode) as url, node_jobs(url):
                        run = asyncio.run(engine_run(url, args.count, args.senders))
                    # the messages of a commit: its writer operations over those of a message (3: insert, claim,
                    # outcome; 2 for a message claimed in its accept's insert)
                    group = args.floor_group or round(run["per_commit"] / run["writes_per_message"])
                    with templates.copy(kind, mode) as url, node_jobs(url):
                        base = floor(url, args.count, group, per_message[kind], run["claimed_at_accept"])
                    entry["floor"].append(base)
                    for key in ("completed", "accepted", "p50", "p99", "writer_us", "per_commit"):
                        entry[key].append(run[key])
                    entry["ratio"].append(run["completed"] / base)
                    print(f"  rep {rep + 1} {kind:8} {mode:8} floor {base:7.0f} msg/s | engine {run['completed']:7.0f}"
                          f" msg/s | ratio {run['completed'] / base:4.2f} | backlog messages done "
                          f"{run['backlog_done']:.0f} | writer CPU {run['writer_us']:.0f} us/msg, "
                          f"{run['per_commit']:.0f} writes/commit, {run['claimed_at_accept']:.0%} claimed at accept;"
                          f" floor {group} messages/commit", flush=True)
    print(f"\n{'database':9} {'store':8} {'floor msg/s':>20} {'completed msg/s':>20} {'accept p50 ms':>18} "
          f"{'p99 ms':>18} {'writer CPU us/msg':>18} {'engine/floor':>17}   (min / median / max)")
    for (kind, mode), entry in results.items():
        print(f"{kind:9} {mode:8} {spread(entry['floor']):>20} {spread(entry['completed']):>20} "
              f"{spread(entry['p50'], 2):>18} {spread(entry['p99'], 1):>18} {spread(entry['writer_us']):>18} "
              f"{spread(entry['ratio'], 2):>17}")
    for kind in kinds:
        fresh = results.get((kind, "fresh"))
        for mode in modes:
            if mode != "fresh" and fresh is not None:
                ratio = statistics.median(results[(kind, mode)]["completed"]) / statistics.median(fresh["completed"])
                # the database's own cost of an aged store, for comparison: the floor's ratio in the same runs
                own = statistics.median(results[(kind, mode)]["floor"]) / statistics.median(fresh["floor"])
                print(f"{kind}: {mode} / fresh (median completed msgs/s) = {ratio:.2f} (goal >= 0.90); "
                      f"the floor's own {mode} / fresh = {own:.2f}")
    print(f"process peak RSS {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
