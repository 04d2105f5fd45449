"""Store outages (``persistence/outage.py``): what counts as the store being unreachable, a loop's back-off up to
its cap, and one WARNING when a loop finds the store away, one INFO when it is back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
import pytest
import sqlalchemy as sa
from openroute.persistence.outage import MAX_BACKOFF, StoreOutage, is_store_unreachable, run_passes


def _raise(error: Exception) -> Callable[[], None]:
    def fail() -> None:
        raise error
    return fail


def _unreachable() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))


def test_a_loop_backs_off_while_the_store_is_away_up_to_the_cap() -> None:
    outage = StoreOutage.of_loop("retention job")
    assert outage.delay(0.5) == 0.5
    waits = []
    for _ in range(12):
        outage.failed(_unreachable())
        waits.append(outage.delay(0.5))
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0]
    assert waits[-1] == MAX_BACKOFF
    assert StoreOutage().delay(3600) == 3600  # an interval longer than the cap is kept
    outage.succeeded()
    assert outage.delay(0.5) == 0.5


def test_a_drivers_own_connection_error_means_unreachable() -> None:
    assert is_store_unreachable(psycopg.OperationalError("connection failed: server closed the connection"))
    assert is_store_unreachable(psycopg.InterfaceError("the connection is closed"))
    assert not is_store_unreachable(psycopg.ProgrammingError("syntax error"))
    assert not is_store_unreachable(ValueError("connection refused"))


async def test_run_passes_logs_one_warning_one_info_and_keeps_running(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    outage = StoreOutage.of_loop("retention job")
    results: list[Callable[[], None]] = [_raise(_unreachable())] * 3 + [lambda: None, _raise(KeyError("bug"))]
    stop = asyncio.Event()
    passes = 0

    async def one_pass() -> None:
        nonlocal passes
        passes += 1
        if passes == len(results):
            stop.set()
        results[passes - 1]()

    await run_passes(one_pass, 0.001, stop, outage, "retention run failed", logging.getLogger("openroute.test"))
    lines = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert [(level, trace) for level, _, trace in lines] == [("WARNING", False), ("INFO", False), ("ERROR", True)]
    assert lines[0][1] == ("message store (retention job) unreachable: ConnectionRefusedError: connection refused; "
                           "the retention job backs off until it is back")
    assert lines[1][1].startswith("message store (retention job) reachable again after")
    assert lines[2][1] == "retention run failed"
    assert outage.outages == 1
