"""The OpenAPI 3.1 description of the admin API, served at ``/admin/openapi.json``.

Kept by hand next to the routes it describes; ``tests/console/test_openapi.py`` checks that every admin route is
described and nothing else is.
"""

from __future__ import annotations

from typing import Any

from openroute.persistence import MessageState, NodeState

TEXT_FILTERS = ("service", "operation", "source_system", "correlation_id", "object_id", "process_id", "entity_type")


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _json(schema_ref: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


_SECURED = {"401": _error("no or wrong credentials"), "403": _error("the user lacks the role"),
            "429": _error("too many failed logins of this user from this address (Retry-After)")}
# an action: JSON only, and from the node's own origin or one of [admin] allowed_origins
_ACTING = {"403": _error("the user lacks the role, or the request came from another site (CROSS_SITE)"),
           "415": _error("the body is not Content-Type: application/json")}
_MESSAGE_ID = {"name": "message_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}}
_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}


def _action(summary: str, description: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary, "description": description, "security": [{"basic": []}],
        "x-required-role": "admin", "parameters": [_MESSAGE_ID],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
        "responses": {"200": _json("ActionResult", "the new state"), "400": _error("bad message id"),
                      "404": _error("no such message"),
                      "409": _error("not allowed from the current state, or changed meanwhile"), **_SECURED,
                      **_ACTING},
    }}


def admin_openapi(prefix: str = "/admin") -> dict[str, Any]:
    """The OpenAPI document of the admin API mounted at ``prefix``."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "openroute admin API", "version": "1",
                 "description": "Search, inspect, restart and cancel messages; nodes and their state; circuit "
                                "breakers. HTTP Basic: the web role reads, the admin role acts."},
        "paths": {**_message_paths(prefix), **_node_and_breaker_paths(prefix)},
        "components": {
            "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}},
            "schemas": _schemas(),
        },
    }


def _search_parameters() -> list[dict[str, Any]]:
    """The query parameters of the message search."""
    return [
        {"name": "state", "in": "query", "style": "form", "explode": True, "description": "repeat for several",
         "schema": {"type": "array", "items": {"$ref": "#/components/schemas/MessageState"}}},
        *({"name": name, "in": "query", "schema": {"type": "string", "minLength": 1, "maxLength": 255}}
          for name in TEXT_FILTERS),
        {"name": "received_from", "in": "query", "description": "inclusive, ISO 8601 with a time zone",
         "schema": _TIME},
        {"name": "received_to", "in": "query", "description": "exclusive, ISO 8601 with a time zone",
         "schema": _TIME},
        {"name": "error_code", "in": "query", "style": "form", "explode": True,
         "description": "the current error code is one of these (repeat, or comma-separate)",
         "schema": {"type": "array", "items": {"type": "string", "maxLength": 100}}},
        {"name": "error_text", "in": "query", "description": "text inside the current error text (any case)",
         "schema": {"type": "string", "minLength": 1, "maxLength": 255}},
        {"name": "payload_text", "in": "query", "description": "text inside the payload (any case)",
         "schema": {"type": "string", "minLength": 1, "maxLength": 255}},
        {"name": "cursor", "in": "query", "description": "nextCursor of the previous page",
         "schema": {"type": "string"}},
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}},
        {"name": "page_size", "in": "query", "deprecated": True, "description": "the old name of limit",
         "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
    ]


def _summary_properties() -> dict[str, Any]:
    """The properties of a message in a search page (and of the detail, which adds to them)."""
    return {
        "id": {"type": "integer"}, "state": {"$ref": "#/components/schemas/MessageState"},
        **{name: {"type": ["string", "null"]} for name in (
            "service", "operation", "sourceSystem", "correlationId", "processId", "objectId", "entityType",
            "funnelValue", "lastErrorCode")},
        "failedCount": {"type": "integer"}, "receivedAt": _TIME, "lastUpdateAt": _TIME,
        "nextAttemptAt": _NULLABLE_TIME, "parentId": {"type": ["integer", "null"]},
        "parkedOn": {"type": ["string", "null"], "description": "the external system the message waits for (parked on "
                     "its open circuit breaker, or failed on a call of it); null otherwise"},
    }


def _message_paths(p: str) -> dict[str, Any]:
    """The message search, detail and actions under the prefix ``p``."""
    search_parameters = _search_parameters()
    return {
    f"{p}/messages": {"get": {
        "summary": "Search messages, newest first, in keyset pages",
        "security": [{"basic": []}], "x-required-role": "web", "parameters": search_parameters,
        "responses": {"200": _json("SearchPage", "one page"),
                      "400": _error("unknown or malformed parameter, or a bad cursor"), **_SECURED},
    }},
    f"{p}/messages/{{message_id}}": {"get": {
        "summary": "One message with its calls, children, confirmation and state transitions",
        "security": [{"basic": []}], "x-required-role": "web", "parameters": [_MESSAGE_ID],
        "responses": {"200": _json("MessageDetail", "the message"), "400": _error("bad message id"),
                      "404": _error("no such message"), **_SECURED},
    }},
    f"{p}/messages/{{message_id}}/restart": _action(
        "Restart a FAILED or CANCEL message", "PARTLY_FAILED, failed count 0, due now (Engine.restart)."),
    f"{p}/messages/{{message_id}}/mark-done": _action(
        "Calls in doubt did happen: record them OK and restart the message",
        "For a FAILED / CANCEL message with calls in doubt (error code CALL_IN_DOUBT): the calls are recorded "
        "OK and skipped by the next attempt. 409 NO_CALL_IN_DOUBT when it has none."),
    f"{p}/messages/{{message_id}}/call-again": _action(
        "Calls in doubt did not happen: restart the message and make them again",
        "For a FAILED / CANCEL message with calls in doubt: the next attempt makes them again with the same "
        "idempotency key. 409 NO_CALL_IN_DOUBT when it has none."),
    f"{p}/messages/{{message_id}}/cancel": _action(
        "Cancel a message that is not final",
        "CANCEL with error code CANCELLED; the source system is told (Engine.cancel)."),
    }


def _web_read(summary: str, schema: str, description: str) -> dict[str, Any]:
    """A GET for the web role answered with one JSON document of ``schema``."""
    return {"get": {
        "summary": summary, "security": [{"basic": []}], "x-required-role": "web",
        "responses": {"200": _json(schema, description), **_SECURED},
    }}


def _state_change(summary: str, parameter: str, state: dict[str, Any], result: tuple[str, str],
                  errors: dict[str, Any]) -> dict[str, Any]:
    """A POST for the admin role that sets the ``state`` of the thing named by the path ``parameter``."""
    return {"post": {
        "summary": summary, "security": [{"basic": []}], "x-required-role": "admin",
        "parameters": [{"name": parameter, "in": "path", "required": True, "schema": {"type": "string"}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["state"], "properties": {"state": state}}}}},
        "responses": {"200": _json(*result), **errors},
    }}


def _node_and_breaker_paths(p: str) -> dict[str, Any]:
    """Counts, nodes, breakers and this document under the prefix ``p``."""
    return {
    f"{p}/counts": _web_read("How many messages are in each state", "Counts", "every state, zeros included"),
    f"{p}/nodes": _web_read("Every node with its heartbeat and state", "Nodes", "the nodes"),
    f"{p}/nodes/{{node_id}}/state": _state_change(
        "Set a node's state (HANDLES_EXISTING_MESSAGES drains it)", "node_id",
        {"$ref": "#/components/schemas/NodeState"}, ("NodeStateResult", "the node's new state"),
        {"400": _error("not JSON, or an unknown state"), "404": _error("no such node"), **_SECURED, **_ACTING}),
    f"{p}/breakers": _web_read("The circuit breaker of every external system", "Breakers", "the breakers"),
    f"{p}/breakers/{{system}}/state": _state_change(
        "Force a circuit breaker OPEN (until an admin closes it) or CLOSED", "system",
        {"type": "string", "enum": ["OPEN", "CLOSED"]}, ("Breaker", "the breaker's new state"),
        {"400": _error("not JSON, or a state other than OPEN / CLOSED"),
         "415": _error("the body is not application/json"), **_SECURED}),
    f"{p}/openapi.json": {"get": {
        "summary": "This description", "security": [],
        "responses": {"200": {"description": "the OpenAPI document",
                              "content": {"application/json": {"schema": {"type": "object"}}}}},
    }},
    }


def _schemas() -> dict[str, Any]:
    """The schemas the paths refer to."""
    summary_properties = _summary_properties()
    return {
        "MessageState": {"type": "string", "enum": [s.value for s in MessageState]},
        "NodeState": {"type": "string", "enum": [s.value for s in NodeState]},
        "Error": {"type": "object", "required": ["error", "reason"],
                  "properties": {"error": {"type": "string", "description": "a code, e.g. INVALID_QUERY"},
                                 "reason": {"type": "string"}}},
        "MessageSummary": {"type": "object", "properties": summary_properties},
        "SearchPage": {"type": "object", "required": ["items", "total"], "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/MessageSummary"}},
            "total": {"type": "integer"}, "countEstimated": {"type": "boolean"},
            "limit": {"type": "integer"},
            "nextCursor": {"type": "string", "description": "absent on the last page"}}},
        "MessageDetail": {"type": "object", "properties": {
            **summary_properties, "payload": {"type": "string"}, "contentType": {"type": "string"},
            "headers": {"type": "object"}, "customData": {"type": "object"},
            "businessErrors": {"type": "array", "items": {"type": "object"}},
            "lastErrorText": {"type": ["string", "null"]}, "nodeId": {"type": ["string", "null"]},
            "lastErrorTrace": {"type": ["string", "null"],
                               "description": "traceback of the current state's unexpected error"},
            "version": {"type": "integer"},
            "attempts": {"type": "integer", "description": "attempts over the message's whole history, restarts "
                         "included (failedCount counts the failures since the last restart)"},
            "externalCalls": {"type": "array", "items": {"type": "object", "properties": {
                "callKey": {"type": "string"}, "status": {"type": "string"},
                "attempts": {"type": "integer", "description": "calls made"},
                "refused": {"type": "integer", "description": "calls the circuit breaker refused (not made)"}}}},
            "callRecords": {"type": "array", "items": {"type": "object"}},
            "children": {"type": "array", "items": {"$ref": "#/components/schemas/MessageSummary"}},
            "confirmation": {"type": ["object", "null"]},
            "transitions": {"type": "array", "items": {"type": "object", "properties": {
                "fromState": {"type": ["string", "null"]}, "toState": {"type": "string"}, "at": _TIME,
                "nodeId": {"type": ["string", "null"]}, "attempt": {"type": "integer"},
                "errorCode": {"type": ["string", "null"]}, "errorText": {"type": ["string", "null"]},
                "errorTrace": {"type": ["string", "null"]}, "cause": {"type": "string"}}}}}},
        "ActionResult": {"type": "object", "properties": {
            "id": {"type": "integer"}, "previousState": {"$ref": "#/components/schemas/MessageState"},
            "state": {"$ref": "#/components/schemas/MessageState"}}},
        "Counts": {"type": "object", "properties": {
            "states": {"type": "object", "additionalProperties": {"type": "integer"}},
            "total": {"type": "integer"}}},
        "Node": {"type": "object", "properties": {
            "id": {"type": "string"}, "host": {"type": ["string", "null"]},
            "pid": {"type": ["integer", "null"]}, "state": {"$ref": "#/components/schemas/NodeState"},
            "alive": {"type": "boolean"}, "startedAt": _TIME, "heartbeatAt": _TIME,
            "stoppedAt": _NULLABLE_TIME}},
        "Nodes": {"type": "object", "properties": {
            "nodes": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}},
        "Breaker": {"type": "object", "properties": {
            "system": {"type": "string"}, "state": {"type": "string", "enum": ["CLOSED", "OPEN", "HALF_OPEN"]},
            "since": _TIME, "openUntil": _NULLABLE_TIME, "forced": {"type": "boolean"},
            "reason": {"type": ["string", "null"]}, "trialsInFlight": {"type": "integer"},
            "trialSuccesses": {"type": "integer"}, "declared": {"type": "boolean"}}},
        "Breakers": {"type": "object", "properties": {
            "breakers": {"type": "array", "items": {"$ref": "#/components/schemas/Breaker"}}}},
        "NodeStateResult": {"type": "object", "properties": {
            "id": {"type": "string"}, "state": {"$ref": "#/components/schemas/NodeState"}}},
    }
