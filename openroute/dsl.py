"""The route DSL: one fluent sentence per route, producing a :class:`~openroute.definitions.route.Route` and its
bindings.

::

    from openroute import Application, route

    set_customer = (
        route("crm", "setCustomer")
        .soap("{http://openroute.dev/crm}setCustomerRequest", namespaces={"c": "http://openroute.dev/crm"})
        .json()
        .require("c:customer/c:id", json="$.customer.id")
        .object_id("c:customer/c:id", json="$.customer.id")
        .entity_type("customer")
        .obsolete_check()
        .retry(max_attempts=5, interval=timedelta(seconds=30), backoff=2)
        .ext_call("billing", charge_billing)
        .ext_call("mno", activate_sim)
    )
    app = Application(set_customer)          # app.routes (RouteRegistry) + app.bindings (InboundBinding list)

Every builder is immutable: each clause returns a new builder, so a half-built route can be shared as a
template. ``build()`` (and :class:`Application`) check the definition and raise
:class:`~openroute.definitions.errors.DeploymentError` naming the route for anything that cannot work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from lxml import etree
from pydantic import BaseModel

from openroute.definitions.binding import ChannelBinding, Extractor, InboundBinding, ParsedPayload, QName, Validator
from openroute.definitions.body import Body
from openroute.definitions.errors import ConfigurationError, DeploymentError
from openroute.definitions.interceptors import MessageInterceptor
from openroute.definitions.retry import ErrorAction, ErrorPolicy, RetryPolicy, check_error_policies
from openroute.definitions.route import ExtCallScope, Route, RouteRegistry
from openroute.definitions.sub_route import Steps

__all__ = ["Application", "RouteBuilder", "RouteDefinition", "route"]


@dataclass(frozen=True)
class RouteDefinition:
    """What :meth:`RouteBuilder.build` produces: the engine's route and the inbound bindings that feed it (HTTP
    ``bindings``; broker ``channels``)."""

    route: Route
    bindings: tuple[InboundBinding, ...]
    channels: tuple[ChannelBinding, ...] = ()


@dataclass(frozen=True)
class RouteBuilder(Steps):
    """The fluent builder of one route (start it with :func:`route`)."""

    is_route: ClassVar[bool] = True

    service: str = ""
    operation: str = ""
    soap_element: str | None = None
    soap_action: str | None = None
    soap_schema: str | Path | None = None
    accepts_json: bool = False
    namespaces: Mapping[str, str] = field(default_factory=dict)
    required_xml: tuple[str, ...] = ()
    required_json: tuple[str, ...] = ()
    validators: tuple[Validator, ...] = ()
    extractors: Mapping[str, tuple[Extractor | None, Extractor | None]] = field(default_factory=dict)
    #: the options of the :class:`Route` it builds, under the Route's own field names (``retry_policy``,
    #: ``obsolete_check``, ``guaranteed_order``, ``ext_call_scope``, ``interceptors``, ...)
    route_fields: Mapping[str, Any] = field(default_factory=dict)
    #: incoming channels feeding this route (:meth:`from_channel`; an optional one starts with ``?``)
    channels: tuple[str, ...] = ()

    def _with(self, **route_fields: Any) -> Self:
        return dataclasses.replace(self, route_fields={**self.route_fields, **route_fields})

    @property
    def _what(self) -> str:
        return f"route {self.service}/{self.operation}"

    # -- identify -----------------------------------------------------------------------------------
    def soap(self, element: str | QName | None = None, *, action: str | None = None,
             namespaces: Mapping[str, str] | None = None, schema: str | Path | None = None) -> Self:
        """Accept SOAP 1.1/1.2 requests whose Body element is ``element`` (``{uri}local``) and/or whose
        SOAPAction is ``action``; ``namespaces`` are the prefixes the XPaths of this route use; ``schema`` an XSD
        file declaring the element: requests are validated against it and the WSDL describes the element with it."""
        if element is None and action is None:
            element = self._default_element()
        if action is not None and (not isinstance(action, str) or not action.strip()):
            raise DeploymentError(f"{self._what}: soap: action must be a non-empty string, got {action!r}")
        for prefix, uri in (namespaces or {}).items():
            if not isinstance(prefix, str) or not prefix.strip() or ":" in prefix:
                raise DeploymentError(f"{self._what}: soap: namespace prefix {prefix!r} must be a non-empty name "
                                      "(XPath has no default namespace: give it a prefix)")
            if not isinstance(uri, str) or not uri.strip():
                raise DeploymentError(f"{self._what}: soap: namespace {prefix!r} needs a URI, got {uri!r}")
        try:
            qname = None if element is None else str(QName(element))
        except (ValueError, TypeError) as error:
            raise DeploymentError(f"{self._what}: soap: invalid element {element!r}: {error}") from None
        merged = {**self.namespaces, **(namespaces or {})}
        return dataclasses.replace(self, soap_element=qname, soap_action=action, namespaces=merged, soap_schema=schema)

    def json(self) -> Self:
        """Accept JSON objects at ``POST /api/<service>/<operation>``."""
        return dataclasses.replace(self, accepts_json=True)

    def from_channel(self, channel: str, *, optional: bool = False) -> Self:
        """Also (or only: without ``.soap()`` / ``.json()`` no HTTP endpoint serves the route) take messages from
        the incoming channel ``channel``, bound to a connector in the configuration
        (``openroute.messaging.incoming.<channel>.connector = "amqp"``); each delivery is checked and stored like an
        HTTP request, then acknowledged (docs/channels.md). An ``optional`` channel the configuration does not bind
        is left out at start; a required one without a connector stops the start."""
        if not isinstance(channel, str) or not channel.strip() or channel != channel.strip():
            raise DeploymentError(f"{self._what}: from_channel: a channel name must be a non-empty string without "
                                  f"surrounding spaces, got {channel!r}")
        if channel in self.channels or f"?{channel}" in self.channels:
            raise DeploymentError(f"{self._what}: from_channel: channel {channel!r} is given twice")
        return dataclasses.replace(self, channels=(*self.channels, f"?{channel}" if optional else channel))

    # -- validate -----------------------------------------------------------------------------------
    def require(self, *xpaths: str, json: str | Sequence[str] = ()) -> Self:
        """Paths that must match a non-empty value: XPaths (SOAP) and ``json=`` JSON paths (``$.a.b``)."""
        json_paths = (json,) if isinstance(json, str) else tuple(json)
        return dataclasses.replace(self, required_xml=(*self.required_xml, *xpaths),
                                   required_json=(*self.required_json, *json_paths))

    def validate(self, validator: Validator) -> Self:
        """A custom check ``validator(parsed_payload)`` raising ``ValidationError`` (HTTP 400 / Fault)."""
        if not callable(validator):
            raise DeploymentError(f"{self._what}: validator {validator!r} is not callable")
        return dataclasses.replace(self, validators=(*self.validators, validator))

    def body(self, model: type[BaseModel], *, xml: type[BaseModel] | None = None) -> Self:
        """The body is a ``model`` (a pydantic model): a payload that does not validate is refused at accept with
        its field errors (HTTP 400 / SOAP Fault, nothing stored); steps read it bound as ``exchange.body``
        (:mod:`openroute.definitions.body`). ``xml`` gives the SOAP request element a model of its own."""
        try:
            chosen = Body(json=model, xml=xml if xml is not None else model)
        except ConfigurationError as error:
            raise DeploymentError(f"{self._what}: {error}") from None
        return self._with(body=chosen)

    # -- extract ------------------------------------------------------------------------------------
    def _extract(self, name: str, xml: Extractor | None, json_path: Extractor | None) -> Self:
        return dataclasses.replace(self, extractors={**self.extractors, name: (xml, json_path)})

    def object_id(self, xpath: Extractor | None = None, *, json: Extractor | None = None) -> Self:
        """Where the object id is: an XPath (SOAP), ``json=`` a JSON path, or a callable of the parsed payload
        (for both endpoints)."""
        if xpath is None and json is None:
            raise DeploymentError(f"{self._what}: object_id needs an XPath, a JSON path "
                                  "or a callable")
        return self._extract("object_id", xpath, json if json is not None else (xpath if callable(xpath) else None))

    def entity_type(self, value: str | Extractor | None = None, *, json: Extractor | None = None) -> Self:
        """The entity type (default: the operation). A plain word (letters, digits, ``_``, ``-``) is a constant
        for both endpoints; otherwise ``value`` is an XPath (SOAP) or a callable of the parsed payload, and
        ``json=`` a JSON path. Shared across operations, the entity type makes obsolete detection and
        entity-scoped external calls span them."""
        if value is None and json is None:
            raise DeploymentError(f"{self._what}: entity_type needs a value")
        if isinstance(value, str) and json is None and value.replace("_", "").replace("-", "").isalnum():
            constant = value
            return self._extract("entity_type", lambda _p: constant, lambda _p: constant)
        return self._extract("entity_type", value, json if json is not None else (value if callable(value) else None))

    def funnel(self, xpath: Extractor | None = None, *, json: Extractor | None = None,
               guaranteed_order: bool | None = None) -> Self:
        """Funnel by this value (at most one message per value PROCESSING); with ``guaranteed_order`` an older
        unfinished message also holds newer ones POSTPONED until it is final (None: as set by
        :meth:`guaranteed_order`, off by default)."""
        if xpath is None and json is None:
            raise DeploymentError(f"{self._what}: funnel needs an XPath, a JSON path "
                                  "or a callable")
        json_path = json if json is not None else (xpath if callable(xpath) else None)
        builder = self._extract("funnel_value", xpath, json_path)
        return builder if guaranteed_order is None else builder._with(guaranteed_order=guaranteed_order)

    # -- behaviour ----------------------------------------------------------------------------------
    def retry(self, policy: RetryPolicy | None = None, **settings: Any) -> Self:
        """The route's retry policy: a :class:`RetryPolicy` or its keyword arguments
        (``max_attempts``, ``interval``, ``backoff``, ``max_interval``, ``jitter``)."""
        if policy is not None and settings:
            raise DeploymentError(f"{self._what}: retry: give a RetryPolicy or keyword settings, not both")
        try:
            chosen = policy if policy is not None else RetryPolicy(**settings)
        except (TypeError, ConfigurationError) as error:
            raise DeploymentError(f"{self._what}: bad retry policy: {error}") from None
        if not isinstance(chosen, RetryPolicy):
            raise DeploymentError(f"{self._what}: retry needs a RetryPolicy")
        return self._with(retry_policy=chosen)

    def on_error(self, *errors: str | type[BaseException], retry: RetryPolicy | bool | None = None,
                 fail: bool = False) -> Self:
        """Give the errors named here a policy of their own (Camel's ``onException``); the others keep :meth:`retry`.

        ``errors`` are error codes or patterns of them (``"TIMEOUT"``, ``"HTTP_5*"``: a step's
        ``TechnicalError``/``BusinessError`` code, or an exception's class name) and exception classes. Say what
        happens with exactly one of:

        - ``retry=RetryPolicy(...)``: retried per this policy (a business error too: it is then retried);
        - ``retry=True``: retried per the route's own policy (e.g. an HTTP 423 answer, a business error otherwise);
        - ``retry=False``: never retried: FAILED after this attempt, as the technical error it is;
        - ``fail=True``: FAILED at once as a business error (kept for the confirmation, no attempt counted).

        The first ``on_error`` naming an error decides (declare the narrow ones first). Raises DeploymentError
        naming the route for a policy that cannot work (no error, both or none of ``retry`` and ``fail``, an error
        named twice or decided by the engine itself)."""
        what = f"{self._what}: on_error"
        if fail is not False and fail is not True:
            raise DeploymentError(f"{what}: fail must be True or False, got {fail!r}")
        if (retry is None) == (not fail):
            raise DeploymentError(f"{what}: say what happens with exactly one of retry=RetryPolicy(...)/True/False "
                                  f"and fail=True, got retry={retry!r}, fail={fail!r}")
        if retry is not None and not isinstance(retry, RetryPolicy | bool):
            raise DeploymentError(f"{what}: retry must be a RetryPolicy, True or False, got {retry!r}")
        action = (ErrorAction.FAIL if fail else ErrorAction.NEVER_RETRY if retry is False else ErrorAction.RETRY)
        codes = tuple(e for e in errors if isinstance(e, str))
        exceptions = tuple(e for e in errors if not isinstance(e, str))
        try:
            policy = ErrorPolicy(codes, exceptions, action, retry if isinstance(retry, RetryPolicy) else None)
        except ConfigurationError as error:
            raise DeploymentError(f"{self._what}: {error}") from None
        known = (*self.route_fields.get("error_policies", ()), policy)
        problems = check_error_policies(known, self.route_fields.get("business_exceptions", ()))
        if problems:
            raise DeploymentError([f"{self._what}: {problem}" for problem in problems])
        return self._with(error_policies=known)

    def guaranteed_order(self, enabled: bool = True) -> Self:
        """Keep messages of one funnel value in receive order (see :meth:`funnel`)."""
        return self._with(guaranteed_order=enabled)

    def obsolete_check(self, enabled: bool = True) -> Self:
        """Skip a message when a newer one for the same entity type + object id already ended OK."""
        return self._with(obsolete_check=enabled)

    def on_business_error(self, action: Literal["continue", "fail"],
                          *expected: type[BaseException]) -> Self:
        """What a business error does: ``"fail"`` ends the message FAILED at once, ``"continue"`` records it
        and goes on with the next step. ``expected`` exception types are business errors too."""
        if action not in ("continue", "fail"):
            raise DeploymentError(f"{self._what}: on_business_error: action must be 'continue' or 'fail', "
                                  f"got {action!r}")
        if not all(isinstance(e, type) and issubclass(e, BaseException) for e in expected):
            raise DeploymentError(f"{self._what}: on_business_error: expected must be exception classes")
        known = tuple(self.route_fields.get("business_exceptions", ()))
        return self._with(continue_on_business_error=action == "continue", business_exceptions=(*known, *expected))

    def ext_call_scope(self, scope: ExtCallScope | Literal["message", "entity"]) -> Self:
        """Default scope of this route's external calls: once per message or once per entity."""
        if scope not in tuple(ExtCallScope):
            raise DeploymentError(f"{self._what}: ext_call_scope must be 'message' or 'entity', got {scope!r}")
        return self._with(ext_call_scope=ExtCallScope(scope))

    def intercept(self, *interceptors: MessageInterceptor) -> Self:
        """Interceptors around every delivery and step of this route (after the engine-wide ones)."""
        for interceptor in interceptors:
            if not isinstance(interceptor, MessageInterceptor):
                raise DeploymentError(f"{self._what}: intercept: {interceptor!r} is not a MessageInterceptor")
        known = tuple(self.route_fields.get("interceptors", ()))
        return self._with(interceptors=(*known, *interceptors))

    # -- build --------------------------------------------------------------------------------------
    def build(self) -> RouteDefinition:
        """Check the definition and produce the :class:`RouteDefinition` (DeploymentError naming the route)."""
        what = self._what
        if not self.chain:
            raise DeploymentError(f"{what} has no processing steps")
        children = tuple((s or self.service, o) for s, o in self.child_routes)
        try:
            built = Route(self.service, self.operation, self.chain, child_routes=children, **self.route_fields)
            bindings = self._bindings()
            channels = self._channel_bindings()
        except ConfigurationError as error:
            text = str(error)
            raise DeploymentError(text if text.startswith(f"{what}:") else f"{what}: {text}") from None
        checked = [*bindings, *(b for c in channels for b in (c.xml, c.json) if b is not None and b not in bindings)]
        problems = [f"{what}: {problem}" for problem in self._unusable_xpaths(checked)]
        if problems:
            raise DeploymentError(problems)
        return RouteDefinition(built, bindings, channels)

    def _channel_bindings(self) -> tuple[ChannelBinding, ...]:
        """One :class:`ChannelBinding` per :meth:`from_channel`, with the route's checks for the bodies it declares:
        XML when it declares its SOAP request (:meth:`soap`), JSON when it declares :meth:`json` or no SOAP."""
        if not self.channels:
            return ()
        soap = self.soap_element is not None or self.soap_action is not None
        both = dataclasses.replace(self, accepts_json=self.accepts_json or not soap, channels=())._bindings()
        xml = next((b for b in both if b.content_type == "xml"), None) if soap else None
        json_binding = next((b for b in both if b.content_type == "json"), None)
        return tuple(ChannelBinding(name.removeprefix("?"), self.service, self.operation, json=json_binding, xml=xml,
                                    optional=name.startswith("?"))
                     for name in self.channels)

    def _unusable_xpaths(self, bindings: Sequence[InboundBinding]) -> list[str]:
        """XPaths that compile but can never be evaluated (an undeclared prefix, an unknown function): lxml only
        finds out at evaluation, so each one is run once against an empty element here, at build time."""
        probe = etree.Element("probe")
        problems = []
        for binding in bindings:
            if binding.content_type != "xml":
                continue
            expressions = [*binding.required, *(e for e in (binding.object_id, binding.entity_type,
                                                            binding.funnel_value) if isinstance(e, str))]
            for expression in expressions:
                try:
                    etree.XPath(expression, namespaces=dict(binding.namespaces))(probe)
                except etree.XPathError as error:
                    problems.append(f"XPath {expression!r} cannot be evaluated: {error}")
        return problems

    def _default_element(self) -> str:
        return f"{{urn:openroute:service:{self.service}}}{self.operation}"

    def _bindings(self) -> tuple[InboundBinding, ...]:
        soap = self.soap_element is not None or self.soap_action is not None
        serve_json = self.accepts_json
        if not soap and not serve_json and not self.channels:  # no clause given: both endpoints, default element
            soap = serve_json = True
        xml_extract = {name: pair[0] for name, pair in self.extractors.items() if pair[0] is not None}
        json_extract = {name: pair[1] for name, pair in self.extractors.items() if pair[1] is not None}
        result: list[InboundBinding] = []
        if soap:
            element = self.soap_element if self.soap_element or self.soap_action else self._default_element()
            result.append(InboundBinding(
                self.service, self.operation, "xml", request_element=element, soap_action=self.soap_action,
                schema=self.soap_schema, required=self.required_xml, namespaces=self.namespaces,
                validators=self.validators,
                **xml_extract,
            ))
        if serve_json:
            result.append(InboundBinding(
                self.service, self.operation, "json", required=self.required_json, validators=self.validators,
                **json_extract,  # type: ignore[arg-type]
            ))
        return tuple(result)


def route(service: str, operation: str) -> RouteBuilder:
    """Start the definition of the route of (``service``, ``operation``), the dynamic routing key."""
    for name, value in (("service", service), ("operation", operation)):
        if not isinstance(value, str) or not value.strip() or len(value) > 100:
            raise DeploymentError(f"route {name} must be a non-empty string of at most 100 characters, got {value!r}")
    return RouteBuilder(service=service, operation=operation)


class Application:
    """The one application container: what ``openroute run --routes module:attr`` serves.

    ``routes`` is the engine's :class:`RouteRegistry`, ``bindings`` the inbound bindings (None only for an
    application made by :meth:`of` from a bare registry: the default bindings). The keyword-only ``mounts``
    (``(path, ASGI app)`` pairs added to the server's app) and ``notes`` (strings printed at start) are kept as
    tuples. Raises one :class:`DeploymentError` listing every problem: duplicate routes, two routes on one SOAP
    element or SOAPAction, splits into unregistered routes, unfinished or broken definitions; a malformed mount
    or note is a :class:`ConfigurationError`.
    """

    routes: RouteRegistry
    bindings: list[InboundBinding] | None
    channels: list[ChannelBinding]

    def __init__(self, *definitions: RouteBuilder | RouteDefinition,
                 mounts: Iterable[tuple[str, Any]] = (), notes: Iterable[str] = ()) -> None:
        self._mounts, self._notes = checked_mounts(mounts), checked_notes(notes)
        problems: list[str] = []
        built = _built(definitions, problems)
        self.routes = RouteRegistry()
        for definition in built:
            try:
                self.routes.register(definition.route)
            except DeploymentError as error:
                problems.extend(error.problems)
        problems.extend(_shared_soap_keys(built))
        problems.extend(_shared_channels(built))
        try:
            self.routes.check()
        except DeploymentError as error:
            problems.extend(error.problems)
        if problems:
            raise DeploymentError(problems)
        self.bindings = [b for d in built for b in d.bindings]
        #: the routes' broker channels (:meth:`RouteBuilder.from_channel`)
        self.channels = [c for d in built for c in d.channels]

    @classmethod
    def of(cls, routes: RouteRegistry, bindings: Iterable[InboundBinding] | None = None, *,
           mounts: Iterable[tuple[str, Any]] = (), notes: Iterable[str] = ()) -> Application:
        """An application of an already built ``routes`` registry and its ``bindings`` (None: the defaults)."""
        if not isinstance(routes, RouteRegistry):
            raise ConfigurationError(f"routes must be a RouteRegistry, got {routes!r}")
        bound = None if bindings is None else list(bindings)
        if bound is not None and not all(isinstance(b, InboundBinding) for b in bound):
            raise ConfigurationError("bindings must be InboundBinding objects")
        application = cls.__new__(cls)
        application._mounts, application._notes = checked_mounts(mounts), checked_notes(notes)
        application.routes, application.bindings = routes, bound
        application.channels = []
        return application

    @property
    def mounts(self) -> tuple[tuple[str, Any], ...]:
        """``(path, ASGI app)`` pairs added to the server's app (paths without a trailing ``/``)."""
        return self._mounts

    @property
    def notes(self) -> tuple[str, ...]:
        """Strings ``openroute run`` prints at start."""
        return self._notes

    def __repr__(self) -> str:
        return f"Application({', '.join(f'{r.service}/{r.operation}' for r in self.routes)})"


def _built(definitions: Sequence[RouteBuilder | RouteDefinition], problems: list[str]) -> list[RouteDefinition]:
    """The definitions, builders built; what cannot be built goes to ``problems``."""
    built: list[RouteDefinition] = []
    for definition in definitions:
        if isinstance(definition, RouteBuilder):
            try:
                built.append(definition.build())
            except DeploymentError as error:
                problems.extend(error.problems)
        elif isinstance(definition, RouteDefinition):
            built.append(definition)
        else:
            problems.append(f"expected a route builder or definition, got {definition!r}")
    return built


def _shared_soap_keys(built: Sequence[RouteDefinition]) -> list[str]:
    """A SOAP element or SOAPAction of a service bound to two routes."""
    problems: list[str] = []
    seen: dict[tuple[str, str], str] = {}
    for definition in built:
        for binding in definition.bindings:
            keys = []
            if binding.content_type == "xml":
                if binding.request_element is not None:
                    keys.append(("SOAP element", f"{binding.service} {binding.request_element}"))
                if binding.soap_action:
                    keys.append(("SOAPAction", f"{binding.service} {binding.soap_action}"))
            for kind, key in keys:
                owner = f"{binding.service}/{binding.operation}"
                if (kind, key) in seen and seen[(kind, key)] != owner:
                    problems.append(f"{kind} {key} is bound to both {seen[(kind, key)]} and {owner}")
                seen.setdefault((kind, key), owner)
    return problems


def _shared_channels(built: Sequence[RouteDefinition]) -> list[str]:
    """A broker channel feeding two routes."""
    problems: list[str] = []
    fed: dict[str, str] = {}
    for definition in built:
        for channel in definition.channels:
            owner = f"{channel.service}/{channel.operation}"
            if channel.channel in fed and fed[channel.channel] != owner:
                problems.append(f"channel {channel.channel} feeds both {fed[channel.channel]} and {owner}")
            fed.setdefault(channel.channel, owner)
    return problems


def checked_mounts(mounts: Iterable[Any]) -> tuple[tuple[str, Any], ...]:
    """``(path, ASGI app)`` pairs with the path's trailing ``/`` removed; raises ConfigurationError for others."""
    checked = []
    for item in mounts:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and item[0].startswith("/") and item[0] != "/" and callable(item[1])):
            raise ConfigurationError(f"a mount must be a ('/path', ASGI app) pair, got {item!r}")
        checked.append((item[0].rstrip("/"), item[1]))
    return tuple(checked)


def checked_notes(notes: Iterable[str]) -> tuple[str, ...]:
    """``notes`` as a tuple; raises ConfigurationError unless they are strings (one string is not a list)."""
    if isinstance(notes, str):
        raise ConfigurationError("notes must be a list of strings")
    checked = tuple(notes)
    if not all(isinstance(note, str) for note in checked):
        raise ConfigurationError("notes must be a list of strings")
    return checked


def parsed(payload: ParsedPayload) -> Any:
    """The document of a parsed payload (XML element or JSON value), handy in callables given to extractors."""
    return payload.xml if payload.content_type == "xml" else payload.json
