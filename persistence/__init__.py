"""The message store: SQLAlchemy 2 models, the MessageStore, schema migrations (SQLite default, PostgreSQL).

This layer imports only SQLAlchemy, Alembic and the standard library; the state machine that decides
which transitions are legal lives in ``openroute.states``.
"""

from openroute.persistence.models import (
    FINAL_STATES,
    Base,
    ConfirmationRecord,
    ConfirmationStatus,
    EntityCallRecord,
    ExternalCallRecord,
    ExternalCallStatus,
    FunnelLockRecord,
    MessageRecord,
    MessageState,
    NodeRecord,
    NodeState,
    confirmation_table,
    entity_call_table,
    external_call_table,
    funnel_lock_table,
    message_table,
    node_table,
)
from openroute.persistence.secrets import mask_secrets, masked_url
from openroute.persistence.store import (
    DEFAULT_DATABASE_URL,
    ExternalCall,
    GroupConflict,
    InsertOutcome,
    MessageFields,
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
    "EntityCallRecord",
    "ExternalCall",
    "ExternalCallRecord",
    "ExternalCallStatus",
    "FunnelLockRecord",
    "GroupConflict",
    "InsertOutcome",
    "MessageFields",
    "MessageRecord",
    "MessageState",
    "MessageStore",
    "NewMessage",
    "NodeRecord",
    "NodeState",
    "StoredMessage",
    "alembic_config",
    "confirmation_table",
    "create_store_engine",
    "entity_call_table",
    "external_call_table",
    "funnel_lock_table",
    "mask_secrets",
    "masked_url",
    "message_table",
    "node_table",
]
