"""SOAP 1.1 / 1.2 envelopes: reading a request, writing the acknowledgment and faults, generating the WSDL."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from lxml import etree

from openroute.auth.errors import MalformedPayloadError, SoapVersionMismatchError, UnsupportedMediaTypeError
from openroute.definitions.binding import InboundBinding, ParsedPayload
from openroute.definitions.schema import RequestSchema

SOAP11_NS = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12_NS = "http://www.w3.org/2003/05/soap-envelope"
#: namespace of the acknowledgment (``acceptResponse``) and of fault details
INBOUND_NS = "urn:openroute:inbound:v1"
#: namespace of the trace header element (``traceHeader``)
TRACE_NS = "urn:openroute:trace:v1"
#: ``traceparent``: the sender's W3C trace context (read while tracing is on, :mod:`openroute.runtime.tracing`)
TRACE_FIELDS = ("correlationId", "sourceSystem", "processId", "timestamp", "traceparent")

_INVALID_XML_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True)
class SoapVersion:
    """One SOAP version: its envelope namespace and the content type of its messages."""

    name: str
    namespace: str
    content_type: str


SOAP11 = SoapVersion("1.1", SOAP11_NS, "text/xml")
SOAP12 = SoapVersion("1.2", SOAP12_NS, "application/soap+xml")


def _params(value: str) -> tuple[str, dict[str, str]]:
    media, *rest = value.split(";")
    params: dict[str, str] = {}
    for item in rest:
        name, sep, val = item.partition("=")
        if sep:
            params[name.strip().lower()] = val.strip().strip('"')
    return media.strip().lower(), params


@functools.lru_cache(maxsize=64)  # a sender sends the same few Content-Types; a refused one is not kept
def soap_version_of(content_type: str | None) -> tuple[SoapVersion, str | None]:
    """The SOAP version announced by ``content_type`` and the SOAP 1.2 ``action`` parameter if any."""
    if not content_type:
        raise UnsupportedMediaTypeError("a SOAP request needs a Content-Type (text/xml or application/soap+xml)")
    media, params = _params(content_type)
    charset = params.get("charset")
    if charset is not None and charset.lower() not in {"utf-8", "utf8", "us-ascii", "iso-8859-1", "utf-16"}:
        raise UnsupportedMediaTypeError(f"unsupported charset {charset!r}")
    if media == "text/xml":
        return SOAP11, None
    if media == "application/soap+xml":
        return SOAP12, params.get("action")
    raise UnsupportedMediaTypeError(
        f"Content-Type {media!r} is not SOAP (text/xml for SOAP 1.1, application/soap+xml for SOAP 1.2)"
    )


@dataclass(frozen=True)
class SoapRequest:
    """The parts of a SOAP request the endpoint needs."""

    version: SoapVersion
    body_element: etree._Element
    trace: dict[str, str]

    def payload(self) -> ParsedPayload:
        """The body element as a document of its own, with only the namespaces it uses, and its text (stored)."""
        element = self.body_element.__copy__()  # the whole subtree (and its tail) into a new document
        etree.cleanup_namespaces(element)
        return ParsedPayload("xml", etree.tostring(element, encoding="unicode"), xml=element)


_ENVELOPE_TAGS = {f"{{{SOAP11_NS}}}Envelope": SOAP11_NS, f"{{{SOAP12_NS}}}Envelope": SOAP12_NS}
_PART_TAGS = {namespace: (f"{{{namespace}}}Header", f"{{{namespace}}}Body") for namespace in (SOAP11_NS, SOAP12_NS)}
_TRACE_HEADER_TAG = f"{{{TRACE_NS}}}traceHeader"
_TRACE_FIELD_TAGS = {f"{{{TRACE_NS}}}{name}": name for name in TRACE_FIELDS}


# C901 over 12: one branch per part of the envelope a sender can get wrong, each its own fault
def read_envelope(root: etree._Element, version: SoapVersion) -> SoapRequest:  # noqa: C901
    """Check the envelope against ``version`` and find the single body element and the trace header.

    The first Header and the first Body of the envelope count, and the first element of each trace field.
    """
    # plain loops over the few children: cheaper than find() (ElementPath) or iterchildren(tag) (a matcher per call)
    namespace = _ENVELOPE_TAGS.get(root.tag)
    if namespace is None:
        if etree.QName(root).localname == "Envelope":  # SOAP 1.1 §4.4.1 / 1.2 §5.4.7: an unknown envelope namespace
            raise SoapVersionMismatchError(
                f"envelope namespace {etree.QName(root).namespace or '(none)'} is no SOAP version; "
                f"SOAP {version.name} ({version.content_type}) needs {version.namespace}"
            )
        raise MalformedPayloadError("the request is not a SOAP envelope")
    if namespace != version.namespace:
        raise SoapVersionMismatchError(
            f"envelope namespace {namespace} does not match SOAP {version.name} ({version.content_type})"
        )
    header_tag, body_tag = _PART_TAGS[namespace]
    header = body = None
    for part in root:
        tag = part.tag
        if tag == body_tag and body is None:
            body = part
        elif tag == header_tag and header is None:
            header = part
    if body is None:
        raise MalformedPayloadError("the SOAP envelope has no Body")
    children = [child for child in body if isinstance(child.tag, str)]
    if len(children) != 1:
        raise MalformedPayloadError(f"the SOAP Body must hold exactly one element, found {len(children)}")
    trace: dict[str, str] = {}
    element = None
    if header is not None:
        for candidate in header:
            if candidate.tag == _TRACE_HEADER_TAG:
                element = candidate
                break
    if element is not None:
        seen: set[str] = set()
        for field in element:
            name = _TRACE_FIELD_TAGS.get(field.tag)
            if name is not None and name not in seen:
                seen.add(name)
                text = (field.text or "").strip()
                if text:
                    trace[name] = text
    return SoapRequest(version, children[0], trace)


#: text that XML carries as it is (no markup character, no character XML refuses): most ids
_PLAIN_TEXT = re.compile(r"[\w .:/@+=,;()#$%*!?~-]*", re.ASCII)


def _text(value: object) -> str:
    text = str(value)
    if _PLAIN_TEXT.fullmatch(text):
        return text
    return escape(_INVALID_XML_CHARS.sub("\ufffd", text))


def _trace_header(correlation: str) -> str:
    """The answer's trace header, of the correlation id ``correlation`` already escaped (:func:`_text`)."""
    return (
        f'<env:Header><tr:traceHeader xmlns:tr="{TRACE_NS}"><tr:correlationId>{correlation}'
        "</tr:correlationId></tr:traceHeader></env:Header>"
    )


def accept_envelope(
    version: SoapVersion, message_id: int, correlation_id: str, duplicate: bool, state: str
) -> bytes:
    """The acknowledgment: ``acceptResponse`` with the message id, sent after the commit."""
    status = "DUPLICATE" if duplicate else "ACCEPTED"
    correlation = _text(correlation_id)
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><env:Envelope xmlns:env="{version.namespace}">'
        f"{_trace_header(correlation)}<env:Body>"
        f'<ib:acceptResponse xmlns:ib="{INBOUND_NS}"><ib:messageId>{message_id}</ib:messageId>'
        f"<ib:correlationId>{correlation}</ib:correlationId><ib:status>{status}</ib:status>"
        f"<ib:state>{_text(state)}</ib:state></ib:acceptResponse></env:Body></env:Envelope>"
    ).encode()


def fault_envelope(version: SoapVersion, sender: bool, code: str, reason: str, correlation_id: str | None,
                   fields: Sequence[Mapping[str, str]] = ()) -> bytes:
    """A SOAP Fault (Client/Sender for bad requests, Server/Receiver otherwise) with a typed detail; ``fields``
    (a body that does not match its model) become ``ib:field`` elements (``name``, ``message``, ``type``)."""
    listed = "".join(
        f"<ib:field><ib:name>{_text(item['field'])}</ib:name><ib:message>{_text(item['message'])}</ib:message>"
        f"<ib:type>{_text(item['type'])}</ib:type></ib:field>"
        for item in fields
    )
    detail = (
        f'<ib:error xmlns:ib="{INBOUND_NS}"><ib:code>{_text(code)}</ib:code>'
        f"<ib:reason>{_text(reason)}</ib:reason>{listed}</ib:error>"
    )
    header = _trace_header(_text(correlation_id)) if correlation_id else ""
    if version is SOAP11:
        fault_code = "Client" if sender else "Server"
        if code == "VERSION_MISMATCH":
            fault_code = "VersionMismatch"
        fault = (
            f"<env:Fault><faultcode>env:{fault_code}</faultcode><faultstring>{_text(reason)}</faultstring>"
            f"<detail>{detail}</detail></env:Fault>"
        )
    else:
        fault_code = "Sender" if sender else "Receiver"
        if code == "VERSION_MISMATCH":
            fault_code = "VersionMismatch"
        fault = (
            f"<env:Fault><env:Code><env:Value>env:{fault_code}</env:Value></env:Code>"
            f'<env:Reason><env:Text xml:lang="en">{_text(reason)}</env:Text></env:Reason>'
            f"<env:Detail>{detail}</env:Detail></env:Fault>"
        )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><env:Envelope xmlns:env="{version.namespace}">{header}'
        f"<env:Body>{fault}</env:Body></env:Envelope>"
    ).encode()


def fault_status(version: SoapVersion, sender: bool, http_status: int) -> int:
    """HTTP status of a fault: SOAP 1.1 always 500 except before the envelope (401/403/413/415) and for "try
    later" (429 throttled, 503 store unreachable or node drained), whose status tells a client to retry."""
    if http_status in (401, 403, 413, 415, 429, 503):
        return http_status
    if version is SOAP11:
        return 500
    return 400 if sender else 500


def wsdl_document(service: str, bindings: Sequence[InboundBinding], address: str) -> bytes:
    """A WSDL 1.1 describing the XML ``bindings`` of ``service`` with a SOAP 1.1 and a SOAP 1.2 binding.

    A binding with a ``schema`` has its XSD inlined in ``wsdl:types`` (the request element as the schema declares
    it); the request elements of the others are declared open (``xsd:anyType``): their content is checked by the
    binding's rules only. Every operation answers ``acceptResponse`` and takes the optional ``traceHeader`` header.
    """
    tns = f"urn:openroute:wsdl:{service}"
    schemas, documents = _request_elements(bindings)
    prefixes = {ns: f"req{i}" for i, ns in enumerate(schemas)}
    ns_decls = "".join(f" xmlns:{p}={quoteattr(ns)}" for ns, p in prefixes.items())
    schema_xml = _request_schema_xml(schemas, documents) + _ANSWER_AND_TRACE_SCHEMAS
    messages, operations, ops11, ops12 = _wsdl_operations(bindings, prefixes)
    name = _text(service)
    document = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<wsdl:definitions xmlns:wsdl="http://schemas.xmlsoap.org/wsdl/" '
        'xmlns:soap="http://schemas.xmlsoap.org/wsdl/soap/" xmlns:soap12="http://schemas.xmlsoap.org/wsdl/soap12/" '
        f'xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:ib="{INBOUND_NS}" xmlns:tr="{TRACE_NS}" '
        f"xmlns:tns={quoteattr(tns)}{ns_decls} targetNamespace={quoteattr(tns)} name={quoteattr(service)}>"
        f"<wsdl:types>{schema_xml}</wsdl:types>{''.join(messages)}"
        f'<wsdl:portType name="{name}PortType">{"".join(operations)}</wsdl:portType>'
        f'<wsdl:binding name="{name}Soap11" type="tns:{name}PortType">'
        '<soap:binding transport="http://schemas.xmlsoap.org/soap/http" style="document"/>'
        f'{"".join(ops11)}</wsdl:binding>'
        f'<wsdl:binding name="{name}Soap12" type="tns:{name}PortType">'
        '<soap12:binding transport="http://schemas.xmlsoap.org/soap/http" style="document"/>'
        f'{"".join(ops12)}</wsdl:binding>'
        f'<wsdl:service name="{name}">'
        f'<wsdl:port name="{name}Soap11Port" binding="tns:{name}Soap11"><soap:address location={quoteattr(address)}/>'
        "</wsdl:port>"
        f'<wsdl:port name="{name}Soap12Port" binding="tns:{name}Soap12">'
        f"<soap12:address location={quoteattr(address)}/></wsdl:port></wsdl:service></wsdl:definitions>"
    )
    return document.encode()


def _request_elements(
    bindings: Sequence[InboundBinding],
) -> tuple[dict[str, list[str]], dict[str, list[RequestSchema]]]:
    """The request elements by namespace: the local names declared open, and the XSDs to inline."""
    schemas: dict[str, list[str]] = {}
    documents: dict[str, list[RequestSchema]] = {}
    for binding in bindings:
        if binding.request_element is not None:
            qname = etree.QName(binding.request_element)
            request_schema = binding.request_schema
            if request_schema is None:
                schemas.setdefault(qname.namespace or "", []).append(qname.localname)
            else:
                schemas.setdefault(qname.namespace or "", [])
                known = documents.setdefault(qname.namespace or "", [])
                if all(document is not request_schema for document in known):
                    known.append(request_schema)
    return schemas, documents


def _request_schema_xml(schemas: dict[str, list[str]], documents: dict[str, list[RequestSchema]]) -> str:
    """The inlined XSDs, and an open (``xsd:anyType``) declaration of every request element they do not declare."""
    schema_xml = ""
    for ns, names in schemas.items():
        inlined = documents.get(ns, [])
        schema_xml += "".join(etree.tostring(document.root, encoding="unicode") for document in inlined)
        open_names = sorted({n for n in names if not any(d.declares(etree.QName(ns or None, n)) for d in inlined)})
        if open_names:
            schema_xml += (
                f'<xsd:schema targetNamespace={quoteattr(ns)} elementFormDefault="qualified">'
                + "".join(f'<xsd:element name="{_text(n)}" type="xsd:anyType"/>' for n in open_names)
                + "</xsd:schema>"
            )
    return schema_xml


#: the schemas of the answer (``acceptResponse``, ``error``) and of the ``traceHeader`` header
_ANSWER_AND_TRACE_SCHEMAS = (
    f'<xsd:schema targetNamespace="{INBOUND_NS}" elementFormDefault="qualified">'
    '<xsd:element name="acceptResponse"><xsd:complexType><xsd:sequence>'
    '<xsd:element name="messageId" type="xsd:long"/><xsd:element name="correlationId" type="xsd:string"/>'
    '<xsd:element name="status" type="xsd:string"/><xsd:element name="state" type="xsd:string"/>'
    "</xsd:sequence></xsd:complexType></xsd:element>"
    '<xsd:element name="error"><xsd:complexType><xsd:sequence>'
    '<xsd:element name="code" type="xsd:string"/><xsd:element name="reason" type="xsd:string"/>'
    '<xsd:element name="field" minOccurs="0" maxOccurs="unbounded"><xsd:complexType><xsd:sequence>'
    '<xsd:element name="name" type="xsd:string"/><xsd:element name="message" type="xsd:string"/>'
    '<xsd:element name="type" type="xsd:string"/></xsd:sequence></xsd:complexType></xsd:element>'
    "</xsd:sequence></xsd:complexType></xsd:element></xsd:schema>"
    f'<xsd:schema targetNamespace="{TRACE_NS}" elementFormDefault="qualified">'
    '<xsd:element name="traceHeader"><xsd:complexType><xsd:sequence>'
    + "".join(f'<xsd:element name="{f}" type="xsd:string" minOccurs="0"/>' for f in TRACE_FIELDS)
    + "</xsd:sequence></xsd:complexType></xsd:element></xsd:schema>"
)


def _wsdl_operations(bindings: Sequence[InboundBinding], prefixes: dict[str, str],
                     ) -> tuple[list[str], list[str], list[str], list[str]]:
    """The ``wsdl:message`` elements, and the operations of the port type, the SOAP 1.1 and the SOAP 1.2 binding."""
    messages = [
        '<wsdl:message name="acceptResponse"><wsdl:part name="parameters" element="ib:acceptResponse"/></wsdl:message>',
        '<wsdl:message name="traceHeader"><wsdl:part name="traceHeader" element="tr:traceHeader"/></wsdl:message>',
    ]
    operations: list[str] = []
    ops11: list[str] = []
    ops12: list[str] = []
    for binding in bindings:
        if binding.request_element is None:
            continue
        qname = etree.QName(binding.request_element)
        op = _text(binding.operation)
        messages.append(
            f'<wsdl:message name="{op}Request"><wsdl:part name="parameters" '
            f'element="{prefixes[qname.namespace or ""]}:{_text(qname.localname)}"/></wsdl:message>'
        )
        operations.append(
            f'<wsdl:operation name="{op}"><wsdl:input message="tns:{op}Request"/>'
            '<wsdl:output message="tns:acceptResponse"/></wsdl:operation>'
        )
        action = quoteattr(binding.soap_action or "")
        for prefix, ops in (("soap", ops11), ("soap12", ops12)):
            ops.append(
                f'<wsdl:operation name="{op}"><{prefix}:operation soapAction={action} style="document"/>'
                f'<wsdl:input><{prefix}:header message="tns:traceHeader" part="traceHeader" use="literal"/>'
                f'<{prefix}:body use="literal"/></wsdl:input>'
                f'<wsdl:output><{prefix}:body use="literal"/></wsdl:output></wsdl:operation>'
            )
    return messages, operations, ops11, ops12
