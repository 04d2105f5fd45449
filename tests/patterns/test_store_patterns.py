"""The store's queries behind the patterns, on each real database: entity calls, obsolete, funnel order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from openroute.persistence import MessageState, MessageStore

from tests.patterns.messages import insert_message, set_state

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(minutes=5)


def _insert(store: MessageStore, key: str, at: datetime = T0, **extra: object) -> int:
    return insert_message(store, key, at=at, **extra)


def test_an_entity_call_is_held_taken_over_when_stale_and_then_reused(store: MessageStore) -> None:
    begin = store.calls.begin_entity
    assert begin("customer", "C-1", "mno", 1, T0, T0 - LEASE) == ("RUN", None)
    assert begin("customer", "C-1", "mno", 2, T0, T0 - LEASE) == ("BUSY", None)  # message 1 is calling now
    assert begin("customer", "C-1", "mno", 1, T0, T0 - LEASE) == ("RUN", None)  # its own next attempt goes on
    later = T0 + LEASE + timedelta(seconds=1)
    assert begin("customer", "C-1", "mno", 2, later, later - LEASE) == ("RUN", None)  # holder past the lease
    store.calls.finish_entity("customer", "C-1", "mno", 1, True, later, result={"late": True})  # no longer its call
    assert store.calls.of_entity("customer", "C-1")[0]["status"] == "IN_PROGRESS"
    store.calls.finish_entity("customer", "C-1", "mno", 2, False, later, error="MNO down")
    assert begin("customer", "C-1", "mno", 3, later, later - LEASE) == ("RUN", None)  # a failure is tried again
    store.calls.finish_entity("customer", "C-1", "mno", 3, True, later, result={"sim": 7})
    assert begin("customer", "C-1", "mno", 4, later, later - LEASE) == ("OK", {"sim": 7})
    [record] = store.calls.of_entity("customer", "C-1")
    assert (record["status"], record["attempts"], record["owner_message_id"]) == ("OK", 4, 3)
    # another key, another object id or another entity type is another call
    assert begin("customer", "C-1", "billing", 4, later, later - LEASE) == ("RUN", None)
    assert begin("customer", "C-2", "mno", 4, later, later - LEASE) == ("RUN", None)
    assert begin("contract", "C-1", "mno", 4, later, later - LEASE) == ("RUN", None)


def test_newer_ok_is_found_across_operations_only_for_the_same_entity(store: MessageStore) -> None:
    old = _insert(store, "old", object_id="C-1", entity_type="customer")
    newer = _insert(store, "newer", T0 + timedelta(seconds=1), object_id="C-1", entity_type="customer")
    other_type = _insert(store, "other", T0 + timedelta(seconds=2), object_id="C-1", entity_type="contract")
    no_type = _insert(store, "no-type", object_id="C-1")
    for message_id in (newer, other_type, no_type):
        set_state(store, message_id, MessageState.OK)
    get = store.get
    assert store.newer_ok_exists(get(old))  # type: ignore[arg-type]
    assert not store.newer_ok_exists(get(newer))  # type: ignore[arg-type]  # only an older one and another type
    assert not store.newer_ok_exists(get(no_type))  # type: ignore[arg-type]  # no entity type: never obsolete
    set_state(store, newer, MessageState.FAILED)
    assert not store.newer_ok_exists(get(old))  # type: ignore[arg-type]  # a newer one that did not end OK


def test_the_oldest_unfinished_message_of_a_funnel_holds_the_newer_ones(store: MessageStore) -> None:
    first = _insert(store, "1", funnel_value="F")
    second = _insert(store, "2", T0 + timedelta(seconds=1), funnel_value="F")
    third = _insert(store, "3", T0 + timedelta(seconds=2), funnel_value="F")
    _insert(store, "other", funnel_value="G")
    get = store.get
    assert store.funnels.older_unfinished(get(first)) is None  # type: ignore[arg-type]
    assert store.funnels.older_unfinished(get(third)) == first  # type: ignore[arg-type]
    set_state(store, first, MessageState.OK)
    assert store.funnels.older_unfinished(get(third)) == second  # type: ignore[arg-type]
    set_state(store, second, MessageState.CANCEL)
    assert store.funnels.older_unfinished(get(third)) is None  # type: ignore[arg-type]
