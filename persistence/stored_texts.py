"""The texts of the store that people and other systems read, masked in place: those stored before the masking
existed, or before a name was added to the secret names, are rewritten through :func:`mask_secrets`.

Migration 0021 runs it once on upgrade; ``openroute db mask-secrets`` runs it again with the names of the
configuration (an operator added ``secret_names`` or a system's ``records.secret_fields``), so a search by error
text never matches what a mask hides::

    from openroute.persistence.stored_texts import mask_stored_texts

    with engine.connect() as connection:
        masked = mask_stored_texts(connection, names=["pin"], after_batch=connection.commit)
    # {'message.last_error_text': 12, 'message_transition.error_text': 30, ...}: the rows changed, per column

Rows are read in batches by primary key (a store of millions of rows is never loaded at once) and only a row whose
text changes is written, with its old text as the condition (a row another writer changed meanwhile is left alone).
What an external call returned (``external_call.result``) is not among them: a later attempt's route reads it as it
came (it is masked when shown); the payload is the message's own data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from openroute.persistence.column_types import Json
from openroute.persistence.secrets import mask_secrets, masked_value

__all__ = ["BATCH_SIZE", "STORED_TEXTS", "StoredText", "mask_stored_texts"]

#: rows read per statement
BATCH_SIZE = 1000


@dataclass(frozen=True)
class StoredText:
    """A column of texts shown to people or sent to systems: ``table.column``, keyed by the integer primary key
    ``key``; ``json`` for a JSON column (its strings and secret members masked by :func:`masked_value`)."""

    table: str
    column: str
    key: str = "id"
    json: bool = False

    @property
    def name(self) -> str:
        """``table.column``."""
        return f"{self.table}.{self.column}"


#: every stored text the admin API, the console, the CLI, confirmations and outcome events read
STORED_TEXTS: tuple[StoredText, ...] = (
    StoredText("message", "last_error_text"),
    StoredText("message", "last_error_trace"),
    StoredText("message", "business_errors", json=True),
    StoredText("message_transition", "error_text"),
    StoredText("message_transition", "error_trace"),
    StoredText("external_call", "last_error"),
    StoredText("entity_call", "last_error"),
    StoredText("call_record", "request"),
    StoredText("call_record", "response"),
    StoredText("call_record", "error"),
    StoredText("confirmation", "last_error"),
    StoredText("outbox", "payload"),
    StoredText("outbox", "last_error"),
)


def mask_stored_texts(
    connection: sa.Connection,
    texts: Iterable[StoredText] = STORED_TEXTS,
    names: Iterable[str] = (),
    batch_size: int = BATCH_SIZE,
    after_batch: Callable[[], None] | None = None,
) -> dict[str, int]:
    """Mask every text of ``texts`` in the store of ``connection`` with the secret names of this process and
    ``names``. ``after_batch`` is called after each batch's writes (``connection.commit`` for a batch per
    transaction; None: the caller's one transaction holds them all).

    Returns the number of rows changed per column (``"message.last_error_text"``), every column of ``texts``
    listed. Raises what the database raises (SQLAlchemy errors); ``ValueError`` for a ``batch_size`` below 1."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    extra = tuple(names)
    return {text.name: _mask_column(connection, text, extra, batch_size, after_batch) for text in texts}


def _mask_column(connection: sa.Connection, text: StoredText, names: tuple[str, ...], batch_size: int,
                 after_batch: Callable[[], None] | None) -> int:
    kind: sa.types.TypeEngine[Any] = Json if text.json else sa.Text()
    table = sa.table(text.table, sa.column(text.key, sa.BigInteger()), sa.column(text.column, kind))
    key, value = table.c[text.key], table.c[text.column]
    # the condition compares texts: a JSON column as its text (PostgreSQL's jsonb has one canonical form)
    as_text = sa.cast(value, sa.Text()) if text.json else value
    select = (sa.select(key, value, as_text.label("old")).where(value.is_not(None), key > sa.bindparam("after"))
              .order_by(key).limit(batch_size))
    update = (sa.update(table).where(key == sa.bindparam("k"), as_text == sa.bindparam("old"))
              .values({text.column: sa.bindparam("new", type_=kind)}))
    changed, after = 0, None
    while True:
        rows = connection.execute(select, {"after": after if after is not None else -(2**63)}).all()
        if not rows:
            return changed
        writes = []
        for row_key, stored, old in rows:
            masked = masked_value(stored, names) if text.json else mask_secrets(stored, names)
            if masked != stored:
                writes.append({"k": row_key, "old": old, "new": masked})
        if writes:
            result = connection.execute(update, writes)
            counted = result.rowcount if connection.dialect.supports_sane_multi_rowcount else -1
            changed += counted if counted >= 0 else len(writes)
        if after_batch is not None:
            after_batch()
        after = rows[-1][0]
