"""Issue 23, item 3: a stable confirmation id on every attempt, a short lease renewed while sending, held messages
not confirmed (real store: SQLite and PostgreSQL; real local receiver)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import sqlalchemy as sa
from openroute.confirmation import (
    ConfirmationCallback,
    ConfirmationPolicy,
    ConfirmationRequest,
    ConfirmationService,
    DelegateConfirmationCallback,
    HttpJsonConfirmation,
    InvalidConfirmationError,
    SoapConfirmation,
)
from openroute.persistence import MessageState, MessageStore, confirmation_table

from openroute.config import ConfirmationsConfig
from tests.confirmation.receiver import Receiver
from tests.confirmation.test_service import FakeClock, add_message, request_for

_C = confirmation_table.c


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def row_of(store: MessageStore, message_id: int) -> sa.Row:  # type: ignore[type-arg]
    with store.engine.connect() as connection:
        return connection.execute(sa.select(confirmation_table).where(_C.message_id == message_id)).one()


@pytest.mark.parametrize("kind", ["json", "soap"])
async def test_every_attempt_carries_the_same_confirmation_id(
    store: MessageStore, clock: FakeClock, receiver: Receiver, kind: str
) -> None:
    transport = (HttpJsonConfirmation("CRM", receiver.url + "/json") if kind == "json"
                 else SoapConfirmation("CRM", receiver.url + "/soap"))
    callback = DelegateConfirmationCallback([transport])
    service = ConfirmationService(store, callback, ConfirmationPolicy(interval=1), clock=clock)
    mid = add_message(store, 1)
    await service.enqueue(request_for(mid))
    stored_id = row_of(store, mid).confirmation_id
    assert stored_id and len(stored_id) == 36
    receiver.reset(fail_first=1, failure="http500")
    try:
        assert (await service.process_due()).retry_scheduled == 1
        clock.advance(2)
        assert (await service.process_due()).sent == 1
    finally:
        await callback.aclose()
    [accepted] = receiver.snapshot()
    assert accepted["confirmationId"] == stored_id
    if kind == "json":
        headers = accepted["_headers"]
        assert isinstance(headers, dict)
        assert headers["idempotency-key"] == headers["x-confirmation-id"] == stored_id
    info = await service.get(mid)
    assert info is not None and info.confirmation_id == stored_id and info.status == "SENT"


async def test_a_restarted_message_confirmed_again_gets_a_new_id(store: MessageStore, clock: FakeClock) -> None:
    class Quiet(ConfirmationCallback):
        async def confirm(self, request: ConfirmationRequest) -> None:
            return None

    service = ConfirmationService(store, Quiet(), clock=clock)
    mid = add_message(store, 2, MessageState.FAILED)
    with store.begin() as connection:
        service.on_final_state_tx(store.get(mid, connection), connection)
    first = row_of(store, mid).confirmation_id
    with store.begin() as connection:
        service.on_final_state_tx(store.get(mid, connection), connection)  # the restarted message ended again
    assert row_of(store, mid).confirmation_id not in (None, first)


async def test_the_messages_of_one_group_commit_get_their_rows_in_one_statement(
    store: MessageStore, clock: FakeClock
) -> None:
    """The engine's hook for a whole group commit: a row for each message owed one, inserted by one statement; a
    restarted message's row started over; a SKIPPED one and a held one get none."""
    class Quiet(ConfirmationCallback):
        async def confirm(self, request: ConfirmationRequest) -> None:
            return None

    service = ConfirmationService(store, Quiet(), clock=clock)
    ok, failed = add_message(store, 11), add_message(store, 12, MessageState.FAILED)
    restarted = add_message(store, 13, MessageState.OK)
    skipped = add_message(store, 14, MessageState.SKIPPED)
    held = add_message(store, 15, MessageState.FAILED, last_error_code="CALL_IN_DOUBT")
    with store.begin() as connection:
        service.on_final_state_tx(store.get(restarted, connection), connection)  # its earlier outcome
    earlier = row_of(store, restarted).confirmation_id
    inserts: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO CONFIRMATION"):
            inserts.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", count)
    try:
        with store.begin() as connection:
            group = [store.get(mid, connection) for mid in (ok, failed, restarted, skipped, held)]
            service.on_final_states_tx(group, connection)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", count)
    assert len(inserts) == 1, inserts
    assert row_of(store, ok).status == row_of(store, failed).status == "PENDING"
    assert row_of(store, restarted).confirmation_id not in (None, earlier)
    assert await service.get(skipped) is None and await service.get(held) is None


async def test_a_message_held_for_an_operator_is_not_confirmed_yet(store: MessageStore, clock: FakeClock) -> None:
    class Quiet(ConfirmationCallback):
        async def confirm(self, request: ConfirmationRequest) -> None:
            return None

    service = ConfirmationService(store, Quiet(), clock=clock)
    held = add_message(store, 3, MessageState.FAILED, last_error_code="CALL_IN_DOUBT")
    failed = add_message(store, 4, MessageState.FAILED, last_error_code="DOWN")
    with store.begin() as connection:
        service.on_final_state_tx(store.get(held, connection), connection)
    assert await service.get(held) is None
    assert await service.sweep_missing() == 1  # only the other FAILED one
    assert await service.get(held) is None and await service.get(failed) is not None


class Slow(ConfirmationCallback):
    """Answers after ``delay`` seconds; records the ids it was given."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.entered = asyncio.Event()
        self.ids: list[str | None] = []

    async def confirm(self, request: ConfirmationRequest) -> None:
        self.entered.set()
        await asyncio.sleep(self.delay)
        self.ids.append(request.confirmation_id)


async def test_a_slow_send_keeps_its_claim_and_a_dead_nodes_claim_is_taken_within_the_lease(
    store: MessageStore,
) -> None:
    lease = ConfirmationPolicy(claim_timeout=0.6)
    slow = Slow(1.5)  # longer than the lease: only the renewals keep the claim
    node_a = ConfirmationService(store, slow, lease, node_id="node-a")
    mid = add_message(store, 5)
    await node_a.enqueue(request_for(mid))
    sending = asyncio.create_task(node_a.process_due())
    await asyncio.wait_for(slow.entered.wait(), 10)
    assert row_of(store, mid).claimed_by == "node-a"
    node_b = ConfirmationService(MessageStore(store.url), Slow(0), lease, node_id="node-b")
    try:
        for _ in range(3):  # across several lease lengths, the renewed claim holds
            await asyncio.sleep(0.4)
            assert (await node_b.process_due()).attempted == 0
        assert (await asyncio.wait_for(sending, 10)).sent == 1
        assert slow.ids == [row_of(store, mid).confirmation_id]

        # node A dies while sending the next one: no renewal, node B takes it after the lease
        other = add_message(store, 6)
        await node_a.enqueue(request_for(other))
        slow.entered.clear()
        dying = asyncio.create_task(node_a.process_due())
        await asyncio.wait_for(slow.entered.wait(), 10)
        dying.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dying
        assert (await node_b.process_due()).attempted == 0  # still within A's lease
        await asyncio.sleep(0.7)
        assert (await node_b.process_due()).sent == 1
        assert row_of(store, other).claimed_by == "node-b"
    finally:
        node_b.engine.dispose()


def test_the_confirmation_settings_come_from_the_configuration(store: MessageStore) -> None:
    config = ConfirmationsConfig.model_validate({"claim_timeout": "20s", "batch_size": 7, "send_timeout": "1m",
                                                 "concurrency": 3})
    service = config.service(store, node_id="n-1")
    assert service.policy.claim_timeout == timedelta(seconds=20)
    assert (service.batch_size, service._concurrency, service._send_timeout, service.node_id) == (7, 3, 60.0, "n-1")
    with pytest.raises(ValueError, match="batch_size"):
        ConfirmationsConfig.model_validate({"batch_size": 0})
    with pytest.raises(ValueError, match="claim_timeout must be positive"):
        ConfirmationsConfig.model_validate({"claim_timeout": "0s"})
    with pytest.raises(InvalidConfirmationError, match="send_timeout"):
        ConfirmationService(store, DelegateConfirmationCallback([]), send_timeout=0)
    with pytest.raises(InvalidConfirmationError, match="confirmation_id"):
        ConfirmationRequest(message_id=1, correlation_id="c", source_system="CRM", state="OK", confirmation_id="")
