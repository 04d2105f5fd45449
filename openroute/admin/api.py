"""The admin API (JSON over HTTP, HTTP Basic): search, detail, restart, cancel, counts, nodes and their state.

Reading needs the ``web`` or the ``admin`` role, acting (restart, cancel, mark-done, call-again, node state) the
``admin`` role.

Every state change goes through the engine (:meth:`Engine.restart`, :meth:`Engine.cancel`), so its stats,
transition listeners and final-state hooks hear of it like of any other change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openroute.admin.action_body import action_body
from openroute.admin.breakers import BreakerAdmin
from openroute.admin.openapi import admin_openapi
from openroute.auth.credentials import AdminAuth
from openroute.auth.cross_site import check_origin, normalize_origins, require_json
from openroute.auth.errors import AuthenticationError, ForbiddenError, TooManyFailedLoginsError, status_and_code
from openroute.definitions.errors import IllegalTransitionError, StaleMessageError
from openroute.engine import Engine
from openroute.engine.in_doubt import InDoubtAction, NoCallInDoubtError, resolve_in_doubt
from openroute.jobs.counts import MessageCounts
from openroute.persistence import MessageState, StoredMessage
from openroute.queries.filters import (
    check_no_nul,
    check_params,
    parse_filters,
    parse_limit,
    parse_message_id,
)
from openroute.queries.messages import MessageNotFoundError, load_message_detail, summaries
from openroute.queries.search import summary_page
from openroute.queries.status import NodeNotFoundError, node_summary, parse_node_state
from openroute.runtime.logs import repeated_errors

log = logging.getLogger("openroute.admin")
T = TypeVar("T")


class JsonAnswer(JSONResponse):
    """A JSON answer written by orjson: the same text as Starlette's :class:`JSONResponse` (compact, UTF-8 as is,
    a ``datetime`` as its ``isoformat()``), in a tenth of the time, on the event loop's thread. A search's page of
    50 took ~0.4 ms there to format its times and encode (orjson: ~0.07 ms). A value orjson cannot write (a float
    NaN is written as null, where the stdlib refuses it; none of the admin API's answers holds one) is a TypeError,
    as with the stdlib."""

    def render(self, content: Any) -> bytes:
        """The JSON body, written by orjson (datetimes as ISO 8601)."""
        return orjson.dumps(content)


class AdminApi:
    """JSON admin endpoints over ``engine.store``; every request needs ``auth`` (HTTP Basic, admin role).

    Without ``auth`` every admin request is refused with 401: the API is never open by accident. An action (POST)
    must send ``Content-Type: application/json`` and, when it names an ``Origin``, come from this node's own or one
    of ``allowed_origins`` (see :mod:`openroute.auth.cross_site`).
    """

    def __init__(
        self, engine: Engine, auth: AdminAuth | None, prefix: str = "/admin", counts: MessageCounts | None = None,
        *, allowed_origins: Iterable[str] = (),
    ) -> None:
        self.engine = engine
        #: origins besides the node's own whose pages may act (``[admin] allowed_origins``)
        self.allowed_origins = normalize_origins(allowed_origins)
        self.store = engine.store
        self.auth = auth
        self.prefix = prefix
        #: state counts of ``GET counts`` (exact, see :class:`MessageCounts`)
        self.message_counts = counts if counts is not None else MessageCounts(engine.store)
        #: ``GET breakers``, ``POST breakers/{system}/state``
        self.breakers = BreakerAdmin(engine)
        self._openapi: bytes | None = None

    def routes(self) -> list[Route]:
        """``GET messages``, ``GET messages/{id}``, ``POST messages/{id}/restart|cancel|mark-done|call-again``,
        ``GET counts``, ``GET nodes``, ``POST nodes/{id}/state``, ``GET breakers``, ``POST breakers/{system}/state``,
        ``GET openapi.json``."""
        p = self.prefix
        return [
            Route(f"{p}/messages", self._guard(self.search), methods=["GET"]),
            Route(p + "/messages/{message_id}", self._guard(self.detail), methods=["GET"]),
            Route(p + "/messages/{message_id}/restart", self._guard(self.restart, act=True), methods=["POST"]),
            Route(p + "/messages/{message_id}/cancel", self._guard(self.cancel, act=True), methods=["POST"]),
            Route(p + "/messages/{message_id}/mark-done", self._guard(self.mark_done, act=True), methods=["POST"]),
            Route(p + "/messages/{message_id}/call-again", self._guard(self.call_again, act=True), methods=["POST"]),
            Route(f"{p}/counts", self._guard(self.counts), methods=["GET"]),
            Route(f"{p}/nodes", self._guard(self.nodes), methods=["GET"]),
            Route(p + "/nodes/{node_id}/state", self._guard(self.node_state, act=True), methods=["POST"]),
            Route(f"{p}/breakers", self._guard(self.breakers.list), methods=["GET"]),
            Route(p + "/breakers/{system}/state", self._guard(self.breakers.force, act=True), methods=["POST"]),
            Route(f"{p}/openapi.json", self.openapi, methods=["GET"]),
        ]

    async def openapi(self, _request: Request) -> Response:
        """The OpenAPI description of these routes (no credentials needed: it holds no data). Rendered once: the
        routes do not change while the node runs, and an unauthenticated request should not cost a document."""
        if self._openapi is None:
            self._openapi = orjson.dumps(admin_openapi(self.prefix))
        return Response(self._openapi, media_type="application/json")

    def _guard(self, handler: Callable[[Request, str], Any], act: bool = False) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                if self.auth is None:
                    raise AuthenticationError("the admin API has no users configured")
                user = self.auth.operator(request.headers, request.client.host if request.client else None, act=act)
                if act:  # a page of another site must not act with the operator's cached credentials
                    check_origin(request.headers, self.allowed_origins)
                    require_json(request.headers)
                check_no_nul(request)
                return cast(Response, await handler(request, user))
            except Exception as error:
                if isinstance(error, IllegalTransitionError | StaleMessageError):
                    status, code = 409, type(error).__name__.removesuffix("Error").upper()
                elif isinstance(error, NoCallInDoubtError):
                    status, code = 409, error.code
                elif isinstance(error, MessageNotFoundError | NodeNotFoundError):
                    status, code = 404, error.code
                else:
                    status, code = status_and_code(error)
                if status == 500:
                    repeated_errors.log(log, "admin request %s failed", request.url.path, error=error)
                    reason = "internal error (see the server log)"
                else:
                    reason = str(error)
                headers = {}
                if isinstance(error, AuthenticationError):
                    headers["WWW-Authenticate"] = 'Basic realm="openroute admin"'
                elif isinstance(error, TooManyFailedLoginsError):
                    headers["Retry-After"] = str(error.retry_after)
                elif isinstance(error, ForbiddenError):
                    log.warning("admin request %s refused: %s", request.url.path, error)
                return JSONResponse({"error": code, "reason": reason}, status, headers=headers)

        return endpoint

    async def _db(self, work: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(work)

    @staticmethod
    def _message_id(request: Request) -> int:
        return parse_message_id(request.path_params["message_id"])

    async def search(self, request: Request, _user: str) -> Response:
        """Messages matching the filters, newest first, in keyset pages (``limit`` up to 500, ``cursor``).

        Filters: ``state`` (repeat), the equality filters, the receive-time window and what went wrong:
        ``error_code`` (repeat or comma-separate for a list), ``error_text``, ``payload_text`` (text inside).

        The answer holds ``items``, ``nextCursor`` (absent on the last page), ``total`` and ``countEstimated``
        (the total is exact up to 1,000 matches, else the database's estimate).
        """
        params = dict(request.query_params)
        check_params(params)
        filters = parse_filters({**params, "state": request.query_params.getlist("state"),
                                 "error_code": request.query_params.getlist("error_code")})
        size_name = "limit" if "limit" in params or "page_size" not in params else "page_size"
        limit = parse_limit(params.get(size_name), size_name)
        cursor = params.get("cursor")
        page = await self._db(lambda: summary_page(self.store, filters, cursor, limit))
        body: dict[str, Any] = {
            "total": page.total,
            "countEstimated": page.total_estimated,
            "limit": limit,
            "items": summaries(page.rows, iso_times=False),
        }
        if page.next_cursor is not None:
            body["nextCursor"] = page.next_cursor
        return JsonAnswer(body)

    async def detail(self, request: Request, _user: str) -> Response:
        """One message with its external calls, children, confirmation and state transitions (oldest first)."""
        message_id = self._message_id(request)

        body = await self._db(lambda: load_message_detail(self.store, message_id))
        if body is None:
            raise MessageNotFoundError(f"no message {message_id}")
        return JSONResponse(body)

    async def _load(self, message_id: int) -> StoredMessage:
        message = await self._db(lambda: self.store.get(message_id))
        if message is None:
            raise MessageNotFoundError(f"no message {message_id}")
        return message

    async def restart(self, request: Request, user: str) -> Response:
        """Restart a FAILED or CANCEL message: -> PARTLY_FAILED, failed count reset, due now; queued at once
        when this node's engine runs (else the next repoll of any node takes it)."""
        message = await self._load(self._message_id(request))
        updated = await self.engine.restart(message.id, cause=f"admin:{user}")
        log.info("message %s restarted by %s from %s (admin API) (%s -> %s)", message.id, user, _address(request),
                 message.state.value, updated.state.value)
        return JSONResponse({"id": updated.id, "previousState": message.state.value, "state": updated.state.value})

    async def mark_done(self, request: Request, user: str) -> Response:
        """Calls in doubt of a FAILED / CANCEL message did happen: record them OK and restart the message (the
        calls are skipped). 409 NO_CALL_IN_DOUBT when it has none, 409 ILLEGALTRANSITION when not restartable."""
        return await self._resolve(request, user, "mark-done")

    async def call_again(self, request: Request, user: str) -> Response:
        """Calls in doubt of a FAILED / CANCEL message did not happen: restart it and make them again with the
        same idempotency key. Same errors as ``mark-done``."""
        return await self._resolve(request, user, "call-again")

    async def _resolve(self, request: Request, user: str, action: InDoubtAction) -> Response:
        message = await self._load(self._message_id(request))
        done = await resolve_in_doubt(self.engine, message.id, action, cause=f"admin:{user}")
        log.info("message %s: calls in doubt %s resolved by %s (%s), restarted", message.id,
                 ", ".join(done.call_keys), user, action)
        return JSONResponse({"id": message.id, "previousState": done.previous_state.value,
                             "state": done.message.state.value, "action": action, "callKeys": list(done.call_keys)})

    async def cancel(self, request: Request, user: str) -> Response:
        """Cancel a message that is not final (and not PROCESSING) through :meth:`Engine.cancel`: stats,
        transition listeners and final-state hooks hear of it, so the source system is told like any outcome."""
        message = await self._load(self._message_id(request))
        updated = await self.engine.cancel(message.id, f"admin:{user}", reason=f"cancelled by operator {user}")
        log.info("message %s cancelled by %s from %s (admin API) (%s -> %s)", message.id, user, _address(request),
                 message.state.value, updated.state.value)
        return JSONResponse({"id": updated.id, "previousState": message.state.value, "state": updated.state.value})

    async def counts(self, _request: Request, _user: str) -> Response:
        """How many messages are in each state (every state listed, zeros included) and the total.

        Every count is exact as of ``finalStatesAsOf`` (when they were read: the stored counts plus the transitions
        since their mark, see :mod:`openroute.jobs.counts`).
        """
        counted = await self._db(self.message_counts.by_state)
        body = {state.value: counted.counts.get(state, 0) for state in MessageState}
        return JSONResponse(
            {"states": body, "total": sum(body.values()), "finalStatesAsOf": counted.final_as_of.isoformat()}
        )

    async def nodes(self, _request: Request, _user: str) -> Response:
        """Every node with its heartbeat, whether it is alive and its state (RUN, HANDLES_EXISTING_MESSAGES,
        STOPPED)."""
        rows = await self._db(self.store.nodes.all)
        now, interval = self.engine.clock.now(), self.engine.settings.heartbeat_interval
        return JSONResponse({"nodes": [node_summary(row, now, interval) for row in rows]})

    async def node_state(self, request: Request, user: str) -> Response:
        """Set a node's state from the JSON body ``{"state": "HANDLES_EXISTING_MESSAGES"}`` (drain), ``STOPPED``
        or ``RUN``, through :meth:`Engine.set_node_state`."""
        node_id = request.path_params["node_id"]
        body = await action_body(request, '{"state": "HANDLES_EXISTING_MESSAGES"}')
        state = parse_node_state(body.get("state"))
        try:
            await self.engine.set_node_state(node_id, state)
        except LookupError:
            raise NodeNotFoundError(f"no node {node_id[:100]!r}") from None
        log.info("node %s set to %s by %s", node_id, state.value, user)
        return JSONResponse({"id": node_id, "state": state.value})


def _address(request: Request) -> str:
    """The caller's address for the log (``?`` when the server does not know it)."""
    return request.client.host if request.client is not None else "?"
