"""The full-size check of persist-then-acknowledge on a channel-fed route (issue 27): ``--count`` messages
(default 1,000) in a RabbitMQ queue, ``openroute run`` SIGKILLed ``--kills`` times (default 4) during the load and
restarted; after each kill every message the broker no longer holds must be in the store exactly once, and at the
end all of them, once; every message's final state must reach the events queue (outcome events through the outbox),
a second time only for an event in flight at a kill and then with the same event id. The in-suite version is
tests/channels/test_channel_kill.py (200 messages, one kill).

    python benchmarks/channel_kill.py [--count 1000] [--kills 4] [--database-url URL] [--amqp-url URL]

Prints each kill's figures (rows stored, messages left in the queue, events in flight) and the time to drain; exits 1
on a loss, a double row, a missing event or a duplicate event that was not in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from tests.channels.amqp_helpers import delete, publish, ready, unique  # noqa: E402
from tests.channels.run_config import with_schema, write_run_config  # noqa: E402
from tests.channels.test_channel_kill import (  # noqa: E402
    leased_events,
    stored,
    wait_events,
    wait_rows,
)
from tests.inbound.test_cli_run import Server, _environment  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--database-url", default=None, help="default: a SQLite file in a temporary folder")
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="openroute-kill-"))
    url = with_schema(args.database_url or f"sqlite:///{folder / 'openroute.db'}")
    queue, events = unique("kill-bench"), unique("kill-bench-events")
    config = write_run_config(folder, url, args.amqp_url, queue, events=events, node_id="kill-bench-node")
    in_flight: set[str] = set()
    ids = [f"m-{i}" for i in range(args.count)]
    failures = 0
    try:
        asyncio.run(publish(args.amqp_url, queue, [({"customer": {"id": f"C{i}"}}, m) for i, m in enumerate(ids)]))
        for kill in range(1, args.kills + 1):
            server = Server(["--config", str(config)], ROOT, _environment())
            server.wait_for("serving")
            wait_rows(url, args.count * kill // (args.kills + 1), timeout=300)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(30)
            leased = leased_events(url)
            in_flight |= leased
            left = asyncio.run(ready(args.amqp_url, queue))
            rows = stored(url)
            ok = len(rows) == len(set(rows)) and len(rows) >= args.count - left
            failures += not ok
            print(f"kill {kill}: {len(rows)} rows ({len(rows) - len(set(rows))} doubled), {left} left in the queue,"
                  f" {args.count - left} gone from it, {len(leased)} events in flight: "
                  f"{'ok' if ok else 'LOST OR DOUBLED'}")
        started = time.perf_counter()
        server = Server(["--config", str(config)], ROOT, _environment())
        server.wait_for("serving")
        wait_rows(url, args.count, timeout=600)
        received = wait_events(args.amqp_url, events, args.count, timeout=600)
        server.stop()
        rows = stored(url)
        left = asyncio.run(ready(args.amqp_url, queue))
        ok = sorted(rows) == sorted(ids) and left == 0
        failures += not ok
        print(f"drained in {time.perf_counter() - started:.1f} s: {len(rows)} rows, {len(set(rows))} distinct, "
              f"{left} left in the queue: {'ok' if ok else 'LOST OR DOUBLED'}")
        ids_of: dict[str, set[str]] = {}
        for event in received:
            ids_of.setdefault(str(event["correlationId"]), set()).add(str(event["eventId"]))
        twice = {e for e, n in Counter(str(event["eventId"]) for event in received).items() if n > 1}
        ok = sorted(ids_of) == sorted(ids) and all(len(v) == 1 for v in ids_of.values()) and twice <= in_flight
        failures += not ok
        print(f"events: {len(received)} received for {len(ids_of)} messages, {len(twice)} published twice (all in "
              f"flight at a kill: {twice <= in_flight}), one event id per message: "
              f"{all(len(v) == 1 for v in ids_of.values())}: {'ok' if ok else 'MISSING OR WRONG'}")
    finally:
        asyncio.run(delete(args.amqp_url, queue, events))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
