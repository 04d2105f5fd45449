"""Small stores for the Spark tests, each message driven to its state through the state machine.

Every state change goes through :mod:`openroute.engine.states`, so the stores have consistent ``message_transition``
rows, exactly as the engine would leave them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from openroute.persistence import MessageState, MessageStore, NewMessage, StoredMessage

from openroute.engine import states

S = MessageState
NOW = datetime(2024, 6, 10, 12, 0, tzinfo=UTC)


def drive(
    store: MessageStore,
    correlation_id: str,
    path: Sequence[MessageState],
    *,
    received: datetime,
    service: str = "crm",
    operation: str = "setCustomer",
    source_system: str = "CRM",
    entity: tuple[str, str] | None = None,
    parent_id: int | None = None,
    error: tuple[str, str] | None = None,
    business_errors: list[dict[str, Any]] | None = None,
) -> StoredMessage:
    """Store one message received at ``received`` and move it along ``path`` (after NEW), a second a step."""
    new = NewMessage(service, operation, "{}", "application/json", correlation_id, source_system, received,
                     entity_type=entity[0] if entity else None, object_id=entity[1] if entity else None,
                     parent_id=parent_id)
    message = store.insert_message(new, node_id="gen").message
    at = received
    for target in path:
        at += timedelta(seconds=1)
        if target is S.PROCESSING:
            [message] = states.claim(store, [message], "gen", at)
            continue
        changes: dict[str, Any] = {}
        if target in (S.FAILED, S.PARTLY_FAILED) and error is not None:
            changes.update(last_error_code=error[0], last_error_text=error[1],
                           failed_count=message.failed_count + 1)
        if business_errors is not None and target is S.FAILED:
            changes["business_errors"] = business_errors
        message = states.transition(store, message, target, at, changes)
    return message


FAIL = (S.PROCESSING, S.FAILED)
OK = (S.PROCESSING, S.OK)


def reprocess_store(url: str) -> dict[str, int]:
    """A store covering every reprocess decision; returns the message ids by name.

    - ``f_obsolete``: FAILED customer C-1, a newer message of C-1 ended OK -> SKIP_OBSOLETE
    - ``f_restart``: FAILED customer C-3 whose OK message is older -> RESTART
    - ``f_plain``: FAILED, no entity -> RESTART (error text "MNO down", code MNO_DOWN)
    - ``f_business``: FAILED billing/charge with business error BLOCKED -> RESTART
    - ``parent`` FAILED with ``child`` FAILED -> parent RESTART, child LEAVE (parent final)
    - ``f_old``: FAILED 10 days before the others; ``f_other_source``: FAILED from source system SHOP
    - ``cancelled``: CANCEL (not selected by default); ``ok_*``: OK messages; ``waiting``: PARTLY_FAILED
    """
    store = MessageStore(url)
    store.create_schema()
    t = NOW - timedelta(hours=5)
    ids: dict[str, int] = {}
    down = ("MNO_DOWN", "MNO down: connection refused")
    ids["f_obsolete"] = drive(store, "m1", FAIL, received=t, entity=("customer", "C-1"), error=down).id
    ids["ok_newer"] = drive(store, "m2", OK, received=t + timedelta(minutes=1), entity=("customer", "C-1")).id
    ids["ok_older"] = drive(store, "m3", OK, received=t + timedelta(minutes=2), entity=("customer", "C-3")).id
    ids["f_restart"] = drive(store, "m4", FAIL, received=t + timedelta(minutes=3), entity=("customer", "C-3"),
                             error=down).id
    ids["f_plain"] = drive(store, "m5", FAIL, received=t + timedelta(minutes=4), error=down).id
    ids["f_business"] = drive(store, "m6", FAIL, received=t + timedelta(minutes=5), service="billing",
                              operation="charge", error=("BUSINESS", "customer blocked"),
                              business_errors=[{"code": "BLOCKED", "text": "customer blocked"}]).id
    parent = drive(store, "o1", (S.PROCESSING, S.WAITING_FOR_CHILDREN), received=t + timedelta(minutes=6),
                   service="shop", operation="createOrder", source_system="SHOP")
    ids["parent"] = parent.id
    ids["child"] = drive(store, "o1:1", FAIL, received=t + timedelta(minutes=6, seconds=1), service="shop",
                         operation="createOrderLine", source_system="SHOP", parent_id=parent.id,
                         error=("OUT_OF_STOCK", "no stock")).id
    states.transition(store, store.get(parent.id), S.FAILED, t + timedelta(minutes=7),
                      {"last_error_code": "CHILD_FAILED"})
    ids["f_old"] = drive(store, "m7", FAIL, received=t - timedelta(days=10), error=down).id
    ids["f_other_source"] = drive(store, "m8", FAIL, received=t + timedelta(minutes=8), source_system="SHOP",
                                  error=("TIMEOUT", "read timed out")).id
    ids["cancelled"] = drive(store, "m9", (S.CANCEL,), received=t + timedelta(minutes=9)).id
    ids["waiting"] = drive(store, "m10", (S.PROCESSING, S.PARTLY_FAILED), received=t + timedelta(minutes=10),
                           error=down).id
    store.dispose()
    return ids


def many_failed(url: str, count: int) -> list[int]:
    """A store of ``count`` FAILED messages (for applying in batches)."""
    store = MessageStore(url)
    store.create_schema()
    t = NOW - timedelta(hours=1)
    ids = [drive(store, f"bulk-{n}", FAIL, received=t + timedelta(seconds=n), error=("DOWN", "down")).id
           for n in range(count)]
    store.dispose()
    return ids
