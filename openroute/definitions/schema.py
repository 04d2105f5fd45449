"""XML Schemas of SOAP requests (part of a binding's definition): loaded once at start with the secure parser
(defined here, used by the inbound's request parse too), used to validate every request of the binding and to
describe the request element in the served WSDL.

A schema is one self-contained XSD file: its ``targetNamespace`` is the request element's namespace and it
declares the request element globally. ``xsd:include`` / ``xsd:import`` / ``xsd:redefine`` of other files are
refused (the WSDL inlines the schema, and nothing is ever read from elsewhere, least of all the network).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from lxml import etree

from openroute.definitions.errors import ConfigurationError, ValidationError

__all__ = ["RequestSchema", "load_schema", "secure_parser"]

XSD_NS = "http://www.w3.org/2001/XMLSchema"
_REFERENCES = {f"{{{XSD_NS}}}{name}" for name in ("include", "import", "redefine", "override")}
_MAX_REASON = 300


def secure_parser() -> etree.XMLParser:
    """An lxml parser that never expands entities, loads a DTD or touches the network."""
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
        collect_ids=False,
    )


@dataclass(frozen=True, eq=False)
class RequestSchema:
    """One loaded XSD: ``root`` (the ``xsd:schema`` element, for the WSDL) and the compiled ``XMLSchema``."""

    path: Path
    root: etree._Element
    target_namespace: str | None
    schema: etree.XMLSchema

    def declares(self, element: etree.QName) -> bool:
        """Whether the schema declares ``element`` as a global element."""
        if (element.namespace or None) != self.target_namespace:
            return False
        return any(child.get("name") == element.localname for child in self.root.iterchildren(f"{{{XSD_NS}}}element"))

    def validate(self, element: etree._Element) -> None:
        """Raise :class:`~openroute.definitions.errors.ValidationError` naming the first invalid element of
        ``element``."""
        if self.schema.validate(element):
            return
        error = self.schema.error_log[0]
        message = " ".join(error.message.split())
        if len(message) > _MAX_REASON:
            message = message[: _MAX_REASON - 3] + "..."
        where = f" (at {error.path})" if error.path else ""
        raise ValidationError(f"schema {self.path.name}: {message}{where}")


def load_schema(path: str | Path) -> RequestSchema:
    """Load and compile the XSD at ``path`` (ConfigurationError for anything that cannot be used)."""
    if not isinstance(path, str | Path) or not str(path).strip():
        raise ConfigurationError(f"schema must be the path of an XSD file, got {path!r}")
    return _load(Path(path).resolve())


@functools.lru_cache(maxsize=64)
def _load(path: Path) -> RequestSchema:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigurationError(f"schema {path}: cannot be read ({error.strerror or error})") from None
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise ConfigurationError(f"schema {path}: DOCTYPE / entity declarations are not allowed")
    try:
        document = etree.fromstring(data, secure_parser(), base_url=path.as_uri())
    except (etree.XMLSyntaxError, ValueError) as error:
        raise ConfigurationError(f"schema {path}: not well-formed XML: {error}") from None
    docinfo = document.getroottree().docinfo
    if docinfo.doctype or docinfo.internalDTD is not None:
        raise ConfigurationError(f"schema {path}: DOCTYPE / entity declarations are not allowed")
    if document.tag != f"{{{XSD_NS}}}schema":
        raise ConfigurationError(f"schema {path}: the root element must be {{{XSD_NS}}}schema, got {document.tag}")
    reference = next(document.iter(*_REFERENCES), None)
    if reference is not None:
        raise ConfigurationError(
            f"schema {path}: {etree.QName(reference).localname} of another schema is not supported "
            "(give one self-contained XSD file per namespace)"
        )
    try:
        compiled = etree.XMLSchema(document)
    except etree.XMLSchemaParseError as error:
        raise ConfigurationError(f"schema {path}: not a valid XML Schema: {error}") from None
    return RequestSchema(path, document, document.get("targetNamespace") or None, compiled)
