"""Reading a stored payload (the SOAP request element or the JSON object) as flat fields in route steps."""

from __future__ import annotations

import json
from typing import Any

from lxml import etree

from openroute.errors import ValidationError

_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)


def fields(payload: str) -> dict[str, Any]:
    """The top-level fields of a JSON object, or of a SOAP request element (child local name -> text, a
    repeated child -> list of dicts of its own children)."""
    text = payload.lstrip()
    if text.startswith("{"):
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValidationError("the payload is not a JSON object")
        return document
    try:
        root = etree.fromstring(text.encode(), _PARSER)
    except etree.XMLSyntaxError as error:
        raise ValidationError(f"the stored payload is not XML: {error}") from None
    result: dict[str, Any] = {}
    for child in root:
        name = etree.QName(child).localname
        if len(child):
            result.setdefault(name, []).append({etree.QName(g).localname: (g.text or "") for g in child})
        else:
            result[name] = child.text or ""
    return result
