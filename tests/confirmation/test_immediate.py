"""The immediate sends after a final commit, a group at a time (confirmation/immediate.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from openroute.confirmation import ConfirmationService, DelegateConfirmationCallback
from openroute.persistence import MessageState, MessageStore, confirmation_table
from openroute.persistence import confirmations as table

from tests.confirmation.receiver import Receiver
from tests.confirmation.test_service import FakeClock, accepted_ids, add_message, clock, soap

__all__ = ["clock", "soap"]  # fixtures


def _finals(store: MessageStore, service: ConfirmationService, count: int, first: int = 1) -> list[int]:
    """``count`` messages made OK with their rows written in their final transaction, as the engine does."""
    ids = [add_message(store, n) for n in range(first, first + count)]
    with store.begin() as connection:
        for message_id in ids:
            service.on_final_state_tx(store.get(message_id, connection), connection)
    return ids


def _counting_claims(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the group claims made from now on."""
    sizes: list[int] = []
    claim = table.claim_of_messages

    def counted(connection: sa.Connection, message_ids: list[int], *args: object) -> list[sa.Row[object]]:
        sizes.append(len(message_ids))
        return claim(connection, message_ids, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(table, "claim_of_messages", counted)
    return sizes


async def test_messages_made_final_together_are_claimed_in_one_transaction_and_each_sent_once(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    ids = _finals(store, service, 12)
    sizes = _counting_claims(monkeypatch)

    await asyncio.gather(*(service.on_final_state(store.get(message_id)) for message_id in ids))

    assert accepted_ids(receiver) == sorted(str(i) for i in ids)
    assert sizes == [12]  # the five transactions per message were one claim for the group
    for message_id in ids:
        row = await service.get(message_id)
        assert row is not None and (row.status, row.attempts) == ("SENT", 1)
    await service.on_final_state(store.get(ids[0]))  # called again: nothing is due, nothing sent twice
    assert len(receiver.snapshot()) == 12


async def test_a_message_without_a_row_gets_one_and_is_sent(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    with_row = _finals(store, service, 1)[0]
    without_row = add_message(store, 2)  # its final transaction ran without the service's hook

    await asyncio.gather(service.on_final_state(store.get(with_row)), service.on_final_state(store.get(without_row)))

    assert accepted_ids(receiver) == sorted([str(with_row), str(without_row)])
    assert (await service.get(without_row)).status == "SENT"  # type: ignore[union-attr]


async def test_a_row_another_node_claimed_first_is_left_to_it(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
) -> None:
    service = ConfirmationService(store, soap, clock=clock, node_id="here")
    mine, theirs = _finals(store, service, 2)
    with store.begin() as connection:  # another node's pass claims one of them first
        claimed = table.claim_of_messages(connection, [theirs], clock.now(), clock.now() + service.policy.claim_timeout,
                                          "elsewhere")
    assert [row.message_id for row in claimed] == [theirs]

    await asyncio.gather(service.on_final_state(store.get(mine)), service.on_final_state(store.get(theirs)))

    assert accepted_ids(receiver) == [str(mine)]
    with store.engine.connect() as connection:
        row = connection.execute(sa.select(confirmation_table.c.status, confirmation_table.c.claimed_by)
                                 .where(confirmation_table.c.message_id == theirs)).one()
    assert (row.status, row.claimed_by) == ("PENDING", "elsewhere")


async def test_a_failed_group_claim_fails_no_message_and_leaves_the_rows_pending(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    ids = _finals(store, service, 3)

    def unreachable(*_args: object) -> list[sa.Row[object]]:
        raise sa.exc.OperationalError("UPDATE confirmation", {}, ConnectionRefusedError("database is down"))

    monkeypatch.setattr(table, "claim_of_messages", unreachable)
    with caplog.at_level(logging.WARNING):
        await asyncio.gather(*(service.on_final_state(store.get(message_id)) for message_id in ids))  # never raises

    assert receiver.snapshot() == []
    for message_id in ids:
        assert (await service.get(message_id)).status == "PENDING"  # type: ignore[union-attr]
    monkeypatch.undo()
    report = await service.process_due()  # the service's own pass sends them once the store is back
    assert report.sent == 3
    assert accepted_ids(receiver) == sorted(str(i) for i in ids)


async def test_a_message_of_an_unconfirmed_system_costs_no_transaction(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    other = add_message(store, 1, MessageState.OK, source_system="BILLING")  # soap confirms CRM only
    sizes = _counting_claims(monkeypatch)

    await service.on_final_state(store.get(other))

    assert sizes == []
    assert await service.get(other) is None
    assert receiver.snapshot() == []


class _Writer:
    """The engine's group-commit writer as a node gives it to its confirmations (``Engine.transact``), counting the
    operations it runs."""

    def __init__(self, store: MessageStore) -> None:
        from openroute.engine._writer import GroupCommitWriter

        self.writer = GroupCommitWriter(store.engine)
        self.operations = 0

    async def transact(self, work: Any, /) -> Any:
        self.operations += 1
        return await self.writer.submit(work)

    def close(self) -> None:
        self.writer.close()


async def test_through_the_group_commit_a_group_is_claimed_and_recorded_sent_in_the_writers_transactions(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    writer = _Writer(store)
    service.write_through(writer.transact)
    ids = _finals(store, service, 8)
    sizes = _counting_claims(monkeypatch)
    finals = [store.get(message_id) for message_id in ids]
    own: list[object] = []
    begin = service.engine.begin

    def counted() -> Any:
        own.append("begin")
        return begin()

    monkeypatch.setattr(service.engine, "begin", counted)  # the service opens no transaction of its own
    try:
        await asyncio.gather(*(service.on_final_state(message) for message in finals))
    finally:
        await asyncio.to_thread(writer.close)
    monkeypatch.undo()

    assert accepted_ids(receiver) == sorted(str(i) for i in ids)
    assert sizes == [8] and own == []
    # the claim, then the records: the sends that end together are recorded together
    assert 2 <= writer.operations <= 1 + len(ids)
    for message_id in ids:
        row = await service.get(message_id)
        assert row is not None and (row.status, row.attempts) == ("SENT", 1)


async def test_a_grouped_claim_rolled_back_leaves_the_rows_pending_and_they_are_sent_later(
    store: MessageStore, clock: FakeClock, soap: DelegateConfirmationCallback, receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    service = ConfirmationService(store, soap, clock=clock)
    writer = _Writer(store)
    service.write_through(writer.transact)
    ids = _finals(store, service, 3)
    claimed: list[int] = []
    claim = table.claim_of_messages

    def claim_then_fail(connection: sa.Connection, message_ids: list[int], *args: object) -> list[sa.Row[object]]:
        claimed.extend(row.message_id for row in claim(connection, message_ids, *args))  # type: ignore[arg-type]
        raise sa.exc.OperationalError("SELECT message", {}, ConnectionResetError("the store went away"))

    monkeypatch.setattr(table, "claim_of_messages", claim_then_fail)
    try:
        with caplog.at_level(logging.WARNING):
            await asyncio.gather(*(service.on_final_state(store.get(message_id)) for message_id in ids))
        assert sorted(claimed) == sorted(ids)  # claimed in the writer's transaction, which was rolled back
        assert receiver.snapshot() == []
        for message_id in ids:
            row = await service.get(message_id)
            assert row is not None and (row.status, row.attempts, row.claimed_by) == ("PENDING", 0, None)
        monkeypatch.undo()
        report = await service.process_due()  # the service's pass sends them; its records go through the writer too
    finally:
        await asyncio.to_thread(writer.close)
    assert report.sent == 3
    assert accepted_ids(receiver) == sorted(str(i) for i in ids)
    for message_id in ids:
        assert (await service.get(message_id)).status == "SENT"  # type: ignore[union-attr]
