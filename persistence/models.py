"""SQLAlchemy 2 models of the message store: messages, external calls, confirmations, nodes.

The column domain (:class:`MessageState`) lives here; which transitions between states are legal is
decided above this layer (``openroute.engine.states``), so the store only knows how to write a transition
atomically, never whether it is allowed.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from openroute.persistence.column_types import BigId, Json, UTCDateTime
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class MessageState(enum.StrEnum):
    """Lifecycle state of a message (the ``state`` column)."""

    NEW = "NEW"
    PROCESSING = "PROCESSING"
    PARTLY_FAILED = "PARTLY_FAILED"
    POSTPONED = "POSTPONED"
    WAITING_FOR_CHILDREN = "WAITING_FOR_CHILDREN"
    OK = "OK"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    CANCEL = "CANCEL"

    @property
    def is_final(self) -> bool:
        """True for the states a message never leaves on its own (OK, FAILED, SKIPPED, CANCEL)."""
        return self in FINAL_STATES


FINAL_STATES: frozenset[MessageState] = frozenset(
    {MessageState.OK, MessageState.FAILED, MessageState.SKIPPED, MessageState.CANCEL}
)

#: the ``last_error_code`` of a message queued behind its funnel (the engine's ``ErrorCode.FUNNEL``)
FUNNEL_WAIT_CODE = "FUNNEL"
#: which messages are due by time (the partial index ``ix_message_due``; queries repeat it word for word)
DUE_PREDICATE = "state IN ('PARTLY_FAILED', 'POSTPONED') AND next_attempt_at IS NOT NULL"
#: which messages wait for an external system (``ix_message_parked``): parked on its open breaker (POSTPONED, no due
#: time) or failed on a call of it (PARTLY_FAILED, due by the retry policy or when its breaker closes)
PARKED_PREDICATE = "state IN ('POSTPONED', 'PARTLY_FAILED') AND parked_on IS NOT NULL"
#: which messages wait in a funnel's queue (``ix_message_funnel_queue``)
FUNNEL_QUEUE_PREDICATE = f"state = 'POSTPONED' AND last_error_code = '{FUNNEL_WAIT_CODE}'"


class ConfirmationStatus(enum.StrEnum):
    """Delivery status of the outcome confirmation to the source system."""

    PENDING = "PENDING"
    SENT = "SENT"
    FAILED = "FAILED"


class NodeState(enum.StrEnum):
    """What an operator lets a node do (the ``node.state`` column), as in OpenHub.

    RUN: take new messages and process stored ones. HANDLES_EXISTING_MESSAGES (draining): refuse new messages,
    keep processing the ones already stored. STOPPED: refuse new messages and pick up no work.
    """

    RUN = "RUN"
    HANDLES_EXISTING_MESSAGES = "HANDLES_EXISTING_MESSAGES"
    STOPPED = "STOPPED"

    @property
    def picks_up_work(self) -> bool:
        """False for STOPPED: the node emits, repolls, repairs and confirms nothing."""
        return self is not NodeState.STOPPED


class ExternalCallStatus(enum.StrEnum):
    """Outcome of an idempotent external call made on behalf of a message.

    STARTED is committed before the call is made: a STARTED row that an attempt finds on entry is a call *in
    doubt* (an earlier attempt began it and never recorded an outcome, e.g. its node died).
    """

    STARTED = "STARTED"
    OK = "OK"
    FAILED = "FAILED"


def _state_type() -> sa.Enum:
    return sa.Enum(MessageState, native_enum=False, length=32, validate_strings=True, name="message_state")


class Base(DeclarativeBase):
    """Declarative base of every table of the store."""


class MessageRecord(Base):
    """One asynchronous message and its lifecycle bookkeeping."""

    __tablename__ = "message"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    correlation_id: Mapped[str] = mapped_column(sa.String(255))
    source_system: Mapped[str] = mapped_column(sa.String(100))
    process_id: Mapped[str | None] = mapped_column(sa.String(255))
    service: Mapped[str] = mapped_column(sa.String(100))
    operation: Mapped[str] = mapped_column(sa.String(100))
    object_id: Mapped[str | None] = mapped_column(sa.String(255))
    entity_type: Mapped[str | None] = mapped_column(sa.String(100))
    funnel_value: Mapped[str | None] = mapped_column(sa.String(255))
    payload: Mapped[str] = mapped_column(sa.Text)
    content_type: Mapped[str] = mapped_column(sa.String(100))
    headers: Mapped[dict[str, str]] = mapped_column(Json, default=dict)
    state: Mapped[MessageState] = mapped_column(_state_type())
    failed_count: Mapped[int] = mapped_column(sa.Integer, default=0)
    receive_ts: Mapped[datetime] = mapped_column(UTCDateTime)
    msg_ts: Mapped[datetime | None] = mapped_column(UTCDateTime)
    start_process_ts: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_update_ts: Mapped[datetime] = mapped_column(UTCDateTime)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    node_id: Mapped[str | None] = mapped_column(sa.String(100))
    custom_data: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    business_errors: Mapped[list[dict[str, Any]]] = mapped_column(Json, default=list)
    last_error_code: Mapped[str | None] = mapped_column(sa.String(100))
    last_error_text: Mapped[str | None] = mapped_column(sa.Text)
    parent_id: Mapped[int | None] = mapped_column(BigId, sa.ForeignKey("message.id"))
    version: Mapped[int] = mapped_column(sa.Integer, default=0)
    #: the traceback of the unexpected error that ended the current state (migration 0009); None for expected errors
    last_error_trace: Mapped[str | None] = mapped_column(sa.Text)
    #: the W3C traceparent of the span that accepted the message (migration 0012; None while tracing is off): the
    #: parent of its attempts and confirmation on every node (``openroute.runtime.tracing``)
    traceparent: Mapped[str | None] = mapped_column(sa.String(55))
    #: the external system this message waits for (migration 0019): POSTPONED, parked on its open circuit breaker
    #: with no due time, or PARTLY_FAILED after a failed call of it; released when the breaker lets calls through
    #: again (``engine/parking.py``); NULL otherwise
    parked_on: Mapped[str | None] = mapped_column(sa.String(100))

    __table_args__ = (
        sa.UniqueConstraint("source_system", "correlation_id", name="uq_message_source_correlation"),
        # repoll: due PARTLY_FAILED / POSTPONED
        sa.Index("ix_message_state_next_attempt", "state", "next_attempt_at"),
        # repoll: PROCESSING past its lease; NEW never queued
        sa.Index("ix_message_state_start", "state", "start_process_ts"),
        sa.Index("ix_message_state_receive", "state", "receive_ts"),
        # node restart: its own PROCESSING messages
        sa.Index("ix_message_node_state", "node_id", "state"),
        # obsolete check (newer OK message of the same object)
        sa.Index("ix_message_entity_object", "entity_type", "object_id", "receive_ts"),
        # funnel: another message with the same funnel value in PROCESSING
        sa.Index("ix_message_funnel_state", "funnel_value", "state"),
        sa.Index("ix_message_parent", "parent_id"),
        # waiting on events (migration 0019): the due messages in due order, the messages parked on a breaker and the
        # messages queued behind a funnel, each in the order they are released; partial, so the rest costs nothing
        sa.Index("ix_message_due", "next_attempt_at", "id",
                 postgresql_where=sa.text(DUE_PREDICATE), sqlite_where=sa.text(DUE_PREDICATE)),
        sa.Index("ix_message_parked", "parked_on", "receive_ts", "id",
                 postgresql_where=sa.text(PARKED_PREDICATE), sqlite_where=sa.text(PARKED_PREDICATE)),
        sa.Index("ix_message_funnel_queue", "funnel_value", "receive_ts", "id",
                 postgresql_where=sa.text(FUNNEL_QUEUE_PREDICATE), sqlite_where=sa.text(FUNNEL_QUEUE_PREDICATE)),
        # admin / Spark reprocessing: FAILED of one operation in a time window
        sa.Index("ix_message_service_op_state", "service", "operation", "state", "receive_ts"),
        sa.Index("ix_message_last_update", "last_update_ts"),
        # admin search (migration 0004): pages newest first by (receive_ts, id), selective filters by receive time
        sa.Index("ix_message_receive", "receive_ts", "id"),
        sa.Index("ix_message_correlation", "correlation_id"),
        sa.Index("ix_message_object", "object_id", "receive_ts"),
        sa.Index("ix_message_process", "process_id", "receive_ts"),
        # search by error code (migration 0009)
        sa.Index("ix_message_error_code", "last_error_code", "receive_ts"),
        # an error code with a state (migration 0011): the state checked in the index, errors only
        sa.Index("ix_message_error_code_state", "last_error_code", "state", "receive_ts",
                 postgresql_where=sa.text("last_error_code IS NOT NULL"),
                 sqlite_where=sa.text("last_error_code IS NOT NULL")),
        # an error code with a service (migration 0013), errors only
        sa.Index("ix_message_error_service", "last_error_code", "service", "receive_ts",
                 postgresql_where=sa.text("last_error_code IS NOT NULL"),
                 sqlite_where=sa.text("last_error_code IS NOT NULL")),
        # the operation alone (migration 0013)
        sa.Index("ix_message_operation", "operation", "receive_ts"),
        # the console's failing routes: each one's latest failure (migration 0016, was 0015's (last_update_ts)),
        # failing messages only
        # (the route as expressions, which a search by route and state cannot take: see the migration)
        sa.Index("ix_message_failing_route", sa.text("(service || '')"), sa.text("(operation || '')"),
                 "last_update_ts", "id",
                 postgresql_where=sa.text("state IN ('FAILED', 'PARTLY_FAILED')"),
                 sqlite_where=sa.text("state IN ('FAILED', 'PARTLY_FAILED')")),
        # search by text in the error (migrations 0009, 0013): a trigram index, PostgreSQL only (pg_trgm), with a
        # short pending list (a search reads all of it), errors only; the payload's is on message_payload_text
        sa.Index("ix_message_error_text_trgm", "last_error_text", postgresql_using="gin",
                 postgresql_ops={"last_error_text": "gin_trgm_ops"},
                 postgresql_where=sa.text("last_error_text IS NOT NULL"),
                 postgresql_with={"gin_pending_list_limit": 128}).ddl_if(dialect="postgresql"),
    )


class _CallAttempts:
    """The columns both records of an external call have (per message and per entity): the calls made (``attempts``)
    and refused by a breaker (0020), its result or the last attempt's error, when the row was made and changed."""

    attempts: Mapped[int] = mapped_column(sa.Integer, default=1)
    refused: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    result: Mapped[Any | None] = mapped_column(Json)
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ExternalCallRecord(_CallAttempts, Base):
    """A call to an external system made once per (message, call key).

    ``idempotency_key`` is the key handed to the remote (the same on every attempt); ``node_id`` and
    ``started_at`` say which node last started the call and when (the STARTED record, committed before the call).
    """

    __tablename__ = "external_call"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(BigId, sa.ForeignKey("message.id", ondelete="CASCADE"))
    call_key: Mapped[str] = mapped_column(sa.String(255))
    status: Mapped[ExternalCallStatus] = mapped_column(
        sa.Enum(ExternalCallStatus, native_enum=False, length=16, name="external_call_status")
    )
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(64))
    node_id: Mapped[str | None] = mapped_column(sa.String(100))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (sa.UniqueConstraint("message_id", "call_key", name="uq_external_call_message_key"),)


class EntityCallRecord(_CallAttempts, Base):
    """A call to an external system made once per (entity type, object id, call key), whichever message asks.

    ``status`` is IN_PROGRESS while a worker makes the call (the row is the lock that keeps a concurrent
    duplicate call out), then OK or FAILED; ``owner_message_id`` is the message whose attempt holds it.
    """

    __tablename__ = "entity_call"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    entity_type: Mapped[str] = mapped_column(sa.String(100))
    object_id: Mapped[str] = mapped_column(sa.String(255))
    call_key: Mapped[str] = mapped_column(sa.String(255))
    status: Mapped[str] = mapped_column(sa.String(16))
    owner_message_id: Mapped[int | None] = mapped_column(BigId)

    __table_args__ = (
        sa.UniqueConstraint("entity_type", "object_id", "call_key", name="uq_entity_call_entity_key"),
    )


class FunnelLockRecord(Base):
    """Which message holds a funnel value (at most one message per funnel value is PROCESSING).

    The holder keeps the row after it leaves PROCESSING; the next message takes it over once the holder is
    no longer PROCESSING, so a holder that died never blocks the funnel for longer than its repair.
    """

    __tablename__ = "funnel_lock"

    funnel_value: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    message_id: Mapped[int] = mapped_column(BigId)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ConfirmationRecord(Base):
    """The outcome confirmation owed to the source system of a message (one per message).

    ``confirmation_id`` is sent with every attempt of this confirmation (the source system drops repeats by it); a
    restarted message confirmed again with a new outcome gets a new one. ``claimed_by`` is the node sending it now.
    """

    __tablename__ = "confirmation"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(BigId, sa.ForeignKey("message.id", ondelete="CASCADE"), unique=True)
    source_system: Mapped[str] = mapped_column(sa.String(100))
    outcome_state: Mapped[MessageState] = mapped_column(_state_type())
    status: Mapped[ConfirmationStatus] = mapped_column(
        sa.Enum(ConfirmationStatus, native_enum=False, length=16, name="confirmation_status")
    )
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    confirmation_id: Mapped[str | None] = mapped_column(sa.String(64))
    claimed_by: Mapped[str | None] = mapped_column(sa.String(100))

    __table_args__ = (sa.Index("ix_confirmation_status_next", "status", "next_attempt_at"),)


class MessageTransitionRecord(Base):
    """One state change of a message, written in the transaction of the change itself.

    ``from_state`` is None for the row written when the message is stored; ``attempt`` is the message's
    ``failed_count + 1`` at the change, except for a counted failure, which belongs to the attempt that failed
    (the failed count after it); ``cause`` says who asked for it: ``engine``, ``admin:<user>``, ``cli:<user>``,
    ``reprocess:<job id>``, ``repair`` (a PROCESSING message of a dead node), ``archive``...
    ``error_text`` and ``error_trace`` keep the error of the change (the message row keeps only the current one).
    """

    __tablename__ = "message_transition"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(BigId, sa.ForeignKey("message.id", ondelete="CASCADE"))
    from_state: Mapped[MessageState | None] = mapped_column(_state_type())
    to_state: Mapped[MessageState] = mapped_column(_state_type())
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    node_id: Mapped[str | None] = mapped_column(sa.String(100))
    attempt: Mapped[int] = mapped_column(sa.Integer, default=1)
    error_code: Mapped[str | None] = mapped_column(sa.String(100))
    cause: Mapped[str] = mapped_column(sa.String(255), default="engine")
    error_text: Mapped[str | None] = mapped_column(sa.Text)
    error_trace: Mapped[str | None] = mapped_column(sa.Text)

    __table_args__ = (sa.Index("ix_message_transition_message", "message_id", "id"),)


class NodeRecord(Base):
    """A running (or once running) engine node, with its heartbeat and the state an operator gave it."""

    __tablename__ = "node"

    id: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    host: Mapped[str | None] = mapped_column(sa.String(255))
    pid: Mapped[int | None] = mapped_column(sa.Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: set by an operator (console, admin API); kept when the node restarts
    state: Mapped[NodeState] = mapped_column(
        sa.Enum(NodeState, native_enum=False, length=32, name="node_state"), server_default=NodeState.RUN.value
    )


class OutboxRecord(Base):
    """An outcome event waiting to be published to ``channel``: written in the transaction of the state change it
    tells of, deleted once the broker confirmed it. ``event_id`` stays the same across retries (the receiver's
    deduplication key); ``lease_node`` / ``lease_until`` say which node publishes it now. No foreign key: deleting
    an old message (retention) must not wait for its events."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(sa.String(36))
    channel: Mapped[str] = mapped_column(sa.String(255))
    message_id: Mapped[int] = mapped_column(BigId)
    payload: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    lease_node: Mapped[str | None] = mapped_column(sa.String(100))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(sa.Text)

    __table_args__ = (
        sa.UniqueConstraint("event_id", name="uq_outbox_event_id"),
        sa.Index("ix_outbox_next_attempt", "next_attempt_at"),
        sa.Index("ix_outbox_message", "message_id", "id"),
    )


class CircuitBreakerRecord(Base):
    """The circuit breaker of one external system, shared by every node (``persistence/breaker.py``).

    Every change is a conditional update on ``version``, so two nodes never both win one transition.
    ``trials`` holds the start times (ISO 8601) of the trial calls in flight while HALF_OPEN.
    """

    __tablename__ = "circuit_breaker"

    system: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    state: Mapped[str] = mapped_column(sa.String(16))
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    open_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    trials: Mapped[list[str]] = mapped_column(Json, default=list)
    trial_successes: Mapped[int] = mapped_column(sa.Integer, default=0)
    forced: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(sa.Text)
    version: Mapped[int] = mapped_column(sa.Integer, default=0)


class CallRecordRecord(Base):
    """The request and response (or error) of one external call, kept when the system's call records are on."""

    __tablename__ = "call_record"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    message_id: Mapped[int] = mapped_column(BigId, sa.ForeignKey("message.id", ondelete="CASCADE"))
    system: Mapped[str] = mapped_column(sa.String(100))
    call_key: Mapped[str] = mapped_column(sa.String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    duration_ms: Mapped[int] = mapped_column(sa.Integer)
    outcome: Mapped[str] = mapped_column(sa.String(32))
    request: Mapped[str | None] = mapped_column(sa.Text)
    response: Mapped[str | None] = mapped_column(sa.Text)
    error: Mapped[str | None] = mapped_column(sa.Text)

    __table_args__ = (
        sa.Index("ix_call_record_message", "message_id", "id"),
        sa.Index("ix_call_record_started", "started_at"),
    )


class AlertStateRecord(Base):
    """The state of one alert rule, shared by every node (``persistence/alerts.py``): who evaluates it this period
    (the lease) and whether it fires (Alertmanager's model: notify on firing, on repeat, once on resolving)."""

    __tablename__ = "alert_state"

    rule: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    firing: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    value: Mapped[int | None] = mapped_column(sa.BigInteger)
    fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    notified_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    evaluated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_owner: Mapped[str | None] = mapped_column(sa.String(100))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ThrottleCounterRecord(Base):
    """Requests of one source system and operation counted in one fixed window of its throttling rule.

    ``window_start`` is the window's start in milliseconds since the epoch; rows of earlier windows are deleted
    when the next window of the same system and operation begins.
    """

    __tablename__ = "throttle_counter"

    source_system: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    operation: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    window_start: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    count: Mapped[int] = mapped_column(sa.Integer)


class MessageCountRecord(Base):
    """How many messages a route has in a state, as of the fold mark (``persistence/counts.py``, migration 0014).

    Written only by the fold (the transitions up to the mark and the deltas of ``message_count_delta`` added in);
    a reader adds the transitions after the mark and the deltas."""

    __tablename__ = "message_count"

    service: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    operation: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    state: Mapped[MessageState] = mapped_column(_state_type(), primary_key=True)
    n: Mapped[int] = mapped_column(sa.BigInteger, default=0)


class MessageCountMarkRecord(Base):
    """The one row saying which ``message_transition`` rows ``message_count`` holds: every id up to
    ``transition_id``; ``pending_id`` / ``pending_xmax`` are the next mark and the PostgreSQL transaction id that
    must be past before it is folded (the transitions below it are then all committed or never will be)."""

    __tablename__ = "message_count_mark"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    transition_id: Mapped[int] = mapped_column(sa.BigInteger)
    pending_id: Mapped[int | None] = mapped_column(sa.BigInteger)
    pending_xmax: Mapped[int | None] = mapped_column(sa.BigInteger)
    folded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class MessageFinishedMinuteRecord(Base):
    """How many transitions into a final state (OK, FAILED, SKIPPED, CANCEL) a minute (UTC, the transition's ``at``
    truncated) had, as of the fold mark (``persistence/counts.py``, migration 0017).

    The console's dashboard shows the messages finished in the last hour per state and in five-minute bars: reading
    this table plus the transitions after the mark costs the minutes times the states, where reading the finished
    messages cost one row per message (360,000 rows an hour at 100 messages/s). Written only by the fold; minutes
    older than ``FINISHED_KEPT`` (two hours) are deleted by it."""

    __tablename__ = "message_finished_minute"

    minute: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    state: Mapped[MessageState] = mapped_column(_state_type(), primary_key=True)
    n: Mapped[int] = mapped_column(sa.BigInteger, default=0)


#: a copy of each stored payload, which the payload search's trigram index covers: written behind the storing commit
#: from ``message_payload_pending``, deleted with its message (PostgreSQL, migration 0018,
#: :mod:`openroute.persistence.payload_index`); SQLite leaves it empty
message_payload_text_table = sa.Table(
    "message_payload_text",
    Base.metadata,
    sa.Column("message_id", BigId, sa.ForeignKey("message.id", ondelete="CASCADE"), primary_key=True,
              autoincrement=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Index("ix_message_payload_text_trgm", "payload", postgresql_using="gin",
             postgresql_ops={"payload": "gin_trgm_ops"},
             postgresql_with={"gin_pending_list_limit": 128}).ddl_if(dialect="postgresql"),
)
#: the ids of the messages stored and not yet copied: added by a trigger on ``message`` in the storing transaction,
#: removed by the move that copies them (no key to ``message``: an id whose message is gone is dropped by that move)
message_payload_pending_table = sa.Table(
    "message_payload_pending", Base.metadata, sa.Column("message_id", BigId, primary_key=True, autoincrement=False))

#: a deleted message taken out of ``message_count``: one row (service, operation, state at the mark, -1) appended
#: by the delete trigger on ``message`` (migration 0014), moved into ``message_count`` by the next fold. No key: the
#: deleting transactions only insert, so concurrent deleters never wait for each other or deadlock.
message_count_delta_table = sa.Table(
    "message_count_delta",
    Base.metadata,
    sa.Column("service", sa.String(100), nullable=False),
    sa.Column("operation", sa.String(100), nullable=False),
    sa.Column("state", _state_type(), nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
)

#: a deleted message's folded transitions into a final state taken out of ``message_finished_minute``: one row (its
#: ``at`` as stored, to state, -1) per transition, appended by the delete trigger on ``message`` (migration 0017) like
#: ``message_count_delta``, moved into the minutes by the next fold.
message_finished_delta_table = sa.Table(
    "message_finished_delta",
    Base.metadata,
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("state", _state_type(), nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
)

message_table: sa.Table = MessageRecord.__table__  # type: ignore[assignment]
external_call_table: sa.Table = ExternalCallRecord.__table__  # type: ignore[assignment]
confirmation_table: sa.Table = ConfirmationRecord.__table__  # type: ignore[assignment]
node_table: sa.Table = NodeRecord.__table__  # type: ignore[assignment]
message_transition_table: sa.Table = MessageTransitionRecord.__table__  # type: ignore[assignment]
entity_call_table: sa.Table = EntityCallRecord.__table__  # type: ignore[assignment]
funnel_lock_table: sa.Table = FunnelLockRecord.__table__  # type: ignore[assignment]
outbox_table: sa.Table = OutboxRecord.__table__  # type: ignore[assignment]
circuit_breaker_table: sa.Table = CircuitBreakerRecord.__table__  # type: ignore[assignment]
call_record_table: sa.Table = CallRecordRecord.__table__  # type: ignore[assignment]
alert_state_table: sa.Table = AlertStateRecord.__table__  # type: ignore[assignment]
throttle_counter_table: sa.Table = ThrottleCounterRecord.__table__  # type: ignore[assignment]
message_count_table: sa.Table = MessageCountRecord.__table__  # type: ignore[assignment]
message_count_mark_table: sa.Table = MessageCountMarkRecord.__table__  # type: ignore[assignment]
message_finished_minute_table: sa.Table = MessageFinishedMinuteRecord.__table__  # type: ignore[assignment]
