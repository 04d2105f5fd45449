"""Issue 42, item 4: the console shows what waits. The message list's "Next attempt" column (a due time, or what
the message waits for), the bulk actions above the list, and a confirmation that is sent shows no next attempt."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa
from openroute.confirmation import ConfirmationService, DefaultConfirmationCallback
from openroute.persistence import ConfirmationStatus, MessageState, NewMessage, StoredMessage, confirmation_table

from openroute.console._search import next_attempt, short_time
from openroute.engine import states
from tests.console.conftest import ADMIN, World, inbound
from tests.console.test_cli import Tty


class KeptLog(DefaultConfirmationCallback):
    """The log's confirmation kept as rows, as a remote system's is (the console shows a confirmation's row)."""

    @property
    def durable(self) -> bool:
        return True


def _new(world: World, correlation_id: str) -> StoredMessage:
    return world.store.insert_message(NewMessage(
        service="orders", operation="create", payload="{}", content_type="application/json",
        correlation_id=correlation_id, source_system="CRM", receive_ts=datetime.now(UTC))).message


def _moved(world: World, message: StoredMessage, state: MessageState, **changes: object) -> StoredMessage:
    """``message`` claimed by a node, then moved to ``state`` with ``changes`` (as an attempt's outcome)."""
    now = datetime.now(UTC)
    claimed = states.claim(world.store, [message], "worker", now)[0]
    return states.transition(world.store, claimed, state, now, changes)


def _waiting(world: World) -> dict[str, StoredMessage]:
    """A message due for a retry, one parked on an open breaker, one queued behind its funnel."""
    due = datetime.now(UTC) + timedelta(minutes=7)
    return {
        "retry": _moved(world, _new(world, "w-retry"), MessageState.PARTLY_FAILED, failed_count=1,
                        next_attempt_at=due, last_error_code="TIMEOUT"),
        "parked": _moved(world, _new(world, "w-parked"), MessageState.POSTPONED, next_attempt_at=None,
                         parked_on="PAYMENTS", last_error_code="CIRCUIT_OPEN"),
        "funnel": _moved(world, _new(world, "w-funnel"), MessageState.POSTPONED, next_attempt_at=None,
                         last_error_code="FUNNEL"),
    }


def _cell(html: str, message_id: int) -> str:
    found = re.search(rf'<td id="next-{message_id}">(.*?)</td>', html, re.S)
    assert found, f"message {message_id} is not listed"
    return found.group(1)


async def test_the_list_shows_when_each_message_runs_next_or_what_it_waits_for(
    client: httpx.AsyncClient, world: World
) -> None:
    waiting = _waiting(world)
    response = await client.get("/console/messages", headers=ADMIN)
    assert response.status_code == 200
    html = response.text
    assert "<th>Next attempt</th>" in html
    assert _cell(html, waiting["retry"].id) == short_time(waiting["retry"].next_attempt_at)
    assert _cell(html, waiting["parked"].id) == "when the breaker of PAYMENTS closes"
    assert _cell(html, waiting["funnel"].id) == "when its funnel is free"
    # final messages and NEW ones (queued at once) wait for nothing
    assert _cell(html, world.ids["failed1"]) == "" and _cell(html, world.ids["ok"]) == ""
    assert _cell(html, world.ids["new"]) == ""
    # the detail page says the same, and its list of children too
    detail = (await client.get(f"/console/messages/{waiting['parked'].id}", headers=ADMIN)).text
    assert '<td id="next-attempt">when the breaker of PAYMENTS closes</td>' in detail
    parent = (await client.get(f"/console/messages/{world.ids['failed1']}", headers=ADMIN)).text
    assert f'<td id="child-next-{world.ids["child"]}"></td>' in parent  # a NEW child: queued, waits for nothing
    # the admin API's items carry what the column is made of
    api = (await client.get("/admin/messages?state=POSTPONED", headers=ADMIN)).json()
    assert {item["correlationId"]: item["parkedOn"] for item in api["items"]} == {"w-parked": "PAYMENTS",
                                                                                  "w-funnel": None}


def test_next_attempt_reads_stored_values_and_the_apis_json_alike() -> None:
    due = datetime(2024, 3, 1, 10, 15, tzinfo=UTC)
    assert next_attempt(MessageState.PARTLY_FAILED, due, None, "TIMEOUT") == "2024-03-01 10:15:00.000"
    assert next_attempt("PARTLY_FAILED", due.isoformat(), "PAYMENTS", "HTTP_503") == "2024-03-01 10:15:00.000"
    assert next_attempt("POSTPONED", None, "PAYMENTS", "CIRCUIT_OPEN") == "when the breaker of PAYMENTS closes"
    assert next_attempt("WAITING_FOR_CHILDREN", None, None, None) == "when its children end"
    assert next_attempt("OK", None, None, None) == ""
    with pytest.raises(ValueError):
        next_attempt("WAITING", None, None, None)


async def test_openroute_messages_list_has_the_next_attempt_column(world: World) -> None:
    from openroute.cli import build_parser
    from openroute.console.cli import run

    waiting = _waiting(world)
    out, err = Tty(), io.StringIO()
    args = build_parser().parse_args(["messages", "list", "--database-url", world.store.url, "--state", "POSTPONED",
                                      "--state", "PARTLY_FAILED"])
    assert run(args, out, err) == 0
    header, *rows = out.getvalue().splitlines()
    assert header.split()[-1] == "nextAttempt"
    by_id = {int(row.split()[0]): row for row in rows}
    assert by_id[waiting["parked"].id].endswith("when the breaker of PAYMENTS closes")
    assert by_id[waiting["retry"].id].endswith(short_time(waiting["retry"].next_attempt_at))


async def test_the_bulk_actions_are_above_the_result_table(client: httpx.AsyncClient, world: World) -> None:
    html = (await client.get("/console/messages?state=FAILED", headers=ADMIN)).text
    table = html.index('<table id="results">')
    assert html.index('id="restart-matching"') < table
    assert html.index('id="bulk-restart"') < table and html.index('id="bulk-cancel"') < table
    assert html.index('id="result-count"') < html.index('id="restart-matching"')


async def test_a_sent_confirmation_shows_no_next_attempt(client: httpx.AsyncClient, world: World) -> None:
    """The service sends the confirmation of a message that ended OK; its row is SENT and has no next attempt (the
    claim's lease used to stay as a time in the future)."""
    service = ConfirmationService(world.store, KeptLog())
    world.engine.on_final_state_in_transaction(service.on_final_state_tx)
    await world.engine.start()
    try:
        accepted = await world.engine.accept(inbound("w-confirmed"))
        await world.engine.wait_idle(20)
    finally:
        await world.engine.stop()
    message = world.store.get(accepted.message_id)
    assert message.state is MessageState.OK
    report = await service.process_due()
    assert report.sent >= 1
    with world.store.engine.connect() as connection:
        row = connection.execute(sa.select(confirmation_table).where(
            confirmation_table.c.message_id == message.id)).one()
    assert (row.status, row.next_attempt_at) == (ConfirmationStatus.SENT, None)
    html = (await client.get(f"/console/messages/{message.id}", headers=ADMIN)).text
    assert '<td id="confirmation-status">SENT</td>' in html
    assert '<td id="confirmation-next-attempt"></td>' in html
    detail = (await client.get(f"/admin/messages/{message.id}", headers=ADMIN)).json()
    assert detail["confirmation"]["status"] == "SENT" and detail["confirmation"]["nextAttemptAt"] is None

    # a row sent before the service cleared the time keeps it in the store: the pages show none either
    with world.store.begin() as connection:
        connection.execute(sa.update(confirmation_table).where(confirmation_table.c.message_id == message.id)
                           .values(next_attempt_at=datetime.now(UTC) + timedelta(minutes=5)))
    html = (await client.get(f"/console/messages/{message.id}", headers=ADMIN)).text
    assert '<td id="confirmation-next-attempt"></td>' in html
    assert (await client.get(f"/admin/messages/{message.id}", headers=ADMIN)).json()[
        "confirmation"]["nextAttemptAt"] is None
