"""The typed body of a route: the pydantic model a JSON object or a SOAP request element is bound to.

A route declares its model with ``.body(Model)``; the message is checked against it at accept (a body that does
not validate is refused with its field errors, nothing stored) and each attempt's steps read it bound::

    from pydantic import BaseModel, Field

    from openroute import Exchange, route


    class Customer(BaseModel):
        customerId: str
        msisdn: str = Field(pattern=r"^[0-9]{8,15}$")
        tariff: str = "basic"


    def activate(exchange: Exchange) -> str:
        customer = exchange.body_as(Customer)  # parsed once per attempt; exchange.payload keeps the raw text
        return customer.msisdn


    set_customer = route("crm", "setCustomer").soap().json().body(Customer).process(activate)

One model serves both endpoints: JSON is validated as it is (``Model.model_validate``); a SOAP request element
is bound by :func:`element_data`, which maps child elements (by local name) and plain attributes onto the model's
fields, nested models from nested elements and lists from repeated elements (docs/routes.md says why this binding
and not pydantic-xml). ``.body(Customer, xml=CustomerXml)`` gives SOAP a model of its own.
"""

from __future__ import annotations

import collections.abc
import functools
import json
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pydantic
from lxml import etree
from pydantic import AliasChoices, AliasPath, BaseModel
from pydantic.fields import FieldInfo

from openroute.definitions.errors import ConfigurationError, ValidationError

__all__ = ["Body", "FieldError", "InvalidBodyError", "element_data"]

_XSI_NIL = "{http://www.w3.org/2001/XMLSchema-instance}nil"
_SHOWN_ERRORS = 5

#: the same settings as the inbound endpoints' parser (openroute.inbound.parsing.secure_parser): a stored or
#: directly accepted payload is parsed as safely as a request body
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
                          huge_tree=False, remove_comments=True, remove_pis=True, collect_ids=False)


@dataclass(frozen=True)
class FieldError:
    """One reason a body does not match its model: the field's path (``customer.id``, ``lines.0.sku``; empty for
    the body as a whole), pydantic's message and its error type (``missing``, ``int_parsing``, ...)."""

    field: str
    message: str
    type: str

    def to_dict(self) -> dict[str, str]:
        """The JSON form answered to the sender (HTTP 400 ``fields``, SOAP Fault detail)."""
        return {"field": self.field, "message": self.message, "type": self.type}


class InvalidBodyError(ValidationError):
    """The body does not match the route's model (HTTP 400 / SOAP Fault, nothing stored); ``field_errors`` says
    which fields and why."""

    code = "INVALID_BODY"

    def __init__(self, model: str, field_errors: Sequence[FieldError]) -> None:
        shown = "; ".join(f"{e.field or '(body)'}: {e.message}" for e in field_errors[:_SHOWN_ERRORS])
        more = len(field_errors) - _SHOWN_ERRORS
        super().__init__(f"the body does not match {model}: {shown}" + (f" (and {more} more)" if more > 0 else ""))
        self.model = model
        self.field_errors = tuple(field_errors)


def _field_errors(error: pydantic.ValidationError) -> list[FieldError]:
    return [FieldError(".".join(str(part) for part in item["loc"]), item["msg"], item["type"])
            for item in error.errors(include_url=False)]


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


@dataclass(frozen=True)
class Body:
    """The models of a route's body: ``json`` for the JSON endpoint, ``xml`` for the SOAP request element
    (usually the same model). Raises :class:`ConfigurationError` unless each is a pydantic model class."""

    json: type[BaseModel]
    xml: type[BaseModel]

    def __post_init__(self) -> None:
        for name in ("json", "xml"):
            if not _is_model(getattr(self, name)):
                raise ConfigurationError(f"body: {name} must be a pydantic BaseModel class, got "
                                         f"{getattr(self, name)!r}")

    def from_json(self, document: Any) -> BaseModel:
        """``document`` (a decoded JSON value) bound to the JSON model; raises :class:`InvalidBodyError`."""
        try:
            return self.json.model_validate(document)
        except pydantic.ValidationError as error:
            raise InvalidBodyError(self.json.__name__, _field_errors(error)) from None

    def from_xml(self, element: etree._Element) -> BaseModel:
        """The request ``element`` bound to the XML model (see :func:`element_data`); raises
        :class:`InvalidBodyError`."""
        try:
            return self.xml.model_validate(element_data(element, self.xml))
        except pydantic.ValidationError as error:
            raise InvalidBodyError(self.xml.__name__, _field_errors(error)) from None

    def bound(self, value: Any, content_type: str) -> bool:
        """True when ``value`` is already an instance of the model of ``content_type`` (validated when made)."""
        return isinstance(value, self.xml if "xml" in content_type.lower() else self.json)

    def parse(self, text: str, content_type: str) -> BaseModel:
        """A stored or accepted payload ``text`` bound to the model of its ``content_type`` (XML when it names
        xml, else JSON). Raises :class:`InvalidBodyError`, or :class:`ValidationError` for text that does not
        parse (or declares a DOCTYPE)."""
        if "xml" in content_type.lower():
            try:
                element = etree.fromstring(text.encode("utf-8"), _PARSER)
            except (etree.XMLSyntaxError, ValueError) as error:
                raise ValidationError(f"the body is not well-formed XML: {error}") from None
            if element is None or element.getroottree().docinfo.doctype:
                raise ValidationError("the body must be one XML element without a DOCTYPE")
            return self.from_xml(element)
        try:
            document = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as error:
            raise ValidationError(f"the body is not well-formed JSON: {error}") from None
        return self.from_json(document)


def _accepted_names(name: str, info: FieldInfo) -> list[str]:
    """The keys a field may be given by: its name, alias and string validation aliases."""
    names = [name]
    if info.alias:
        names.append(info.alias)
    alias = info.validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias is not None else []
    names.extend(choice for choice in choices if isinstance(choice, str))
    names.extend(choice.path[0] for choice in choices  # the first step of an alias path names the element
                 if isinstance(choice, AliasPath) and choice.path and isinstance(choice.path[0], str))
    return names


_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set, collections.abc.Iterable)


def _shape(annotation: Any) -> tuple[Any, bool]:
    """(item type, whether repeated) of a field's annotation: ``list[Line] | None`` -> (Line, True)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin is typing.Union or origin is types.UnionType:
            options = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation, False
            annotation = options[0]
        else:
            break
    if origin in _SEQUENCES:
        args = typing.get_args(annotation)
        return (args[0] if args else Any), True
    return annotation, False


def _generic(element: etree._Element) -> Any:
    """An element bound without a model: its text, or a mapping of its children (repeated ones as a list)."""
    if element.get(_XSI_NIL) in ("true", "1"):
        return None
    children = [child for child in element if isinstance(child.tag, str)]
    if not children:
        return element.text or ""
    result: dict[str, Any] = {}
    for child in children:
        name = _local(child.tag)
        value = _generic(child)
        if name in result:
            previous = result[name]
            result[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            result[name] = value
    return result


@functools.lru_cache(maxsize=256)
def _plan(model: type[BaseModel]) -> dict[str, tuple[Any, bool]]:
    """(item type, repeated) of each name ``model``'s fields accept: worked out once per model, not per request."""
    plan: dict[str, tuple[Any, bool]] = {}
    for name, info in model.model_fields.items():
        shape = _shape(info.annotation)
        for accepted in _accepted_names(name, info):
            plan.setdefault(accepted, shape)
    return plan


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def element_data(element: etree._Element, model: type[BaseModel]) -> dict[str, Any]:
    """The data of ``element`` for ``model``: each child element by its local name (``xsi:nil`` -> None, a leaf
    -> its text, an element of a nested model -> that model's data), plain (unqualified) attributes by name; a
    field annotated as a list gets every child of its name, even one. Namespaces are not compared: the request
    element was already matched by its qualified name."""
    plan = _plan(model)
    data: dict[str, Any] = {key: value for key, value in element.attrib.items() if not key.startswith("{")}
    groups: dict[str, list[etree._Element]] = {}
    for child in element:
        if isinstance(child.tag, str):
            groups.setdefault(_local(child.tag), []).append(child)
    for name, children in groups.items():
        item, repeated = plan.get(name, (Any, False))
        values = [_bound(child, item) for child in children]
        data[name] = values if repeated or len(values) > 1 else values[0]
    return data


def _bound(element: etree._Element, item: Any) -> Any:
    if element.get(_XSI_NIL) in ("true", "1"):
        return None
    if _is_model(item):
        return element_data(element, item)
    return _generic(element)
