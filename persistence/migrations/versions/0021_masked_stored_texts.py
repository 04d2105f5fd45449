"""the texts stored before the masking, masked: error texts, traces, business errors, call records, outbox events

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 09:00:00

A data migration, no schema change. Every text below that a version before the masking stored in clear is
rewritten through ``mask_secrets`` (the well-known secret names and those this process knows: ``openroute db
upgrade --config`` and ``openroute run`` with ``migrate`` load the configuration's ``secret_names`` and the
external systems' ``records.secret_fields`` first), so a viewer's search by ``error_text`` no longer matches what
the mask hides. Read in batches of 1,000 rows by primary key; only a row whose text changes is written.
``openroute db mask-secrets`` runs the same again later, for a name added to the configuration.

Nothing to undo: the downgrade leaves the masked texts as they are (the secrets are not kept anywhere).
"""
from __future__ import annotations

from alembic import op
from openroute.persistence.stored_texts import StoredText, mask_stored_texts

revision = "0021"
down_revision = "0020"

# the columns as this revision knows them (written out: a later change of STORED_TEXTS never rewrites this one)
TEXTS = (
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


def upgrade() -> None:
    mask_stored_texts(op.get_bind(), TEXTS)


def downgrade() -> None:
    pass
