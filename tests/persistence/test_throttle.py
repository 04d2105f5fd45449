"""The shared counters of the throttling rules (``persistence/throttle.py``, ``ThrottleCounters``): a window admits
the first requests up to its limit, whichever connection counts them, as rows of ``throttle_counter`` on each real
database."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from openroute.persistence import MessageStore, ThrottleCounters, throttle_counter_table

from tests.persistence.conftest import rows


def test_requests_counted_together_admit_the_first_ones_up_to_the_limit(store: MessageStore) -> None:
    counters = ThrottleCounters(store)
    window, later = 1_800_000_000_000, 1_800_000_060_000
    assert counters.take_many([("CRM", "create", window, 5)] * 3) == [1, 2, 3]
    batch = [("CRM", "create", window, 5), ("ERP", "create", window, 5), ("CRM", "create", window, 5),
             ("CRM", "create", window, 5), ("CRM", "create", window, 5)]
    assert counters.take_many(batch) == [4, 1, 5, None, None]  # the window fills in order; ERP counts apart
    assert counters.take_many([("CRM", "create", window, 5)]) == [None]
    assert counters.count("CRM", "create", window) == 5  # the refused ones were not counted
    # more than the limit at once in a new window: the first ``limit`` pass, the earlier window's row goes
    assert counters.take_many([("CRM", "create", later, 5)] * 7) == [1, 2, 3, 4, 5, None, None]
    assert counters.count("CRM", "create", window) == 0
    assert counters.count("ERP", "create", window) == 1  # another operation's rows stay
    assert counters.take("ERP", "create", later, 1) == 1


def test_concurrent_batches_admit_the_limit_exactly(store: MessageStore) -> None:
    """Batches counted at once on many connections (PostgreSQL's row lock, SQLite's write lock): each count is
    handed out once, and together they admit the limit, whichever batch meets the full window."""
    counters = ThrottleCounters(store)
    window, limit = 1_800_000_000_000, 50
    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda size: counters.take_many([("CRM", "create", window, limit)] * size),
                                [3, 7, 1, 9, 4, 12, 6, 2, 8, 5, 10, 3]))  # 70 requests
    admitted = [count for batch in batches for count in batch if count is not None]
    assert sorted(admitted) == list(range(1, limit + 1))
    assert counters.count("CRM", "create", window) == limit


def test_each_system_operation_and_window_is_one_row_and_a_new_window_drops_the_older_ones(
    store: MessageStore,
) -> None:
    counters = ThrottleCounters(store)
    window, later = 1_800_000_000_000, 1_800_000_060_000
    assert counters.reserve_many([("CRM", "create", window, 10, 4), ("CRM", "cancel", window, 10, 20),
                                  ("ERP", "create", window, 10, 1)]) == [4, 10, 1]
    table = throttle_counter_table
    order = (table.c.source_system, table.c.operation, table.c.window_start)
    assert rows(store, table, *order) == [
        {"source_system": "CRM", "operation": "cancel", "window_start": window, "count": 10},
        {"source_system": "CRM", "operation": "create", "window_start": window, "count": 4},
        {"source_system": "ERP", "operation": "create", "window_start": window, "count": 1}]
    assert counters.reserve_many([("CRM", "create", window, 10, 9)]) == [6]  # what was left of the limit
    assert counters.reserve_many([("CRM", "create", later, 10, 2)]) == [2]
    assert [(row["source_system"], row["operation"], row["window_start"], row["count"])
            for row in rows(store, table, *order)] == [
        ("CRM", "cancel", window, 10), ("CRM", "create", later, 2), ("ERP", "create", window, 1)]
