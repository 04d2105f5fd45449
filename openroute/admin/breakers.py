"""The circuit breakers of the external systems in the admin API: list them, force one OPEN or CLOSED.

``GET /admin/breakers`` lists every declared system and every stored breaker; ``POST
/admin/breakers/{system}/state`` with ``{"state": "OPEN"}`` (stays open until an admin closes it) or ``{"state":
"CLOSED"}`` forces one (the ``admin`` role, ``Content-Type: application/json``).
"""

from __future__ import annotations

import logging

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from openroute.admin.action_body import action_body
from openroute.auth.errors import UnsupportedMediaTypeError
from openroute.engine import Engine
from openroute.outbound import BreakerState, ExternalCalls
from openroute.persistence.breaker import BreakerRow, BreakerStore
from openroute.queries.filters import InvalidQueryError
from openroute.queries.status import breaker_summary

__all__ = ["BreakerAdmin"]

log = logging.getLogger("openroute.admin")


class BreakerAdmin:
    """The breaker endpoints of the admin API (``AdminApi`` routes them behind its authentication)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        guard = engine.external_calls
        #: forcing goes through the engine's guard when it has one, so this node sees the change at once
        self.calls = guard if isinstance(guard, ExternalCalls) else ExternalCalls(engine.store, clock=engine.clock)
        self.breakers = BreakerStore(engine.store)

    async def list(self, _request: Request, _user: str) -> Response:
        """Every breaker: the stored ones and the declared systems never called yet (CLOSED)."""
        rows = {row.system: row for row in await anyio.to_thread.run_sync(self.breakers.all)}
        now = self.engine.clock.now()
        declared = set(self.calls.systems)
        for name in declared - set(rows):
            rows[name] = BreakerRow(name, BreakerState.CLOSED, now)
        return JSONResponse({"breakers": [breaker_summary(rows[name], now, name in declared)
                                          for name in sorted(rows)]})

    async def force(self, request: Request, user: str) -> Response:
        """Force a breaker from the JSON body ``{"state": "OPEN"}`` or ``{"state": "CLOSED"}``."""
        system = request.path_params["system"]
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise UnsupportedMediaTypeError(f"the body must be application/json, got {kind or 'no content type'!r}")
        if not system or len(system) > 100:
            raise InvalidQueryError(f"a system name has 1-100 characters, got {system[:100]!r}")
        value = (await action_body(request, '{"state": "OPEN"}')).get("state")
        if not isinstance(value, str) or value.upper() not in ("OPEN", "CLOSED"):
            raise InvalidQueryError(f"state must be OPEN or CLOSED, got {str(value)[:60]!r}")
        row = await self.calls.force(system, BreakerState(value.upper()), f"admin:{user}")
        log.info("circuit breaker %s forced %s by %s", system, row.state.value, user)
        return JSONResponse(breaker_summary(row, self.engine.clock.now(), system in self.calls.systems))
