"""The delivery family's one discipline (persistence/delivery.py), run against both its kinds, confirmations and
outcome events, on SQLite and PostgreSQL: claim, renew, release, retry with back-off, order. What is particular to a
kind stays with its own tests (tests/confirmation, tests/channels/test_outbox*.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore
from openroute.persistence import confirmations as confirmation_sql
from openroute.persistence import outbox as outbox_sql
from openroute.persistence.delivery import Attempt, Claimed, DeliverySender, LeasedRows, Leases, backoff

from tests.confirmation.test_service import START, add_message

LEASE = timedelta(seconds=60)


def _confirmation_row(connection: sa.Connection, message_id: int) -> None:
    confirmation_sql.add_pending(connection, [confirmation_sql.pending_row(message_id, "CRM", "OK", START)])


def _outcome_event(connection: sa.Connection, message_id: int) -> None:
    outbox_sql.add_events(connection, [{"event_id": str(uuid.uuid4()), "channel": "events", "message_id": message_id,
                                        "payload": "{}", "created_at": START}])


@dataclass(frozen=True)
class Kind:
    """One kind of the family: its rows and how its final transaction writes one."""

    rows: LeasedRows[Any]
    write: Callable[[sa.Connection, int], None]


KINDS = {"confirmation": Kind(confirmation_sql.ConfirmationRows(), _confirmation_row),
         "outcome event": Kind(outbox_sql.OutboxRows(), _outcome_event)}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


def written(store: MessageStore, kind: Kind, count: int) -> list[int]:
    """``count`` final messages, each with its row written in a transaction of its own; their ids."""
    ids = [add_message(store, n) for n in range(count)]
    for message_id in ids:
        with store.begin() as connection:
            kind.write(connection, message_id)
    return ids


def node(store: MessageStore, kind: Kind, name: str) -> Leases[Any]:
    return Leases(store.engine, kind.rows, name)


def at(seconds: float) -> Any:
    return START + timedelta(seconds=seconds)


def test_a_row_is_claimed_by_one_node_until_its_lease_runs_out(store: MessageStore, kind: Kind) -> None:
    written(store, kind, 3)
    first, second = node(store, kind, "node-a"), node(store, kind, "node-b")
    assert len(first.claim(at(0), LEASE, 10).claims) == 3
    assert second.claim(at(1), LEASE, 10).claims == []  # leased: not due for another node
    assert first.claim(at(59), LEASE, 10).claims == []  # nor for the same one
    assert len(second.claim(at(61), LEASE, 10).claims) == 3  # the lease ran out: the claimant died


def test_a_renewed_lease_holds_and_a_lost_one_says_so(store: MessageStore, kind: Kind) -> None:
    written(store, kind, 1)
    first, second = node(store, kind, "node-a"), node(store, kind, "node-b")
    [claim] = first.claim(at(0), LEASE, 10).claims
    assert first.renew(claim, at(50), LEASE)  # held until 110 s
    assert second.claim(at(70), LEASE, 10).claims == []
    assert len(second.claim(at(111), LEASE, 10).claims) == 1
    assert not first.renew(claim, at(112), LEASE)  # another node holds it now


def test_a_restarted_node_releases_what_it_had_leased(store: MessageStore, kind: Kind) -> None:
    written(store, kind, 2)
    first, second = node(store, kind, "node-a"), node(store, kind, "node-b")
    assert len(first.claim(at(0), LEASE, 10).claims) == 2
    assert second.release(at(1), at(1)) == 0  # only its own
    assert first.release(at(1), at(1)) == 2
    assert len(second.claim(at(1), LEASE, 10).claims) == 2  # due at once, not after the lease


def test_a_failed_attempt_is_due_at_its_retry_time_and_a_sent_one_never_again(store: MessageStore, kind: Kind) -> None:
    written(store, kind, 2)
    first, second = node(store, kind, "node-a"), node(store, kind, "node-b")
    sent, failed = first.claim(at(0), LEASE, 10).claims
    assert first.settle(at(1), [(sent, None, None), (failed, "refused", at(1) + backoff(LEASE / 2, 0, LEASE))]) == [
        True, True]
    assert second.claim(at(30), LEASE, 10).claims == []
    [again] = second.claim(at(31), LEASE, 10).claims  # the failed one, after its back-off
    assert second.settle(at(32), [(again, None, None)]) == [True]
    assert first.claim(at(10_000), LEASE, 10).claims == []


def test_rows_are_claimed_oldest_first_a_batch_at_a_time(store: MessageStore, kind: Kind) -> None:
    ids = written(store, kind, 3)
    leases = node(store, kind, "node-a")
    batch = leases.claim(at(0), LEASE, 2)
    assert (batch.seen, len(batch.claims)) == (2, 2)
    rest = leases.claim(at(0), LEASE, 2, batch.last_id)
    assert (rest.seen, len(rest.claims)) == (1, 1)
    with store.engine.connect() as connection:
        leased = [row.message_id for row in connection.execute(
            sa.select(_table(kind).c.message_id).order_by(_table(kind).c.id))]
    assert leased == ids


def test_the_back_off_doubles_per_failure_up_to_its_longest() -> None:
    first, longest = timedelta(seconds=1), timedelta(seconds=10)
    assert [backoff(first, n, longest).total_seconds() for n in range(6)] == [1, 2, 4, 8, 10, 10]


async def test_the_sender_renews_the_lease_while_a_slow_send_runs(store: MessageStore, kind: Kind) -> None:
    """One attempt sent on its own (as the confirmations are): its lease outlives a send three leases long, and the
    row, sent, is not due again."""
    written(store, kind, 1)
    lease = timedelta(milliseconds=600)  # renewed every third of it: a loaded machine may stall the loop 200 ms
    sender = DeliverySender(node(store, kind, "node-a"), lambda _claim, now: now + LEASE, _real_now, lambda: lease)
    other = node(store, kind, "node-b")
    [claim] = sender.claim(_real_now(), 10).claims

    async def slow_send() -> str | None:
        for _ in range(3):
            await asyncio.sleep(lease.total_seconds())
            assert await asyncio.to_thread(other.claim, _real_now(), lease, 10) == Claimed([], 0, 0)
        return None

    assert await sender.attempt(claim, slow_send(), "the slow one") == (Attempt.SENT, None)
    assert other.claim(_real_now() + LEASE, lease, 10).claims == []


async def test_a_round_is_sent_together_and_settled_at_once(store: MessageStore, kind: Kind) -> None:
    """A round (as the outcome events are sent): every claim sent, then the sent ones settled and the failed ones
    due again at the kind's back-off, in one transaction."""
    written(store, kind, 2)
    clock = [at(0)]
    sender = DeliverySender(node(store, kind, "node-a"), lambda _claim, now: now + backoff(LEASE, 0, LEASE),
                            lambda: clock[0], lambda: LEASE)
    claims = sender.claim(at(0), 10).claims
    failing = claims[1]

    async def send(claim: Any) -> str | None:
        return "refused" if claim is failing else None

    clock[0] = at(1)
    assert await sender.round(claims, send) == [None, "refused"]
    assert sender.claim(at(60), 10).claims == []
    assert len(sender.claim(at(61), 10).claims) == 1


async def test_attempts_that_end_together_are_recorded_together_each_with_its_outcome(
    store: MessageStore, kind: Kind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts sent one by one (as the confirmations are) that end while a record is written share the next
    transaction; each still gets its own outcome, and a record failing for the group is written again one by one,
    so one row's failure stays its own."""
    written(store, kind, 6)
    leases = node(store, kind, "node-a")
    sender = DeliverySender(leases, lambda _claim, now: now + LEASE, lambda: at(1), lambda: LEASE)
    claims = sender.claim(at(0), 10).claims
    unlucky = claims[4]
    settle = leases.settle_in
    transactions: list[int] = []

    def counted(connection: sa.Connection, now: datetime, outcomes: Any) -> list[bool]:
        transactions.append(len(outcomes))
        if len(outcomes) > 1 and any(claim is unlucky for claim, _error, _retry in outcomes):
            raise sa.exc.OperationalError("UPDATE", {}, Exception("the group's record failed"))
        if any(claim is unlucky for claim, _error, _retry in outcomes):
            raise sa.exc.OperationalError("UPDATE", {}, Exception("this row's record failed"))
        return settle(connection, now, outcomes)

    monkeypatch.setattr(leases, "settle_in", counted)

    async def send(claim: Any) -> str | None:
        return "refused" if claim is claims[1] else None

    results = await asyncio.gather(*(sender.attempt(claim, send(claim), f"row {n}") for n, claim in enumerate(claims)),
                                   return_exceptions=True)
    assert [r if isinstance(r, tuple) else type(r) for r in results] == [
        (Attempt.SENT, None), (Attempt.RETRY, "refused"), (Attempt.SENT, None), (Attempt.SENT, None),
        sa.exc.OperationalError, (Attempt.SENT, None)]
    # the six ended in one turn of the loop: one record for all, failed for the group, then one by one
    assert transactions == [6, 1, 1, 1, 1, 1, 1]
    monkeypatch.setattr(leases, "settle_in", settle)
    # due again: the refused one at its retry time, the unlucky one once its lease ran out; the sent ones never
    assert len(sender.claim(at(61), 10).claims) == 2


def _real_now() -> datetime:
    return datetime.now(UTC)


def _table(kind: Kind) -> sa.Table:
    from openroute.persistence.models import confirmation_table, outbox_table

    return confirmation_table if isinstance(kind.rows, confirmation_sql.ConfirmationRows) else outbox_table
