"""Against the peers: openroute, PgQueuer and procrastinate doing the same work on the same PostgreSQL, interleaved.

    python benchmarks/peers_bench.py [--count 5000] [--repeat 5] [--senders 64] [--pool 10]
                                     [--pgqueuer-batch-size 10] [--procrastinate-concurrency 64]
                                     [--loop uvloop|asyncio] [--log-level LEVEL]
                                     [--systems openroute,pgqueuer,procrastinate] [--profile FOLDER]

The peers are an optional extra (``pip install -e '.[bench]'``: ``pgqueuer[asyncpg]`` and ``procrastinate``); without
them the script says so and exits 2.

**The work**, the same for the three: ``--senders`` concurrent producers (one coroutine each, the same code for all
three: ``benchmarks/_common.py`` ``concurrently``) hand over ``--count`` messages, each call returning once the
message is committed (durable accept); one consumer in the same process claims each message, runs a step that returns
at once and records its outcome. Completed msgs/s = messages in a final state / time from the first hand-over until
the last message is final; the hand-over latency p50 / p99 is the producer's call; peak RSS is the process's
(producers and consumer). The load generator's own ceiling is printed first (the same producers with a call that
returns at once): it is far above what any of the three completes. Each run is a process of its own (``--child``) on a
fresh database made for it and dropped after it; a repetition runs every system once, the order rotated from one
repetition to the next. Every process runs the same event loop (``--loop``, default uvloop: ``pgq run`` and
``openroute run``, through uvicorn, both pick it when it is installed, and pgqueuer depends on it) and sets Python's
logging as each system's own command does by default, to a file: INFO, which is one line per message for
openroute (its outcome, ``PROCESSING -> OK``), two for procrastinate (``Starting job``, ``ended with status``) and none
for PgQueuer (its per-job lines are DEBUG); ``--log-level`` sets one level for the three.

What each does per message (PostgreSQL 15, ``fsync`` and ``synchronous_commit`` on, every table logged):

* **openroute** runs as ``openroute run`` does (``openroute/commands/run.py``), minus the HTTP server: the default
  configuration (``load_config``), the engine at its default settings (concurrency 64, repoll every 10 s, heartbeat),
  the attempt-failure log and the transition log, the app of ``create_app`` with its lifespan running: the metrics'
  final-state hook, the confirmations (without ``[confirmations.systems]`` an outcome is confirmed by a log line at
  DEBUG, made from the final-state hook with no row: a log line cannot fail), the message counts folded every 2 s, the
  payload search's index filled every 0.5 s; tracing off; the collector set as ``openroute run`` sets it once it serves
  (``openroute.runtime.collector``). The producers call ``Engine.accept`` of a trivial route (an XML payload, a
  correlation id): the ``message`` INSERT (``ON CONFLICT (source_system, correlation_id) DO NOTHING``: accept is
  idempotent; a trigger adds the id to ``message_payload_pending``) and its NEW ``message_transition`` row; while the
  node's queue has room the same INSERT stores the message claimed for the node (PROCESSING) with its PROCESSING row,
  otherwise a claim UPDATE (NEW -> PROCESSING, by id and version, ``SKIP LOCKED``) and its row follow; then the outcome
  UPDATE (-> OK) and its row: every statement through the engine's group-commit writer (one connection; the writes
  queued meanwhile share a commit). Behind the OK's commit: the metrics' counters, the confirmation's (DEBUG) line, one
  INFO line (the OK); the payload is copied into the index by the indexer's batch every 0.5 s. The clock stops at the
  commit of the last OK (the benchmark's final-state hook runs first).
* **PgQueuer** (asyncpg) as its documentation recommends for throughput (docs/guides/performance-tuning.md): the
  producers call ``Queries.enqueue`` on an ``AsyncpgPoolDriver`` (a pool of ``--pool`` connections), the consumer
  is ``PgQueuer.run`` (its ``QueueManager`` and scheduler, as ``pgq run`` starts them) on a dedicated asyncpg
  connection with ``batch_size`` ``--pgqueuer-batch-size``, durability ``durable`` (its default) and its
  recommended autovacuum settings (``pgq autovac``). Per message: the enqueue statement (one CTE: the ``pgqueuer``
  INSERT and the ``queued`` row of ``pgqueuer_log``; a statement trigger NOTIFYs) in a commit of its own; a share of
  one dequeue UPDATE per batch (``queued`` -> ``picked``, ``SKIP LOCKED``, one commit per batch); the outcome
  buffered and written per ``batch_size`` jobs or every 0.1 s: one statement deleting the jobs from ``pgqueuer``
  and inserting their ``successful`` rows into ``pgqueuer_log`` (one commit per flush).
* **procrastinate** (psycopg 3) as its documentation shows for asynchronous tasks: the producers call
  ``task.defer_async`` on an ``App`` with a ``PsycopgConnector`` (a pool of ``--pool`` connections); the worker is
  ``run_worker_async`` with ``concurrency`` ``--procrastinate-concurrency`` on an ``App`` of its own (its own pool
  of ``--pool`` connections, as a worker process has), LISTEN/NOTIFY on, finished jobs kept (its default). Per
  message, three statements each in a commit of its own: the defer (``procrastinate_defer_jobs_v1``: the
  ``procrastinate_jobs`` INSERT, a ``procrastinate_events`` row and a NOTIFY by trigger), the fetch
  (``procrastinate_fetch_job_v2``: one job -> ``doing``, ``SKIP LOCKED``, an event row) and the finish
  (``procrastinate_finish_job_v1``: -> ``succeeded``, an event row).

So openroute writes the most rows per message (three transition rows and the payload index besides the message, and
the idempotency check of the correlation id) and the fewest commits; PgQueuer one commit per
message plus its batches; procrastinate three commits per message.

When a run is final: openroute's final-state hook runs after the commit of the OK; for the peers, once the step ran
for every message, the benchmark polls the database every 2 ms (one query on a connection of its own) until every
job is recorded: PgQueuer's ``pgqueuer`` table empty, procrastinate's ``succeeded`` count complete. Each run is
checked against the database afterwards (every message OK with its three transition rows; ``count`` ``successful``
rows in ``pgqueuer_log``; ``count`` ``succeeded`` jobs).

It prints each run, then per system completed msgs/s, hand-over p50 / p99 and peak RSS (min / median / max over the
repetitions), and per repetition the ratios openroute / PgQueuer and openroute / procrastinate with their min /
median / max, and the goal (issue #45: openroute / PgQueuer >= 1.5 at the minimum). The machine is shared: repeat,
read the spread, compare the ratios of one run rather than figures across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from benchmarks._common import arguments as common_arguments  # noqa: E402
from benchmarks._common import concurrently, fresh_database, spread  # noqa: E402

SYSTEMS = ("openroute", "pgqueuer", "procrastinate")
NAMES = {"openroute": "openroute", "pgqueuer": "PgQueuer", "procrastinate": "procrastinate"}
#: the modules each peer needs (PgQueuer's fast driver is asyncpg, an extra of its own)
PEER_MODULES = {"pgqueuer": ("pgqueuer", "asyncpg"), "procrastinate": ("procrastinate",)}
INSTALL = "pip install -e '.[bench]'  (or: pip install 'pgqueuer[asyncpg]' procrastinate)"
GOAL = 1.5  # issue #45: openroute / PgQueuer at the minimum
POLL = 0.002  # seconds between the peers' completion checks once every step ran
PAYLOAD = "<order/>"
T = TypeVar("T")


def admin_url() -> str:
    """The PostgreSQL server the fresh databases are made on: ``OPENROUTE_BENCH_POSTGRES_URL``, else the local test
    server as the user ``PGUSER`` (default ``postgres``), trust authentication."""
    return os.environ.get("OPENROUTE_BENCH_POSTGRES_URL") or (
        f"postgresql+psycopg://{os.environ.get('PGUSER', 'postgres')}@127.0.0.1:5432/test")


def dsn(url: str) -> str:
    """The libpq form (asyncpg, psycopg) of a SQLAlchemy URL."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def missing_peers(systems: list[str]) -> list[str]:
    return [module for system in systems for module in PEER_MODULES.get(system, ())
            if importlib.util.find_spec(module) is None]


@contextlib.contextmanager
def blank_database(prefix: str, admin: str) -> Iterator[str]:
    """The URL of a new empty PostgreSQL database (a peer installs its own schema), dropped with FORCE on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(admin).set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        engine.dispose()


# -- one run, in a process of its own -------------------------------------------------------------------------------
class Load:
    """The producers' side, the same for every system: ``send(i)`` hands message ``i`` over; the clock runs from the
    first call until :meth:`final` is called, each call is timed."""

    def __init__(self, count: int, senders: int) -> None:
        self.count, self.senders = count, senders
        self.latencies: list[float] = []
        self.started = self.accepted = self.completed = 0.0

    async def run(self, send: Callable[[int], Awaitable[object]], done: Callable[[], Awaitable[None]]) -> None:
        latencies = self.latencies

        async def timed(i: int) -> None:
            t0 = time.perf_counter()
            await send(i)
            latencies.append(time.perf_counter() - t0)

        self.started = time.perf_counter()
        await concurrently(self.count, self.senders, timed)
        self.accepted = time.perf_counter()
        await asyncio.wait_for(done(), 600)
        self.completed = time.perf_counter()

    def figures(self, **extra: Any) -> dict[str, Any]:
        latencies = sorted(self.latencies)
        return {
            "completed": self.count / (self.completed - self.started),
            "accepted": self.count / (self.accepted - self.started),
            "p50": statistics.median(latencies) * 1000,
            "p99": latencies[max(int(len(latencies) * 0.99) - 1, 0)] * 1000,
            "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **extra,
        }


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    while not await check():
        await asyncio.sleep(POLL)


async def run_openroute(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The engine and the app's services as ``openroute run`` assembles them (``openroute/commands/run.py``
    ``_server``), at the default configuration, without the HTTP server; the producers call ``Engine.accept``."""
    from openroute.persistence import MessageState, MessageStore, StoredMessage

    from openroute.config import load_config
    from openroute.definitions.message import InboundMessage
    from openroute.definitions.route import Route, RouteRegistry
    from openroute.engine import Engine
    from openroute.runtime.logs import AttemptFailureLog, configure_logging, log_transition
    from openroute.server import create_app, inbound_throttling

    config = load_config(None, {"database_url": url})
    configure_logging(args.log_level or config.log.level, config.log.format)  # as `openroute run`: INFO
    store = MessageStore(config.resolved_database_url())
    routes = RouteRegistry([Route("bench", "noop", [lambda exchange: None])])
    engine = Engine(store, routes, config.engine.settings(), interceptors=[AttemptFailureLog()],
                    external_calls=config.external_calls(store))
    engine.on_transition(log_transition)
    final = asyncio.Event()
    finals = 0

    async def on_final(message: StoredMessage) -> None:
        nonlocal finals
        finals += 1
        if finals == args.count:
            final.set()

    engine.on_final_state(on_final)  # before the node's own hooks: the OK's commit, not the confirmation's send
    inbound_auth, admin_auth = config.auth.build()
    app = create_app(engine, inbound_auth=inbound_auth, admin_auth=admin_auth, settings=config.inbound.settings(),
                     confirmation=config.confirmations.service(store, node_id=engine.node_id,
                                                               messaging=config.messaging_config()),
                     confirmation_interval=config.confirmations.interval.total_seconds(),
                     retention=config.retention.policy(), allowed_origins=config.admin.allowed_origins,
                     metrics_auth=config.admin.metrics_auth, alerts=config.alerts.evaluator(store, engine.node_id),
                     throttling=inbound_throttling(config.throttling_rules(), store))
    load = Load(args.count, args.senders)

    async def send(i: int) -> None:
        await engine.accept(InboundMessage("bench", "noop", PAYLOAD, "text/xml", f"b-{i}", "bench"))

    async with app.router.lifespan_context(app):
        from openroute.runtime import collector

        collector.tune_for_serving()  # as `openroute run` does once it serves
        await load.run(send, final.wait)
        with store.engine.connect() as connection:
            ok = connection.execute(sa.text("SELECT count(*) FROM message WHERE state = :ok"),
                                    {"ok": MessageState.OK.value}).scalar_one()
            transitions = connection.execute(sa.text("SELECT count(*) FROM message_transition")).scalar_one()
    store.dispose()
    if ok != args.count or transitions != 3 * args.count:
        raise SystemExit(f"openroute run is wrong: {ok} of {args.count} OK, {transitions} transition rows")
    return load.figures(concurrency=config.engine.concurrency)


async def run_pgqueuer(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """PgQueuer with asyncpg: producers on a pool, ``PgQueuer.run`` on a connection of its own."""
    import asyncpg
    from pgqueuer import PgQueuer, Queries
    from pgqueuer.core.logconfig import LogLevel, setup_fancy_logger
    from pgqueuer.models import Job

    setup_fancy_logger(LogLevel[args.log_level or "INFO"])  # as `pgq run`: INFO
    address = dsn(url)
    setup = await asyncpg.connect(address)
    installer = Queries.from_asyncpg_connection(setup)
    await installer.install()
    await installer.optimize_autovacuum()  # `pgq autovac`, the performance guide's checklist
    pool = await asyncpg.create_pool(address, min_size=args.pool, max_size=args.pool)
    producer = Queries.from_asyncpg_pool(pool)
    pgq = PgQueuer.from_asyncpg_connection(await asyncpg.connect(address))
    stepped = 0
    all_stepped = asyncio.Event()

    @pgq.entrypoint("noop", accepts_context=False)
    async def noop(job: Job) -> None:
        nonlocal stepped
        stepped += 1
        if stepped == args.count:
            all_stepped.set()

    consumer = asyncio.create_task(pgq.run(batch_size=args.pgqueuer_batch_size))
    load = Load(args.count, args.senders)
    payload = PAYLOAD.encode()

    async def send(i: int) -> None:
        await producer.enqueue("noop", payload)

    async def done() -> None:
        await all_stepped.wait()
        await until(lambda: _zero(setup, "SELECT count(*) FROM pgqueuer"))

    await asyncio.sleep(0.2)  # the manager is listening
    if consumer.done():
        consumer.result()
    await load.run(send, done)
    pgq.shutdown.set()
    await asyncio.wait_for(consumer, 60)
    logged = await setup.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    await pool.close()
    await setup.close()
    if logged != args.count:
        raise SystemExit(f"PgQueuer run is wrong: {logged} of {args.count} logged successful")
    return load.figures(batch_size=args.pgqueuer_batch_size)


async def _zero(connection: Any, query: str) -> bool:
    return bool(await connection.fetchval(query) == 0)


async def run_procrastinate(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """procrastinate with psycopg 3: producers on one App, the worker on another (as a worker process has its own)."""
    import procrastinate
    import psycopg
    from procrastinate.cli import configure_logging

    configure_logging(log_level=args.log_level)  # as `procrastinate worker`: INFO
    address = dsn(url)

    def app() -> procrastinate.App:
        return procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=address, min_size=args.pool, max_size=args.pool))

    producers, workers = app(), app()
    stepped = 0
    all_stepped = asyncio.Event()

    async def noop(payload: str, correlation: str) -> None:
        nonlocal stepped
        stepped += 1
        if stepped == args.count:
            all_stepped.set()

    task = producers.task(name="noop")(noop)
    workers.task(name="noop")(noop)
    load = Load(args.count, args.senders)
    async with producers.open_async(), workers.open_async():
        await producers.schema_manager.apply_schema_async()
        watch = await psycopg.AsyncConnection.connect(address, autocommit=True)
        worker = asyncio.create_task(workers.run_worker_async(
            concurrency=args.procrastinate_concurrency, install_signal_handlers=False))

        async def send(i: int) -> None:
            await task.defer_async(payload=PAYLOAD, correlation=f"b-{i}")

        async def succeeded() -> int:
            cursor = await watch.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
            row = await cursor.fetchone()
            return int(row[0]) if row else 0

        async def complete() -> bool:
            return await succeeded() == args.count

        async def done() -> None:
            await all_stepped.wait()
            await until(complete)

        await asyncio.sleep(0.2)  # the worker is listening
        if worker.done():
            worker.result()
        await load.run(send, done)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(worker, 60)
        finished = await succeeded()
        await watch.close()
    if finished != args.count:
        raise SystemExit(f"procrastinate run is wrong: {finished} of {args.count} succeeded")
    return load.figures(concurrency=args.procrastinate_concurrency)


RUNNERS = {"openroute": run_openroute, "pgqueuer": run_pgqueuer, "procrastinate": run_procrastinate}


def child(args: argparse.Namespace) -> None:
    """One run of ``args.child`` on the database ``args.url``; writes its figures as JSON to ``args.result``."""
    figures = run_on(args.loop, RUNNERS[args.child](args.url, args))
    Path(args.result).write_text(json.dumps(figures), encoding="utf-8")


def run_on(loop: str, coroutine: Coroutine[Any, Any, T]) -> T:
    """``coroutine``'s result, run on a new event loop of the kind ``loop`` (``uvloop`` or ``asyncio``)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def generator_ceiling(args: argparse.Namespace) -> float:
    """Hand-overs per second of :class:`Load` itself, with a call that only yields to the loop once."""
    load = Load(args.count, args.senders)

    async def measure() -> None:
        async def done() -> None:
            return None

        await load.run(lambda i: asyncio.sleep(0), done)

    run_on(args.loop, measure())
    return float(load.figures()["accepted"])


# -- the interleaved repetitions ------------------------------------------------------------------------------------
def one_run(system: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """A fresh database for ``system`` and a process running it there; its figures."""
    database = (fresh_database("postgres", "peers_openroute", admin_url=args.admin_url) if system == "openroute"
                else blank_database(f"peers_{system}", args.admin_url))
    log, result = folder / f"{system}.log", folder / f"{system}.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", system, "--result", str(result),
               "--count", str(args.count), "--senders", str(args.senders), "--pool", str(args.pool),
               "--loop", args.loop, "--pgqueuer-batch-size", str(args.pgqueuer_batch_size),
               "--procrastinate-concurrency", str(args.procrastinate_concurrency),
               *(["--log-level", args.log_level] if args.log_level else [])]
    if args.profile:  # py-spy's raw samples of the run's process (flame-graph input: one stack and its count a line)
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        samples = Path(args.profile) / f"{system}-{uuid.uuid4().hex[:6]}.txt"
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))  # a venv's, not on PATH
        command = [spy, "record", "--gil", "--idle", "-f", "raw", "-o", str(samples), "--", *command]
    with database as url, log.open("wb") as output:  # the process's log lines (stdout and stderr) go to a file
        done = subprocess.run([*command, "--url", url], stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
                              timeout=900, check=False)
    if done.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise SystemExit(f"{NAMES[system]} run failed (exit {done.returncode}):\n" + "\n".join(tail))
    return dict(json.loads(result.read_text(encoding="utf-8")))


def arguments() -> argparse.ArgumentParser:
    parser = common_arguments(__doc__ or "", count=5000, repeat=5, senders=64)
    parser.add_argument("--pool", type=int, default=10,
                        help="connections of each peer's producer pool (and of procrastinate's worker)")
    parser.add_argument("--pgqueuer-batch-size", type=int, default=10, help="PgQueuer's batch_size")
    parser.add_argument("--procrastinate-concurrency", type=int, default=64, help="the procrastinate worker's")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"),
                        default="uvloop" if importlib.util.find_spec("uvloop") else "asyncio")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="which of openroute, pgqueuer, procrastinate to run (default: all three)")
    parser.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="one log level for the three (default: each as its own command sets it, INFO)")
    parser.add_argument("--profile", metavar="FOLDER",
                        help="run each process under py-spy (record --gil --idle -f raw), its samples in FOLDER")
    parser.add_argument("--admin-url", default=admin_url(), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    if args.child:
        child(args)
        return
    systems = [system for system in SYSTEMS if system in args.systems.split(",")]
    missing = missing_peers(systems)
    if missing:
        print(f"peers_bench: {', '.join(missing)} not installed; install the peers with\n    {INSTALL}",
              file=sys.stderr)
        raise SystemExit(2)
    print(f"peers benchmark: {args.count} messages per run, {args.senders} concurrent senders, {args.repeat} "
          f"interleaved repetitions, {args.loop} loop, log level {args.log_level or 'INFO (each as its command)'}; "
          f"the peers' pools {args.pool} connections, PgQueuer batch_size {args.pgqueuer_batch_size}, "
          f"procrastinate concurrency {args.procrastinate_concurrency}", flush=True)
    print(f"the load generator alone (a hand-over that returns at once): {generator_ceiling(args):,.0f} msgs/s",
          flush=True)
    results: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
    with tempfile.TemporaryDirectory(prefix="openroute-peers-") as folder:
        for rep in range(args.repeat):
            shift = rep % len(systems)
            for system in systems[shift:] + systems[:shift]:
                run = one_run(system, args, Path(folder))
                results[system].append(run)
                print(f"  rep {rep + 1} {NAMES[system]:13} {run['completed']:7.0f} msgs/s completed | hand-over "
                      f"{run['accepted']:7.0f} msgs/s, p50 {run['p50']:6.1f} ms, p99 {run['p99']:6.1f} ms | peak RSS "
                      f"{run['rss']:4.0f} MB", flush=True)
    report(results)


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\n{'system':14} {'completed msgs/s':>22} {'hand-over p50 ms':>20} {'p99 ms':>20} {'peak RSS MB':>16}"
          "   (min / median / max)")
    for system, runs in results.items():
        print(f"{NAMES[system]:14} {spread([r['completed'] for r in runs]):>22} "
              f"{spread([r['p50'] for r in runs], 1):>20} {spread([r['p99'] for r in runs], 1):>20} "
              f"{spread([r['rss'] for r in runs]):>16}")
    if "openroute" not in results:
        return
    ours = [r["completed"] for r in results["openroute"]]
    for peer in ("pgqueuer", "procrastinate"):
        if peer not in results:
            continue
        ratios = [o / p["completed"] for o, p in zip(ours, results[peer], strict=True)]
        print(f"openroute / {NAMES[peer]} per repetition: {', '.join(f'{r:.2f}' for r in ratios)} "
              f"(min / median / max {spread(ratios, 2)})")
        if peer == "pgqueuer":
            met = "met" if min(ratios) >= GOAL else "NOT met"
            print(f"goal (issue #45): openroute / PgQueuer >= {GOAL} at the minimum: {min(ratios):.2f}, {met}")


if __name__ == "__main__":
    main()
