"""The contract of the JSON endpoint: an OpenAPI 3.1 document generated from the routes, and Swagger UI to read it.

Served beside the WSDL of the SOAP endpoint, without authentication::

    GET /api/openapi.json        one operation per JSON route: POST /api/<service>/<operation>
    GET /api/docs                Swagger UI (its assets come from the swagger-ui-bundle-v2 package, no CDN)

A route with a body model (``.body(Model)``, :mod:`openroute.definitions.body`) is described with the model's JSON
schema (pydantic's ``model_json_schema``); an untyped route takes any JSON object. The answers are the ones
:class:`~openroute.inbound.InboundEndpoints` gives: 202 accepted, 200 a duplicate of a stored message, and the
error codes of :func:`~openroute.auth.errors.status_and_code`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route as HttpRoute

from openroute.definitions.binding import InboundBinding
from openroute.definitions.route import RouteRegistry

__all__ = ["InboundContract", "inbound_openapi", "package_version", "swagger_ui_assets"]

#: the Swagger UI files the page needs (nothing else of the package is served)
_ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}

#: the error codes of each status (openroute.auth.errors.status_and_code and the endpoints; THROTTLED,
#: TOO_MANY_FAILED_LOGINS and STORE_UNAVAILABLE are the codes of the throttling, login lockout and store outage
#: answers)
ERROR_CODES: dict[str, tuple[str, tuple[str, ...]]] = {
    "400": ("the request is invalid; nothing was stored",
            ("MALFORMED_PAYLOAD", "NESTING_TOO_DEEP", "VALIDATION_ERROR", "INVALID_BODY")),
    "401": ("no or wrong credentials", ("UNAUTHENTICATED",)),
    "403": ("the credentials belong to another source system", ("FORBIDDEN",)),
    "404": ("no JSON route for this service and operation", ("UNKNOWN_OPERATION",)),
    "413": ("the body exceeds the size limit (it was not read to the end); nothing was stored",
            ("PAYLOAD_TOO_LARGE",)),
    "415": ("the Content-Type is not UTF-8 JSON", ("UNSUPPORTED_MEDIA_TYPE",)),
    "429": ("the source system or operation is over its request limit, or its credentials failed too often; "
            "nothing was stored; try again after Retry-After", ("THROTTLED", "TOO_MANY_FAILED_LOGINS")),
    "500": ("an unexpected error (see the server log); nothing was acknowledged", ("INTERNAL_ERROR",)),
    "503": ("this node takes no new messages (drained, stopped, or its database is unreachable); nothing was "
            "stored: send again, to this or another node", ("NODE_NOT_ACCEPTING", "STORE_UNAVAILABLE")),
}
_SECURED_ONLY = ("401", "403")

_TRACE_HEADERS: list[tuple[str, str, dict[str, Any]]] = [
    ("X-Correlation-Id", "the sender's id of the message; a repeated one from the same source system is answered "
                         "as a duplicate (200) and stored once. Generated when missing", {"type": "string",
                                                                                          "maxLength": 255}),
    ("X-Source-System", "the sending system; required without credentials, else it must be the authenticated one "
                        "(or left out)", {"type": "string", "maxLength": 100}),
    ("X-Process-Id", "the sender's business process", {"type": "string", "maxLength": 255}),
    ("X-Message-Timestamp", "when the sender created the message (ISO 8601 with a time zone)",
     {"type": "string", "format": "date-time"}),
]


def package_version() -> str:
    """The installed openroute version (the documents' ``info.version``; "0" when not installed)."""
    try:
        return importlib.metadata.version("openroute")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _response(schema: str, description: str, example: dict[str, Any] | None = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": {"$ref": f"#/components/schemas/{schema}"}}
    if example is not None:  # else Swagger UI makes one from the schema: the first value of every enum
        media["example"] = example
    return {"description": description, "content": {"application/json": media}}


def _answers(secured: bool) -> dict[str, Any]:
    answers = {
        "202": _response("AcceptResponse", "stored as NEW and queued (status ACCEPTED); the message id names it",
                         {"messageId": 42, "correlationId": "c-42", "status": "ACCEPTED", "state": "NEW"}),
        "200": _response("AcceptResponse", "a duplicate of a stored message (status DUPLICATE): stored once, its "
                                           "current state answered",
                         {"messageId": 42, "correlationId": "c-42", "status": "DUPLICATE", "state": "OK"}),
    }
    for status, (description, codes) in ERROR_CODES.items():
        if status in _SECURED_ONLY and not secured:
            continue
        answers[status] = _response("Error", f"{description}. error: {', '.join(codes)}")
    return answers


def _header(name: str, text: str, schema: dict[str, Any], secured: bool) -> dict[str, Any]:
    parameter: dict[str, Any] = {"name": name, "in": "header", "description": text, "schema": schema}
    if name == "X-Source-System" and not secured:  # with credentials the system is the authenticated one
        parameter["required"] = True
    return parameter


def inbound_openapi(bindings: Sequence[InboundBinding], routes: RouteRegistry, *, prefix: str = "/api",
                    secured: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the JSON ``bindings`` (XML ones are left to the WSDL) served at ``prefix``.

    Each operation's request body is the JSON schema of its route's body model, or any object for an untyped
    route; ``secured`` adds the source systems' credentials (HTTP Basic or an API key) and the 401/403 answers.
    Raises :class:`~openroute.definitions.errors.UnknownRouteError` for a binding without a route in ``routes``.
    """
    served = sorted((b for b in bindings if b.content_type == "json"), key=lambda b: b.key)
    models: dict[tuple[str, str], type[BaseModel]] = {}
    for binding in served:
        body = routes.get(binding.service, binding.operation).body
        if body is not None:
            models[binding.key] = body.json
    distinct = list(dict.fromkeys(models.values()))
    refs, definitions = models_json_schema([(model, "validation") for model in distinct],
                                           ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = dict(definitions.get("$defs", {}))
    paths: dict[str, Any] = {}
    for binding in served:
        model = models.get(binding.key)
        schema = (dict(refs[(model, "validation")]) if model is not None
                  else {"type": "object", "description": "any JSON object (the route declares no body model)"})
        operation: dict[str, Any] = {
            "operationId": f"{binding.service}.{binding.operation}",
            "tags": [binding.service],
            "summary": f"send {binding.operation} to {binding.service}",
            "description": "Stored before it is acknowledged, then processed asynchronously."
                           + (f" Body: {model.__name__} (schema below)." if model is not None else ""),
            "parameters": [_header(name, text, value, secured) for name, text, value in _TRACE_HEADERS],
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": _answers(secured),
        }
        if secured:
            operation["security"] = [{"basic": []}, {"apiKey": []}]
        paths[f"{prefix}/{binding.service}/{binding.operation}"] = {"post": operation}
    schemas["AcceptResponse"] = {
        "type": "object", "required": ["messageId", "correlationId", "status", "state"],
        "properties": {
            "messageId": {"type": "integer"}, "correlationId": {"type": "string"},
            "status": {"type": "string", "enum": ["ACCEPTED", "DUPLICATE"]},
            "state": {"type": "string", "description": "the message's state (NEW when just accepted)"},
        },
    }
    all_codes = sorted({code for _description, codes in ERROR_CODES.values() for code in codes})
    schemas["Error"] = {
        "type": "object", "required": ["error", "reason"],
        "properties": {
            "error": {"type": "string", "enum": all_codes},
            "reason": {"type": "string"},
            "fields": {"type": "array", "description": "INVALID_BODY: the fields that do not match the model",
                       "items": {"$ref": "#/components/schemas/FieldError"}},
        },
    }
    schemas["FieldError"] = {
        "type": "object", "required": ["field", "message", "type"],
        "properties": {"field": {"type": "string", "description": "dotted path, e.g. lines.0.sku"},
                       "message": {"type": "string"}, "type": {"type": "string"}},
    }
    components: dict[str, Any] = {"schemas": schemas}
    if secured:
        components["securitySchemes"] = {
            "basic": {"type": "http", "scheme": "basic"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "openroute inbound JSON API", "version": package_version(),
                 "description": "The JSON endpoint of this node: one operation per route. The SOAP endpoint is "
                                "described by the WSDL of each service: `GET /soap/{service}?wsdl`."},
        "paths": paths,
        "components": components,
    }


def swagger_ui_assets() -> Path | None:
    """The folder of the Swagger UI files (the ``swagger-ui-bundle-v2`` package), or None when not installed."""
    try:
        import swagger_ui_bundle
    except ImportError:
        return None
    return Path(swagger_ui_bundle.swagger_ui_path)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>openroute inbound JSON API</title>
<link rel="stylesheet" href="docs/swagger-ui.css"><link rel="icon" type="image/png" href="docs/favicon-32x32.png">
</head><body><div id="swagger-ui"></div>
<script src="docs/swagger-ui-bundle.js"></script><script src="docs/openroute-init.js"></script></body></html>
"""

# a file of its own rather than an inline script: a Content-Security-Policy without 'unsafe-inline' still allows it.
# validatorUrl null: Swagger UI would send the document's URL to validator.swagger.io from any host but localhost;
# BaseLayout: the standalone layout's top bar draws its logo with an inline <style>, which the policy refuses
_INIT = """window.onload = function () {
  window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#swagger-ui", deepLinking: true, validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout"});
};
"""


class InboundContract:
    """The HTTP routes of the contract: ``GET {prefix}/openapi.json``, ``GET {prefix}/docs`` and its assets.

    ``bindings`` is called at each request (the endpoints' bindings), ``routes`` finds their body models.
    """

    def __init__(self, bindings: Callable[[], Sequence[InboundBinding]], routes: RouteRegistry, *,
                 prefix: str = "/api", secured: bool = False) -> None:
        self._bindings = bindings
        self._routes = routes
        self.prefix = prefix
        self.secured = secured
        self._document: dict[str, Any] | None = None

    def document(self) -> dict[str, Any]:
        """The OpenAPI document (made once: routes do not change while the node runs)."""
        if self._document is None:
            self._document = inbound_openapi(self._bindings(), self._routes, prefix=self.prefix,
                                             secured=self.secured)
        return self._document

    def routes(self) -> list[HttpRoute]:
        """The GET routes; they share the prefix of ``POST {prefix}/{service}/{operation}`` but not its method."""
        return [
            HttpRoute(f"{self.prefix}/openapi.json", self.openapi, methods=["GET"]),
            HttpRoute(f"{self.prefix}/docs", self.docs, methods=["GET"]),
            HttpRoute(f"{self.prefix}/docs/{{asset}}", self.asset, methods=["GET"]),
        ]

    async def openapi(self, _request: Request) -> Response:
        """``GET {prefix}/openapi.json``: the document (no authentication, like the WSDL)."""
        return JSONResponse(self.document())

    async def docs(self, _request: Request) -> Response:
        """``GET {prefix}/docs``: Swagger UI on the document, or 404 naming the missing package."""
        if swagger_ui_assets() is None:
            return JSONResponse({"error": "NOT_FOUND", "reason": "Swagger UI is not installed "
                                 "(pip install swagger-ui-bundle-v2); the document is at openapi.json"}, 404)
        return Response(_PAGE.replace('href="docs/', f'href="{self.prefix}/docs/')
                        .replace('src="docs/', f'src="{self.prefix}/docs/'), media_type="text/html; charset=utf-8")

    async def asset(self, request: Request) -> Response:
        """``GET {prefix}/docs/<file>``: one of the few Swagger UI files, served by the node itself."""
        name = request.path_params["asset"]
        if name == "openroute-init.js":
            script = _INIT.replace('"openapi.json"', f'"{self.prefix}/openapi.json"')
            return Response(script, media_type="text/javascript; charset=utf-8")
        folder = swagger_ui_assets()
        if folder is None or name not in _ASSETS:
            return JSONResponse({"error": "NOT_FOUND", "reason": f"no Swagger UI file {name!r}"}, 404)
        return FileResponse(folder / name, media_type=_ASSETS[name],
                            headers={"Cache-Control": "public, max-age=86400"})
