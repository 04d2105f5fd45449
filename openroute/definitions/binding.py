"""The inbound binding: how one (service, operation) is recognised, validated and indexed at accept time.

A definition, like :class:`~openroute.definitions.route.Route` (the DSL builds both); the endpoints of
``openroute.inbound`` serve it.

An :class:`InboundBinding` is plain data (the route DSL produces it from its identify / validate / extract
clauses); expressions are compiled once, when the binding is created, so a bad XPath or JSON path is a
:class:`~openroute.definitions.errors.ConfigurationError` at start-up, never a surprise on the first request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jsonpath_ng import jsonpath
from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.jsonpath import Child, Fields, Root
from jsonpath_ng.parser import parse as parse_json_path
from lxml import etree
from lxml.etree import QName

from openroute.definitions.errors import ConfigurationError, ValidationError
from openroute.definitions.schema import RequestSchema, load_schema

__all__ = ["ChannelBinding", "Extracted", "Extractor", "InboundBinding", "ParsedPayload", "QName", "default_bindings"]


@dataclass(frozen=True)
class ParsedPayload:
    """A request body after the secure parse, as validators and extractors see it.

    ``xml`` is the SOAP request element (the root of its own document, so absolute and relative XPaths both
    work), ``json`` the decoded JSON document; ``text`` is what is stored as the message payload.
    """

    content_type: Literal["xml", "json"]
    text: str
    xml: etree._Element | None = None
    json: Any = None
    #: the child lists of :meth:`children`, made on first use (checks read the payload, they never change it)
    _children: dict[Any, list[Any]] | None = field(default=None, init=False, repr=False, compare=False)

    def children(self, parent: etree._Element) -> list[Any]:
        """The child nodes of ``parent`` (an element of ``xml``), listed once per payload: a binding's child walks
        share them (each child listed is a new Python object, the main cost of a walk)."""
        memo = self._children
        if memo is None:
            memo = {}
            object.__setattr__(self, "_children", memo)
        found = memo.get(parent)
        if found is None:
            found = memo[parent] = list(parent)
        return found


#: An XPath string (XML bindings), a JSON path string starting with ``$`` (JSON bindings) or a callable.
Extractor = str | Callable[[ParsedPayload], "str | None"]
Validator = Callable[[ParsedPayload], None]


@dataclass(frozen=True)
class Extracted:
    """What a binding extracted from one payload (the indexing columns of the message)."""

    object_id: str | None
    entity_type: str | None
    funnel_value: str | None


def _compile(
    expression: str, content_type: str, namespaces: Mapping[str, str], what: str
) -> Callable[[Any], list[Any]]:
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"{what}: an expression must be a non-empty string, got {expression!r}")
    if content_type == "json":
        if not expression.startswith("$"):
            raise ConfigurationError(f"{what}: a JSON path must start with '$', got {expression!r}")
        try:
            path = parse_json_path(expression)
        except (JsonPathLexerError, JsonPathParserError, Exception) as error:
            raise ConfigurationError(f"{what}: invalid JSON path {expression!r}: {error}") from None
        members = _member_chain(path)
        if members is not None:
            return _member_lookup(members)
        return lambda document: [match.value for match in path.find(document)]
    return _compile_xpath(expression, namespaces, what)


def _compile_xpath(expression: str, namespaces: Mapping[str, str], what: str) -> Callable[[Any], list[Any]]:
    """The matches of the XPath ``expression`` (a Python walk for child steps by name, see :func:`_child_walk`)."""
    try:
        xpath = etree.XPath(expression, namespaces=dict(namespaces))
    except etree.XPathSyntaxError as error:
        raise ConfigurationError(f"{what}: invalid XPath {expression!r}: {error}") from None
    tags = _child_tags(expression, namespaces)
    if tags is not None:
        return _ChildWalk(tags)

    def evaluate(element: Any) -> list[Any]:
        try:
            result = xpath(element)
        except etree.XPathEvalError as error:  # e.g. an undeclared prefix only found at evaluation
            raise ConfigurationError(f"{what}: XPath {expression!r} cannot be evaluated: {error}") from None
        if isinstance(result, list):
            return result
        if isinstance(result, bool):
            return [result] if result else []
        if isinstance(result, str):
            return [result] if result else []
        return [result]

    return evaluate


#: an XPath of child steps by name only (``b:customer/b:id``): what most bindings name
_CHILD_PATH = re.compile(r"(?:[A-Za-z_][\w.-]*:)?[A-Za-z_][\w.-]*(?:/(?:[A-Za-z_][\w.-]*:)?[A-Za-z_][\w.-]*)*",
                         re.ASCII)


def _child_tags(expression: str, namespaces: Mapping[str, str]) -> tuple[str, ...] | None:
    """The element tags (``{uri}local``) of the steps of a relative XPath of child steps by name, else None (any
    other axis, predicate or function, or a prefix ``namespaces`` does not declare, is left to libxml2's XPath)."""
    if not _CHILD_PATH.fullmatch(expression):
        return None
    tags: list[str] = []
    for step in expression.split("/"):
        prefix, _, local = step.rpartition(":")
        if prefix and prefix not in namespaces:
            return None
        tags.append(f"{{{namespaces[prefix]}}}{local}" if prefix else local)
    return tuple(tags)


class _ChildWalk:
    """What the XPath of :func:`_child_tags` finds (the matching elements in document order), by a walk over the
    few children in Python: as cheap as a compiled XPath in CPU, and it keeps the GIL, which libxml2's XPath
    releases twice per evaluation (its lock and the evaluation) to a writer thread waiting for it. Called with an
    element; :meth:`in_payload` walks a payload's ``xml`` over the child lists its other walks share."""

    __slots__ = ("tags",)

    def __init__(self, tags: tuple[str, ...]) -> None:
        self.tags = tags

    def __call__(self, element: Any) -> list[Any]:
        found = [element]
        for tag in self.tags:
            found = [child for parent in found for child in parent if child.tag == tag]
            if not found:
                break
        return found

    def in_payload(self, payload: ParsedPayload) -> list[Any]:
        found = [payload.xml]
        for tag in self.tags:
            found = [child for parent in found for child in payload.children(parent) if child.tag == tag]
            if not found:
                break
        return found


def _member_chain(path: Any) -> tuple[str, ...] | None:
    """The member names of a path that only names members (``$.a.b.c``), else None (indexes, wildcards, ...)."""
    names: list[str] = []
    node = path
    while isinstance(node, Child):
        step = node.right
        if type(step) is not Fields or len(step.fields) != 1:
            return None
        name = step.fields[0]
        if name == "*" or name == jsonpath.auto_id_field:
            return None
        names.append(name)
        node = node.left
    if type(node) is not Root:
        return None
    return tuple(reversed(names))


def _member_lookup(members: tuple[str, ...]) -> Callable[[Any], list[Any]]:
    """What jsonpath_ng finds for ``$.<members>`` (a member of a non-object is no match), without building its
    match objects: most bindings name plain members, and jsonpath_ng's evaluation was a quarter of a JSON
    request's Python (``test_member_paths_find_what_jsonpath_finds`` pins the equivalence)."""

    def lookup(document: Any) -> list[Any]:
        value = document
        for name in members:
            if not isinstance(value, dict) or name not in value:
                return []
            value = value[name]
        return [value]

    return lookup


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, etree._Element):
        # without children (comments and PIs count as children) the element's text is all of its string value
        text = (value.text or "") if len(value) == 0 else "".join(value.itertext())
        return text.strip() or None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dict | list):
        return None
    text = str(value).strip()
    return text or None


@dataclass(frozen=True)
class InboundBinding:
    """How requests of one (service, operation) are recognised, checked and indexed.

    * ``content_type``: ``"xml"`` (served by the SOAP endpoint) or ``"json"`` (the JSON HTTP endpoint); a route
      served on both has one binding of each.
    * ``request_element`` / ``soap_action``: the SOAP dispatch keys (XML only; at least one is required).
    * ``required``: XPaths (with ``namespaces``) or JSON paths (``$.a.b[0]``) that must match a non-empty value.
    * ``validators``: called with the :class:`ParsedPayload`; raise
      :class:`~openroute.definitions.errors.ValidationError`.
    * ``object_id`` / ``entity_type`` / ``funnel_value``: extractors; ``entity_type`` defaults to the operation.
    * ``schema``: the path of an XSD file declaring ``request_element`` (XML only): every request is validated
      against it before the other checks, and the served WSDL describes the element with it.
    """

    service: str
    operation: str
    content_type: Literal["xml", "json"]
    request_element: QName | str | None = None
    soap_action: str | None = None
    required: Sequence[str] = ()
    namespaces: Mapping[str, str] = field(default_factory=dict)
    validators: Sequence[Validator] = ()
    object_id: Extractor | None = None
    entity_type: Extractor | None = None
    funnel_value: Extractor | None = None
    schema: str | Path | None = None
    _schema: RequestSchema | None = field(init=False, repr=False, compare=False, default=None)
    _required: tuple[tuple[str, Callable[[ParsedPayload], list[Any]]], ...] = field(
        init=False, repr=False, compare=False, default=()
    )
    _extractors: dict[str, Callable[[ParsedPayload], str | None]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    # C901 over 12: validates each field of the binding in turn (independent checks, one error each)
    def __post_init__(self) -> None:  # noqa: C901
        for name in ("service", "operation"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip() or len(value) > 100:
                raise ConfigurationError(f"binding {name} must be a non-empty string of at most 100 characters")
        what = f"binding {self.service}/{self.operation}"
        if self.content_type not in ("xml", "json"):
            raise ConfigurationError(f"{what}: content_type must be 'xml' or 'json', got {self.content_type!r}")
        if not isinstance(self.namespaces, Mapping):
            raise ConfigurationError(f"{what}: namespaces must be a mapping of prefix -> URI")
        object.__setattr__(self, "namespaces", dict(self.namespaces))
        if self.content_type == "xml":
            if self.request_element is None and not self.soap_action:
                raise ConfigurationError(f"{what}: an XML binding needs a request_element or a soap_action")
            if self.request_element is not None:
                try:
                    qname = QName(self.request_element)
                except ValueError as error:
                    raise ConfigurationError(f"{what}: invalid request_element: {error}") from None
                if not qname.namespace:
                    raise ConfigurationError(f"{what}: request_element needs a namespace ({{uri}}local)")
                object.__setattr__(self, "request_element", qname)
        elif self.request_element is not None or self.soap_action is not None:
            raise ConfigurationError(f"{what}: request_element / soap_action only apply to XML bindings")
        if self.soap_action is not None and not isinstance(self.soap_action, str):
            raise ConfigurationError(f"{what}: soap_action must be a string")
        if self.schema is not None:
            object.__setattr__(self, "_schema", self._load_schema(what))
        if isinstance(self.required, str) or not isinstance(self.required, Sequence):
            raise ConfigurationError(f"{what}: required must be a sequence of expressions")
        object.__setattr__(self, "required", tuple(self.required))
        object.__setattr__(
            self,
            "_required",
            tuple(
                (e, self._on_payload(_compile(e, self.content_type, self.namespaces, f"{what} required")))
                for e in self.required
            ),
        )
        if isinstance(self.validators, str) or not isinstance(self.validators, Sequence):
            raise ConfigurationError(f"{what}: validators must be a sequence of callables")
        for validator in self.validators:
            if not callable(validator):
                raise ConfigurationError(f"{what}: validator {validator!r} is not callable")
        object.__setattr__(self, "validators", tuple(self.validators))
        extractors: dict[str, Callable[[ParsedPayload], str | None]] = {}
        for name in ("object_id", "entity_type", "funnel_value"):
            extractor = getattr(self, name)
            if extractor is None:
                continue
            if callable(extractor):
                extractors[name] = _checked_callable(extractor, f"{what} {name}")
            else:
                extractors[name] = _expression_extractor(
                    self._on_payload(_compile(extractor, self.content_type, self.namespaces, f"{what} {name}"))
                )
        object.__setattr__(self, "_extractors", extractors)

    def _load_schema(self, what: str) -> RequestSchema:
        if self.content_type != "xml":
            raise ConfigurationError(f"{what}: a schema only applies to XML (SOAP) bindings")
        if self.request_element is None:
            raise ConfigurationError(f"{what}: a schema needs the request_element it declares")
        try:
            schema = load_schema(self.schema)  # type: ignore[arg-type]
        except ConfigurationError as error:
            raise ConfigurationError(f"{what}: {error}") from None
        element = QName(self.request_element)
        if not schema.declares(element):
            raise ConfigurationError(f"{what}: schema {schema.path} declares no global element {element.text} "
                                     f"(its targetNamespace is {schema.target_namespace!r})")
        return schema

    @property
    def request_schema(self) -> RequestSchema | None:
        """The loaded XSD of this binding (``schema``), or None."""
        return self._schema

    def _on_payload(self, evaluate: Callable[[Any], list[Any]]) -> Callable[[ParsedPayload], list[Any]]:
        """``evaluate`` (of a document) applied to a payload's document; child walks share the payload's child
        lists."""
        if isinstance(evaluate, _ChildWalk):
            return evaluate.in_payload
        if self.content_type == "xml":
            return lambda payload: evaluate(payload.xml)
        return lambda payload: evaluate(payload.json)

    @property
    def key(self) -> tuple[str, str]:
        """(service, operation): the route this binding feeds."""
        return (self.service, self.operation)

    def check(self, payload: ParsedPayload) -> Extracted:
        """Check ``required`` and run ``validators``, then extract; raises ValidationError with a precise reason."""
        if self._schema is not None and payload.xml is not None:
            self._schema.validate(payload.xml)
        for expression, evaluate in self._required:
            matches = evaluate(payload)
            if not matches or all(_missing(m) for m in matches):
                raise ValidationError(f"required {expression} is missing or empty")
        for validator in self.validators:
            validator(payload)
        values = {name: extract(payload) for name, extract in self._extractors.items()}
        entity_type = values.get("entity_type") if "entity_type" in self._extractors else self.operation
        return Extracted(values.get("object_id"), entity_type, values.get("funnel_value"))


def _expression_extractor(evaluate: Callable[[ParsedPayload], list[Any]]) -> Callable[[ParsedPayload], str | None]:
    def extract(payload: ParsedPayload) -> str | None:
        matches = evaluate(payload)
        return _as_text(matches[0]) if matches else None

    return extract


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, etree._Element):
        return len(value) == 0 and not (value.text or "").strip()
    if isinstance(value, str):
        return not value.strip()
    return False


def _checked_callable(extractor: Callable[[ParsedPayload], Any], what: str) -> Callable[[ParsedPayload], str | None]:
    def extract(payload: ParsedPayload) -> str | None:
        value = extractor(payload)
        if value is not None and not isinstance(value, str):
            raise ConfigurationError(f"{what}: the extractor must return a string or None, got {type(value).__name__}")
        return value

    return extract


def default_bindings(service: str, operation: str, namespace: str | None = None) -> tuple[InboundBinding, ...]:
    """An XML and a JSON binding with no checks for a route that declares none.

    The SOAP request element is ``{namespace}operation`` with ``namespace`` defaulting to
    ``urn:openroute:service:<service>``; the SOAPAction is ``<service>/<operation>``.
    """
    namespace = namespace or f"urn:openroute:service:{service}"
    return (
        InboundBinding(service, operation, "xml", request_element=QName(namespace, operation),
                       soap_action=f"{service}/{operation}"),
        InboundBinding(service, operation, "json"),
    )


@dataclass(frozen=True)
class ChannelBinding:
    """A route fed by a broker channel, beside (or instead of) its HTTP bindings.

    ``channel`` is the messaging layer's incoming channel (bound to a connector in the configuration:
    ``openroute.messaging.incoming.<channel>.connector``); ``json`` and ``xml`` are the checks and extractors the
    route declared (the same as its HTTP endpoints use), applied to a JSON or an XML delivery body. An ``optional``
    channel that the configuration binds to no connector is left out (with a log line) instead of stopping the
    start. :mod:`openroute.inbound.channel` serves it.
    """

    channel: str
    service: str
    operation: str
    json: InboundBinding | None = None
    xml: InboundBinding | None = None
    optional: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.channel, str) or not self.channel.strip() or self.channel != self.channel.strip():
            raise ConfigurationError(f"a channel name must be a non-empty string without surrounding spaces, "
                                     f"got {self.channel!r}")
        for binding in (self.json, self.xml):
            if binding is not None and binding.key != (self.service, self.operation):
                raise ConfigurationError(f"channel {self.channel}: binding {binding.service}/{binding.operation} "
                                         f"is not of route {self.service}/{self.operation}")

    @property
    def key(self) -> tuple[str, str]:
        """(service, operation): the route this channel feeds."""
        return (self.service, self.operation)
