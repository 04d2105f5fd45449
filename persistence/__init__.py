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
    ThrottleCounterRecord,
    confirmation_table,
    entity_call_table,
    external_call_table,
    funnel_lock_table,
    message_table,
    node_table,
    throttle_counter_table,
)
from openroute.persistence.outage import StoreOutage, describe_error, is_store_unreachable
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
from openroute.persistence.throttle import ThrottleCounters

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
    "StoreOutage",
    "StoredMessage",
    "ThrottleCounterRecord",
    "ThrottleCounters",
    "alembic_config",
    "confirmation_table",
    "create_store_engine",
    "describe_error",
    "entity_call_table",
    "external_call_table",
    "funnel_lock_table",
    "is_store_unreachable",
    "mask_secrets",
    "masked_url",
    "message_table",
    "node_table",
    "throttle_counter_table",
]
