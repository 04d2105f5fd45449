"""Breaker benchmark: what the circuit breaker check (and the call records) cost per message, interleaved.

    python benchmarks/breaker_bench.py [--count 5000] [--repeat 3] [--senders 64] [--database URL]

Three variants of one route whose single step is ``ext_call("activate", instant call)``, each on a fresh database
(created from ``--database``, a PostgreSQL server URL whose database is used as the admin connection), run in turn
per repetition so the machine's noise falls on all three:

* ``plain``: ``ext_call`` without a system (no breaker);
* ``breaker``: ``ext_call(..., system="HLR")`` through ``ExternalCalls`` (breaker CLOSED, records off): the check
  reads the shared row at most once per ``refresh`` (1 s) while the calls succeed;
* ``records``: the same with call records on (one INSERT per call).

The order of the three rotates from one repetition to the next.

It prints completed msgs/s (min / median / max) and the ratios breaker / plain and records / plain.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openroute.persistence import MessageState, MessageStore, StoredMessage

from benchmarks._common import POSTGRES_ADMIN_URL, arguments, concurrently, fresh_database
from openroute.definitions.message import InboundMessage
from openroute.definitions.route import Route, RouteRegistry
from openroute.engine import Engine, EngineSettings
from openroute.outbound import CallRecordSettings, ExternalCalls, ExternalSystem

VARIANTS = ("plain", "breaker", "records")


async def run(url: str, variant: str, count: int, senders: int) -> float:
    store = MessageStore(url)
    system = None if variant == "plain" else "HLR"

    async def activate(exchange: object) -> None:
        await exchange.ext_call("activate", lambda: {"ok": True}, system=system)  # type: ignore[attr-defined]

    calls = ExternalCalls(store, [ExternalSystem("HLR", records=CallRecordSettings(enabled=variant == "records"))])
    engine = Engine(store, RouteRegistry([Route("bench", "activate", [activate])]),
                    EngineSettings(node_id="bench", repoll_interval=None),
                    external_calls=None if variant == "plain" else calls)
    done = asyncio.Event()
    finished = 0

    async def on_final(_message: StoredMessage) -> None:
        nonlocal finished
        finished += 1
        if finished == count:
            done.set()

    engine.on_final_state(on_final)
    await engine.start()

    async def send(i: int) -> None:
        await engine.accept(InboundMessage("bench", "activate", "{}", "application/json", f"b-{i}", "bench"))

    started = time.perf_counter()
    await concurrently(count, senders, send)
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    await engine.stop()
    ok = store.count_by_state().get(MessageState.OK, 0)
    store.dispose()
    if ok != count:
        raise SystemExit(f"{variant}: {ok} of {count} OK")
    return count / elapsed


def main() -> None:
    parser = arguments(__doc__, count=5000, senders=64)
    parser.add_argument("--database", default=POSTGRES_ADMIN_URL)
    args = parser.parse_args()
    results: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    ratios: dict[str, list[float]] = {"breaker": [], "records": []}
    for repetition in range(args.repeat):
        this: dict[str, float] = {}
        # the order rotates, so the noise of a run's place in the round (first after a DROP DATABASE, ...) falls
        # on every variant
        for variant in VARIANTS[repetition % 3:] + VARIANTS[:repetition % 3]:
            with fresh_database("postgres", "breaker_bench", admin_url=args.database) as url:
                this[variant] = asyncio.run(run(url, variant, args.count, args.senders))
            results[variant].append(this[variant])
        for variant in ("breaker", "records"):
            ratios[variant].append(this[variant] / this["plain"])
        print(f"repetition {repetition + 1}: " + ", ".join(f"{v} {this[v]:,.0f} msgs/s" for v in VARIANTS))
    for variant in VARIANTS:
        values = results[variant]
        print(f"{variant:8s} completed msgs/s min / median / max: "
              f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}")
    for variant, values in ratios.items():
        print(f"{variant} / plain: {min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}")


if __name__ == "__main__":
    main()
