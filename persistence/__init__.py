"""The message store: SQLAlchemy 2 models, the MessageStore, schema migrations (SQLite default, PostgreSQL).

This layer imports only SQLAlchemy, Alembic and the standard library; the state machine that decides
which transitions are legal lives in ``openroute.states``.
"""

from persistence.models import (
    FINAL_STATES,
    Base,
    ConfirmationRecord,
    ConfirmationStatus,
    ExternalCallRecord,
    ExternalCallStatus,
    MessageRecord,
    MessageState,
    NodeRecord,
    confirmation_table,
    external_call_table,
    message_table,
    node_table,
)
from persistence.store import (
    DEFAULT_DATABASE_URL,
    ExternalCall,
    GroupConflict,
    InsertOutcome,
    MessageStore,
    NewMessage,
    StoredMessage,
    alembic_config,
    create_store_engine,
)

__all__ = [
    "DEFAULT_DATABASE_URL",
    "FINAL_STATES",
    "Base",
    "ConfirmationRecord",
    "ConfirmationStatus",
    "ExternalCall",
    "ExternalCallRecord",
    "ExternalCallStatus",
    "GroupConflict",
    "InsertOutcome",
    "MessageRecord",
    "MessageState",
    "MessageStore",
    "NewMessage",
    "NodeRecord",
    "StoredMessage",
    "alembic_config",
    "confirmation_table",
    "create_store_engine",
    "external_call_table",
    "message_table",
    "node_table",
]
