"""The web console: server-rendered pages over the store and the engine for operators (``/console``).

Dashboard, message search (every admin filter, keyset pages), message detail, restart and cancel (one message or
the selected ones), nodes and their state (drain), the error code catalogue. HTTP Basic like the admin API: the
``web`` role reads, the ``admin`` role acts. Every action is a POST carrying a CSRF token (an HMAC of the user
name under a secret), so a page of another site cannot make an operator's browser act::

    from openroute.console import Console

    app = Starlette(routes=[Mount("/console", app=Console(engine, admin_auth).app())])

Every state change goes through the engine (:meth:`Engine.restart`, :meth:`Engine.cancel`,
:meth:`Engine.set_node_state`), with the cause ``console:<user>``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import parse_qs, urlencode

import anyio.to_thread
from lxml import etree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from openroute.auth.credentials import AdminAuth
from openroute.auth.cross_site import check_origin, normalize_origins
from openroute.auth.errors import AuthenticationError, ForbiddenError, TooManyFailedLoginsError
from openroute.console._search import (
    SEARCH_FIELDS,
    listed_messages,
    next_attempt,
    restartable_ids,
    search_page,
    short_time,
)
from openroute.console.catalogue import error_catalogue
from openroute.definitions.errors import IllegalTransitionError, StaleMessageError
from openroute.engine import Engine
from openroute.engine.in_doubt import InDoubtAction, NoCallInDoubtError, resolve_in_doubt
from openroute.persistence import FINAL_STATES, MessageState, NodeState, mask_secrets
from openroute.persistence.breaker import BreakerStore
from openroute.queries.dashboard import THROUGHPUT_BUCKETS, THROUGHPUT_WINDOW, dashboard
from openroute.queries.filters import InvalidQueryError, check_no_nul, parse_message_id
from openroute.queries.messages import MessageNotFoundError, load_message_detail
from openroute.queries.status import NodeNotFoundError, breaker_summary, node_summary, parse_node_state
from openroute.runtime.logs import repeated_errors

log = logging.getLogger("openroute.console")
T = TypeVar("T")
HERE = Path(__file__).parent
CSRF_FIELD = "csrf"
_MAX_FORM = 64 * 1024
_NOTICES = {"restarted": "Restarted.", "cancelled": "Cancelled.", "state": "Node state changed.",
            "mark-done": "Calls in doubt marked done; restarted.",
            "call-again": "Restarted; the calls in doubt are made again."}


class ChannelDeliveries(Protocol):
    """What the dashboard reads of the broker channels this node consumes (the inbound's ``ChannelInbound``): a
    report per channel and when they started. A protocol, so the console imports no other edge."""

    @property
    def started_at(self) -> datetime | None:
        """When the channels started consuming (None before)."""

    def reports(self) -> Sequence[Any]:
        """One report per channel: its route, connector, state and deliveries by outcome."""



class CsrfError(ForbiddenError):
    """A console POST without the page's CSRF token, or from another site (HTTP 403; nothing done)."""

    code = "CSRF"


class Console:
    """The console of ``engine``'s store; ``auth`` as for the admin API (none configured: every page is 401).

    ``csrf_secret`` signs the forms' tokens; give every node the same one when a load balancer spreads an
    operator's requests over several nodes (default: random per process). An action whose ``Origin`` is neither
    this node's nor one of ``allowed_origins`` is refused (see :mod:`openroute.auth.cross_site`).
    """

    def __init__(
        self, engine: Engine, auth: AdminAuth | None, *, csrf_secret: bytes | None = None,
        allowed_origins: Iterable[str] = (), channels: ChannelDeliveries | None = None,
    ) -> None:
        self.engine = engine
        #: the broker channels this node consumes (routes fed by a channel): the dashboard shows their counters
        self.channels = channels
        self.allowed_origins = normalize_origins(allowed_origins)
        self.store = engine.store
        self.auth = auth
        self._secret = csrf_secret or secrets.token_bytes(32)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.filters["pretty"] = pretty_payload
        self.templates.env.filters["dt"] = short_time
        self.templates.env.globals["next_attempt"] = next_attempt
        self.templates.env.filters["masked"] = mask_secrets

    def app(self) -> Starlette:
        """The ASGI app to mount (conventionally at ``/console``)."""
        return Starlette(routes=[
            Route("/", self._page(self.dashboard), methods=["GET"]),
            Route("/messages", self._page(self.messages), methods=["GET"]),
            Route("/messages/bulk", self._page(self.bulk, act=True), methods=["POST"]),
            Route("/messages/restart-matching", self._page(self.restart_matching, act=True), methods=["POST"]),
            Route("/messages/{message_id}", self._page(self.detail), methods=["GET"]),
            Route("/messages/{message_id}/{action}", self._page(self.act, act=True), methods=["POST"]),
            Route("/nodes", self._page(self.nodes), methods=["GET"]),
            Route("/nodes/{node_id}/state", self._page(self.node_state, act=True), methods=["POST"]),
            Route("/errors", self._page(self.errors), methods=["GET"]),
            Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
        ])

    # -- plumbing -----------------------------------------------------------------------------
    def csrf_token(self, user: str) -> str:
        """The token the forms of ``user``'s pages carry."""
        return hmac.new(self._secret, f"console-csrf:{user}".encode(), hashlib.sha256).hexdigest()

    def _page(self, handler: Callable[..., Awaitable[Response]], act: bool = False) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                if self.auth is None:
                    raise AuthenticationError("the console has no users configured (see docs/console.md)")
                user = self.auth.operator(request.headers, _client(request), act=act)
                check_no_nul(request)
                if act:
                    form = await self._form(request)
                    self._check_csrf(request, user, form)
                    return await handler(request, user, form)
                return await handler(request, user)
            except Exception as error:
                return self._error_page(request, error)

        return endpoint

    async def _form(self, request: Request) -> dict[str, list[str]]:
        body = await request.body()
        if len(body) > _MAX_FORM:
            raise InvalidQueryError(f"the form is larger than {_MAX_FORM} bytes")
        try:
            return parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=2000)
        except (UnicodeDecodeError, ValueError) as error:
            raise InvalidQueryError(f"the form cannot be read: {error}") from None

    def _check_csrf(self, request: Request, user: str, form: dict[str, list[str]]) -> None:
        check_origin(request.headers, self.allowed_origins)
        sent = (form.get(CSRF_FIELD) or [""])[0]
        if not hmac.compare_digest(sent.encode(), self.csrf_token(user).encode()):
            raise CsrfError("the form's CSRF token is missing or wrong (reload the page); nothing was done")

    def _error_page(self, request: Request, error: Exception) -> Response:
        headers: dict[str, str] = {}
        if isinstance(error, AuthenticationError):
            status, title = 401, "Sign in needed"
            headers["WWW-Authenticate"] = 'Basic realm="openroute console"'
        elif isinstance(error, ForbiddenError):
            status, title = 403, "Not allowed"
            log.warning("console request %s refused: %s", request.url.path, error)
        elif isinstance(error, TooManyFailedLoginsError):
            status, title = 429, "Too many failed sign-ins"
            headers["Retry-After"] = str(error.retry_after)
        elif isinstance(error, InvalidQueryError):
            status, title = 400, "Bad request"
        elif isinstance(error, MessageNotFoundError | NodeNotFoundError):
            status, title = 404, "Not found"
        elif isinstance(error, IllegalTransitionError | StaleMessageError | NoCallInDoubtError):
            status, title = 409, "Not possible now"
        else:
            repeated_errors.log(log, "console request %s failed", request.url.path, error=error)
            status, title = 500, "Internal error"
            error = RuntimeError("internal error (see the server log)")
        return self.templates.TemplateResponse(
            request, "error.html", {"base": _base(request), "title": title, "reason": str(error), "user": None},
            status_code=status, headers=headers,
        )

    def _render(self, request: Request, user: str, template: str, **context: Any) -> HTMLResponse:
        context.update(base=_base(request), user=user, csrf=self.csrf_token(user), csrf_field=CSRF_FIELD,
                       can_act=self._can_act(request), states=list(MessageState),
                       final_states=FINAL_STATES, notice=_NOTICES.get(request.query_params.get("done", "")))
        return self.templates.TemplateResponse(request, template, context)

    def _can_act(self, request: Request) -> bool:
        if self.auth is None:
            return False
        try:
            self.auth.authorize(request.headers, [self.auth.role], _client(request))
        except ForbiddenError:
            return False
        return True

    async def _db(self, work: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(work)

    @staticmethod
    def _message_id(raw: str) -> int:
        return parse_message_id(raw)

    # -- pages --------------------------------------------------------------------------------
    async def dashboard(self, request: Request, user: str) -> Response:
        """Counts per state and route, throughput of the last hour, the oldest open message, failing routes, the
        external systems holding messages back, and this node's channels with their deliveries by outcome."""
        now = self.engine.clock.now()
        board = await self._db(lambda: dashboard(self.store, now))
        channels = None if self.channels is None else self.channels.reports()
        return self._render(request, user, "dashboard.html", board=board,
                            bucket_minutes=int(THROUGHPUT_WINDOW.total_seconds() / 60
                                               / THROUGHPUT_BUCKETS),
                            channels=channels, channels_since=None if self.channels is None
                            else self.channels.started_at, this_node=self.engine.node_id)

    async def messages(self, request: Request, user: str) -> Response:
        """The search form and one page of results (every admin filter, keyset pages)."""
        params = request.query_params
        page = await self._db(lambda: search_page(self.store, params))
        kept = [(k, v) for k, v in params.multi_items() if k != "cursor" and v]
        next_url = None
        if page.next_cursor is not None:
            next_url = "?" + urlencode([*kept, ("cursor", page.next_cursor)])
        return self._render(request, user, "messages.html", page=page, fields=SEARCH_FIELDS,
                            values={k: params.get(k, "") for k, _ in SEARCH_FIELDS},
                            chosen_states=set(params.getlist("state")), next_url=next_url,
                            query=urlencode(kept), first_url="?" + urlencode(kept) if "cursor" in params else None,
                            rows=listed_messages(page.rows))

    async def detail(self, request: Request, user: str) -> Response:
        """One message: payload, state path, attempts, errors, external calls, children, parent, confirmation."""
        message_id = self._message_id(request.path_params["message_id"])
        body = await self._db(lambda: load_message_detail(self.store, message_id))
        if body is None:
            raise MessageNotFoundError(f"no message {message_id}")
        return self._render(request, user, "message.html", m=body,
                            can_restart=body["state"] in ("FAILED", "CANCEL"),
                            can_cancel=body["state"] in ("NEW", "PARTLY_FAILED", "POSTPONED", "WAITING_FOR_CHILDREN"))

    async def act(self, request: Request, user: str, form: dict[str, list[str]]) -> Response:
        """Restart, cancel, mark-done or call-again one message, then show it again."""
        message_id = self._message_id(request.path_params["message_id"])
        action = request.path_params["action"]
        await self._apply(action, message_id, user, request)
        done = {"restart": "restarted", "cancel": "cancelled"}.get(action, action)
        return RedirectResponse(f"{_base(request)}/messages/{message_id}?done={done}", status_code=303)

    async def bulk(self, request: Request, user: str, form: dict[str, list[str]]) -> Response:
        """Restart or cancel the selected messages; shows what happened to each."""
        action = (form.get("action") or [""])[0]
        if action not in ("restart", "cancel"):
            raise InvalidQueryError(f"action must be restart or cancel, got {action[:40]!r}")
        raw_ids = form.get("id") or []
        if not raw_ids:
            raise InvalidQueryError("select at least one message")
        if len(raw_ids) > 500:
            raise InvalidQueryError(f"at most 500 messages at once, got {len(raw_ids)}")
        ids = list(dict.fromkeys(self._message_id(raw) for raw in raw_ids))
        results = []
        for message_id in ids:
            try:
                await self._apply(action, message_id, user, request)
                results.append((message_id, True, "done"))
            except (MessageNotFoundError, IllegalTransitionError, StaleMessageError) as error:
                results.append((message_id, False, str(error)))
        back = (form.get("back") or [""])[0]
        return self._render(request, user, "bulk.html", action=action, results=results,
                            back="?" + back if back and not back.startswith(("/", "http")) else "")

    async def restart_matching(self, request: Request, user: str, form: dict[str, list[str]]) -> Response:
        """"Restart all matching" of a search: first a page with the count asking to confirm, then (``confirm``
        with the ``expected`` count still right) each message restarted through the engine, as one by one."""
        query = (form.get("query") or [""])[0]
        if len(query) > 8000:
            raise InvalidQueryError("the search is too long")
        pairs = parse_qs(query, keep_blank_values=True, max_num_fields=200)
        ids, restartable = await self._db(lambda: restartable_ids(self.store, pairs))
        expected = (form.get("expected") or [""])[0]
        if (form.get("confirm") or [""])[0] != "yes" or expected != str(len(ids)):
            return self._render(request, user, "restart_matching.html", ids=ids, query=query,
                                restartable=restartable, changed=expected if expected else None)
        results = []
        for message_id in ids:
            try:
                await self._apply("restart", message_id, user, request)
                results.append((message_id, True, "done"))
            except (MessageNotFoundError, IllegalTransitionError, StaleMessageError) as error:
                results.append((message_id, False, str(error)))
        done = sum(1 for _id, ok, _text in results if ok)
        log.info("restart of all %d matching (%s) by %s from %s (console): %d done, %d refused", len(ids), query,
                 user, _address(request), done, len(results) - done)
        return self._render(request, user, "bulk.html", action="restart", results=results, back="?" + query)

    async def _apply(self, action: str, message_id: int, user: str, request: Request | None = None) -> None:
        cause = f"console:{user}"
        try:
            if action == "restart":
                await self.engine.restart(message_id, cause)
            elif action == "cancel":
                await self.engine.cancel(message_id, cause, reason=f"cancelled by operator {user}")
            elif action in ("mark-done", "call-again"):
                await resolve_in_doubt(self.engine, message_id, cast(InDoubtAction, action), cause)
            else:
                raise InvalidQueryError(f"unknown action {action[:40]!r}: restart or cancel")
        except LookupError as error:
            if isinstance(error, MessageNotFoundError | NoCallInDoubtError):
                raise
            raise MessageNotFoundError(f"no message {message_id}") from None
        log.info("message %s: %s by %s from %s (console)", message_id, action, user,
                 _address(request) if request is not None else "?")

    async def nodes(self, request: Request, user: str) -> Response:
        """Nodes with their heartbeat, liveness and state; RUN / drain / stop buttons; the circuit breakers."""
        rows = await self._db(self.store.nodes.all)
        breakers = await self._db(BreakerStore(self.store).all)
        now, interval = self.engine.clock.now(), self.engine.settings.heartbeat_interval
        return self._render(request, user, "nodes.html", nodes=[node_summary(row, now, interval) for row in rows],
                            node_states=list(NodeState), this_node=self.engine.node_id,
                            breakers=[breaker_summary(row, now) for row in breakers])

    async def node_state(self, request: Request, user: str, form: dict[str, list[str]]) -> Response:
        """Set a node's state (drain = HANDLES_EXISTING_MESSAGES)."""
        node_id = request.path_params["node_id"]
        state = parse_node_state((form.get("state") or [None])[0])  # type: ignore[list-item]  # a missing field reaches parse_node_state, which rejects it
        try:
            await self.engine.set_node_state(node_id, state)
        except LookupError:
            raise NodeNotFoundError(f"no node {node_id[:100]!r}") from None
        log.info("node %s set to %s by %s (console)", node_id, state.value, user)
        return RedirectResponse(f"{_base(request)}/nodes?done=state", status_code=303)

    async def errors(self, request: Request, user: str) -> Response:
        """The error code catalogue with how many messages carry each code."""
        catalogue = await self._db(lambda: error_catalogue(self.store))
        return self._render(request, user, "errors.html", catalogue=catalogue)


def _client(request: Request) -> str | None:
    return request.client.host if request.client else None


def _address(request: Request) -> str:
    return request.client.host if request.client is not None else "?"


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def pretty_payload(payload: str, content_type: str = "") -> str:
    """``payload`` indented for reading when it is JSON or XML (parsed safely), else as it is."""
    text = payload.strip()
    if text[:1] in "{[" or "json" in content_type:
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            return payload
    if text[:1] == "<":
        parser = etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=True, huge_tree=False)
        try:
            root = etree.fromstring(text.encode("utf-8"), parser)
        except (etree.XMLSyntaxError, ValueError):
            return payload
        return cast(str, etree.tostring(root, pretty_print=True, encoding="unicode"))
    return payload
