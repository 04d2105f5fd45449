"""The store's column types (``persistence/column_types.py``): timestamps stored as UTC and read back aware, JSON
columns, on each real database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from openroute.persistence import MessageStore

from tests.persistence.conftest import new_message


def test_timestamps_come_back_aware_utc(store: MessageStore) -> None:
    cest = timezone(timedelta(hours=2))
    stamp = datetime(2024, 6, 1, 14, 0, tzinfo=cest)
    message = store.insert_message(new_message(msg_ts=stamp)).message
    row = store.get(message.id)
    assert row.msg_ts == stamp and row.msg_ts.tzinfo == UTC
    with pytest.raises(sa.exc.StatementError, match="naive"):
        store.insert_message(new_message(key="naive", msg_ts=datetime(2024, 1, 1)))
    assert store.get(message.id + 1) is None


def test_a_timestamp_is_stored_as_its_utc_time_and_json_as_its_document(store: MessageStore) -> None:
    stamp = datetime(2024, 6, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    headers = {"endpoint": "json", "note": "čaj ☕"}
    message_id = store.insert_message(new_message(msg_ts=stamp, headers=headers)).message.id
    with store.engine.connect() as connection:  # as the driver reads the row: not through the column types
        stored, document = connection.execute(
            sa.text("SELECT msg_ts, headers FROM message WHERE id = :id"), {"id": message_id}).one()
    if store.dialect == "postgresql":  # timestamp with time zone, jsonb
        assert stored == stamp and stored.utcoffset() is not None
        assert document == headers
    else:  # naive UTC text, JSON text
        assert stored == "2024-06-01 12:00:00.000000"
        assert json.loads(document) == headers
