"""A real local source system for the tests: receives SOAP and JSON confirmations over HTTP.

A small Starlette app served by uvicorn on 127.0.0.1 (free port) in a background thread. It can fail the first N
requests (SOAP Fault, HTTP 500, refuse with accepted=false, or hang past the client timeout) and records every
confirmation it accepted, so tests assert each arrives exactly once.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from lxml import etree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SOAP_ENV = "http://schemas.xmlsoap.org/soap/envelope/"
NS = "urn:openroute:confirmation:v1"
# secure parser: no entity expansion, no network, no DTD loading
PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)

FAULT = f"""<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="{SOAP_ENV}"><soapenv:Body><soapenv:Fault>
<faultcode>soapenv:Server</faultcode><faultstring>receiver is down (attempt {{n}})</faultstring>
</soapenv:Fault></soapenv:Body></soapenv:Envelope>"""

ANSWER = f"""<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="{SOAP_ENV}" xmlns:c="{NS}"><soapenv:Body>
<c:confirmResponse><c:accepted>{{accepted}}</c:accepted>{{reason}}</c:confirmResponse>
</soapenv:Body></soapenv:Envelope>"""


@dataclass
class Receiver:
    """State shared between the test and the server thread (guarded by ``lock``)."""

    fail_first: int = 0
    failure: str = "fault"  # "fault" | "http500" | "refuse" | "hang"
    hang_seconds: float = 5.0
    requests: int = 0
    accepted: list[dict[str, object]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def reset(self, fail_first: int = 0, failure: str = "fault") -> None:
        with self.lock:
            self.fail_first, self.failure, self.requests = fail_first, failure, 0
            self.accepted.clear()

    def snapshot(self) -> list[dict[str, object]]:
        with self.lock:
            return list(self.accepted)

    def _next(self) -> tuple[int, bool]:
        with self.lock:
            self.requests += 1
            return self.requests, self.requests <= self.fail_first


def _text(element: etree._Element, name: str) -> str | None:
    child = element.find(f"{{{NS}}}{name}")
    return None if child is None else (child.text or "")


def parse_confirm(body: bytes) -> dict[str, object]:
    """The fields of a ``confirmRequest`` envelope (raises ValueError on anything else)."""
    root = etree.fromstring(body, PARSER)
    request = root.find(f"{{{SOAP_ENV}}}Body/{{{NS}}}confirmRequest")
    if request is None:
        raise ValueError("no confirmRequest in the SOAP body")
    fields: dict[str, object] = {
        name: _text(request, name)
        for name in ("correlationId", "messageId", "sourceSystem", "processId", "service", "operation", "state",
                     "finishedAt", "errorCode", "errorText", "confirmationId")
    }
    if fields["messageId"] is not None:
        fields["messageId"] = int(str(fields["messageId"]))  # xs:long, as in the accept answer
    fields["businessErrors"] = [
        {"code": _text(e, "code"), "text": _text(e, "text")}
        for e in request.findall(f"{{{NS}}}businessErrors/{{{NS}}}businessError")
    ]
    return fields


def build_app(receiver: Receiver) -> Starlette:
    async def failure(n: int) -> Response | None:
        if receiver.failure == "http500":
            return Response("internal error", status_code=500, media_type="text/plain")
        if receiver.failure == "refuse":
            body = ANSWER.format(accepted="false", reason=f"<c:reason>not yet (attempt {n})</c:reason>")
            return Response(body, media_type="text/xml")
        if receiver.failure == "hang":
            await asyncio.sleep(receiver.hang_seconds)  # simulates a hung peer: the client times out first
            return Response("late", status_code=500)
        return Response(FAULT.format(n=n), status_code=500, media_type="text/xml")

    async def soap(request: Request) -> Response:
        body = await request.body()
        n, fail = receiver._next()
        if fail:
            return await failure(n)
        try:
            fields = parse_confirm(body)
        except (etree.XMLSyntaxError, ValueError) as error:
            return Response(FAULT.format(n=f"{n}: bad request {error}"), status_code=500, media_type="text/xml")
        with receiver.lock:
            receiver.accepted.append(fields)
        return Response(ANSWER.format(accepted="true", reason=""), media_type="text/xml")

    async def json_endpoint(request: Request) -> Response:
        n, fail = receiver._next()
        if fail:
            return JSONResponse({"error": f"not now ({n})"}, status_code=503)
        document = json.loads(await request.body())
        with receiver.lock:
            receiver.accepted.append(document | {"_headers": dict(request.headers)})
        return JSONResponse({"ok": True}, status_code=202)

    return Starlette(routes=[Route("/soap", soap, methods=["POST"]), Route("/json", json_endpoint, methods=["POST"])])


class ServerThread:
    """uvicorn in a background thread on a pre-bound free port (no port race)."""

    def __init__(self, receiver: Receiver) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(build_app(receiver), log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, ready_within: float = 10.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + ready_within
        while not self.server.started:  # bounded readiness poll: uvicorn offers no event to wait on
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test receiver did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
