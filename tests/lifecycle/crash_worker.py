"""A worker process for the crash test: ``python -m tests.lifecycle.crash_worker URL COUNT NODE``.

It accepts COUNT messages (correlation ids ``c-0`` ... ; a repeat is answered as a duplicate, like a
source system re-sending what was never acknowledged) and processes them with a route whose external
effect is a row in table ``effect``, written exactly once through ``call_once_in_store``. It exits 0
once every message is in a final state. The test kills it with SIGKILL half way and starts it again.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

import sqlalchemy as sa
from openroute.persistence import FINAL_STATES, MessageStore, message_table

from openroute import Exchange, Route, RouteRegistry
from openroute.definitions.message import InboundMessage
from openroute.engine import Engine, EngineSettings

effect_table = sa.table("effect", sa.column("message_id", sa.Integer))


async def apply_effect(exchange: Exchange) -> None:
    message_id = exchange.message.id
    await exchange.call_once_in_store(
        "effect", lambda connection: connection.execute(sa.insert(effect_table).values(message_id=message_id))
    )
    await asyncio.sleep(0.002)  # work after the effect, so kills land between effect and outcome too


async def main(url: str, count: int, node: str) -> None:
    store = MessageStore(url)
    routes = RouteRegistry([Route("crash", "effect", [apply_effect])])
    settings = EngineSettings(node_id=node, concurrency=8, queue_size=64, repoll_interval=None)
    engine = Engine(store, routes, settings)
    await engine.start()
    for start in range(0, count, 50):
        await asyncio.gather(*(
            engine.accept(InboundMessage("crash", "effect", f"#{i}", "text/plain", f"c-{i}", "crash-test"))
            for i in range(start, min(start + 50, count))
        ))
    not_final = sa.select(sa.func.count()).where(message_table.c.state.not_in(list(FINAL_STATES)))
    async with asyncio.timeout(120):
        while True:
            await engine.wait_idle(60)
            with store.begin() as connection:
                if connection.execute(not_final).scalar() == 0:
                    break
            await asyncio.sleep(0.05)
            await engine.repoll_once(new_cutoff=engine.clock.now() - timedelta(seconds=0))
    await engine.stop()
    store.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
