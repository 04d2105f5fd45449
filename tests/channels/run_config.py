"""The ``openroute.toml`` and the database of the tests (and benchmarks) that start ``openroute run`` or a node on a
channel-fed route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openroute.persistence import MessageStore


def write_run_config(folder: Path, database_url: str, broker: str, queue: str, *, events: str | None = None,
                     **engine: Any) -> Path:
    """``folder/openroute.toml``: the route of ``tests.channels.channel_app`` fed by ``queue`` (source system CRM),
    its final states published to the queue ``events`` when given, ``engine`` settings in ``[engine]``."""
    lines = [f'database_url = "{database_url}"', 'routes = "tests.channels.channel_app:app"', ""]
    if engine:
        lines.append("[engine]")
        lines += [f"{name} = {value!r}" if isinstance(value, str) else f"{name} = {value}"
                  for name, value in engine.items()]
        lines.append("")
    lines += ["[openroute.messaging.connector.amqp]", f'url = "{broker}"', "",
              "[openroute.messaging.incoming.crm-in]", 'connector = "amqp"', f'queue = "{queue}"',
              'source-system = "CRM"', ""]
    if events is not None:
        lines += ["[openroute.messaging.outgoing.crm-events]", 'connector = "amqp"', f'queue = "{events}"',
                  'outcome-events = "final"', ""]
    path = folder / "openroute.toml"
    path.write_text("\n".join(lines))
    return path


def with_schema(database_url: str) -> str:
    """``database_url`` once the store's schema is in it (the engine disposed again)."""
    store = MessageStore(database_url)
    store.create_schema()
    store.dispose()
    return database_url
