"""Per-error retry policies (``.on_error(...)``) on a real engine and store: each error the route names follows its own
policy, the others the route's ``.retry(...)``, and the store holds the states, counts and due times that say so."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from openroute.persistence import MessageState

from openroute import BusinessError, Exchange, RetryPolicy, TechnicalError, route
from openroute.dsl import Application

S = MessageState
ROUTE_RETRY = RetryPolicy(max_attempts=2, interval=timedelta(minutes=1), backoff=1.0)
TIMEOUT_RETRY = RetryPolicy(max_attempts=4, interval=timedelta(seconds=10), backoff=1.0)
UNAVAILABLE_RETRY = RetryPolicy(max_attempts=3, interval=timedelta(minutes=10), backoff=1.0,
                                max_interval=timedelta(minutes=10))


class AccountClosed(Exception):
    """A business answer a remote gives as an exception of the client library."""


ERRORS: dict[str, BaseException] = {
    "timeout": TechnicalError("no answer in 5 s", code="TIMEOUT"),
    "unavailable": TechnicalError("HTTP 503", code="HTTP_503"),
    "gone": TechnicalError("HTTP 404", code="HTTP_404"),
    "closed": AccountClosed("account A-1 is closed"),
    "locked": BusinessError("HTTP_423", "the account is locked"),
    "other": TechnicalError("something else", code="DOWN"),
}


def charge_app() -> Application:
    async def charge(exchange: Exchange) -> Any:
        raise ERRORS[json.loads(exchange.payload)["fail"]]

    return Application(
        route("billing", "charge").json()
        .retry(ROUTE_RETRY)
        .on_error("TIMEOUT", retry=TIMEOUT_RETRY)
        .on_error("HTTP_5*", retry=UNAVAILABLE_RETRY)
        .on_error("HTTP_404", retry=False)
        .on_error(AccountClosed, fail=True)
        .on_error("HTTP_423", retry=True)
        .process(charge)
    )


async def test_each_named_error_follows_its_own_policy_in_the_store(database_url: str, route_test_kit: Any) -> None:
    kit = await route_test_kit(charge_app(), database_url=database_url)
    sent = {name: (await kit.send_json("billing", "charge", {"fail": name})).message_id for name in ERRORS}
    await kit.settle()
    start = kit.clock.now()

    timeout = kit.assert_state(sent["timeout"], S.PARTLY_FAILED)
    assert (timeout.failed_count, timeout.next_attempt_at) == (1, start + timedelta(seconds=10))
    unavailable = kit.assert_state(sent["unavailable"], S.PARTLY_FAILED)
    assert unavailable.next_attempt_at == start + timedelta(minutes=10)
    gone = kit.assert_state(sent["gone"], S.FAILED)  # never retried: the first attempt is the last
    assert (gone.failed_count, gone.last_error_code, gone.business_errors) == (1, "HTTP_404", [])
    closed = kit.assert_state(sent["closed"], S.FAILED)  # at once, as a business error
    assert (closed.failed_count, closed.business_errors) == (0, [{"code": "AccountClosed",
                                                                  "text": "account A-1 is closed"}])
    locked = kit.assert_state(sent["locked"], S.PARTLY_FAILED)  # a business answer, retried per the route
    assert (locked.last_error_code, locked.next_attempt_at) == ("HTTP_423", start + timedelta(minutes=1))
    kit.assert_state(sent["other"], S.PARTLY_FAILED)

    await kit.advance(minutes=1)  # the route's policy: 2 attempts, so the errors it governs are FAILED now
    kit.assert_state(sent["other"], S.FAILED)
    assert kit.assert_state(sent["locked"], S.FAILED).business_errors == []
    assert kit.assert_state(sent["timeout"], S.PARTLY_FAILED).failed_count == 2  # due every 10 s: ran once more
    await kit.advance(seconds=10)
    await kit.advance(seconds=10)
    assert kit.assert_state(sent["timeout"], S.FAILED).failed_count == 4  # its own 4 attempts, past the route's 2
    await kit.advance(minutes=10)
    assert kit.assert_state(sent["unavailable"], S.PARTLY_FAILED).failed_count == 2
    await kit.advance(minutes=10)
    assert kit.assert_state(sent["unavailable"], S.FAILED).failed_count == 3
