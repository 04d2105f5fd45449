"""The message store: SQLAlchemy 2 models, the MessageStore and its parts, schema migrations (SQLite, PostgreSQL).

This layer imports only SQLAlchemy, Alembic and the standard library; the state machine that decides
which transitions are legal lives in ``openroute.engine.states``.
"""

from openroute.persistence.database import (
    DEFAULT_DATABASE_URL,
    Database,
    alembic_config,
    create_store_engine,
    sqlite_file,
)
from openroute.persistence.external_calls import CallEnd, CallStart, EntityCallStatus, ExternalCall, ExternalCallStore
from openroute.persistence.funnels import FunnelShare, FunnelStore
from openroute.persistence.messages import InsertOutcome, MessageFields, NewMessage, StoredMessage
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
from openroute.persistence.nodes import NodeStore
from openroute.persistence.outage import StoreOutage, describe_error, is_store_unreachable
from openroute.persistence.secrets import add_secret_names, mask_secrets, masked_url, masked_value
from openroute.persistence.store import MessageStore
from openroute.persistence.throttle import ThrottleCounters
from openroute.persistence.transitions import GroupConflict, Transitions

__all__ = [
    "DEFAULT_DATABASE_URL",
    "FINAL_STATES",
    "Base",
    "CallEnd",
    "CallStart",
    "ConfirmationRecord",
    "ConfirmationStatus",
    "Database",
    "EntityCallRecord",
    "EntityCallStatus",
    "ExternalCall",
    "ExternalCallRecord",
    "ExternalCallStatus",
    "ExternalCallStore",
    "FunnelLockRecord",
    "FunnelShare",
    "FunnelStore",
    "GroupConflict",
    "InsertOutcome",
    "MessageFields",
    "MessageRecord",
    "MessageState",
    "MessageStore",
    "NewMessage",
    "NodeRecord",
    "NodeState",
    "NodeStore",
    "StoreOutage",
    "StoredMessage",
    "ThrottleCounterRecord",
    "ThrottleCounters",
    "Transitions",
    "add_secret_names",
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
    "masked_value",
    "message_table",
    "node_table",
    "sqlite_file",
    "throttle_counter_table",
]
