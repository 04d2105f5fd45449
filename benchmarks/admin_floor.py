"""The floor of an admin search through HTTP: a bare Starlette endpoint doing the search the admin API does.

    python benchmarks/admin_floor.py DATABASE_URL PORT

``GET /admin/messages`` reads its filters, cursor and limit as the admin API does, runs the same
:func:`~openroute.queries.search.search_summaries` in a worker thread on a pooled connection, and answers the same
JSON (orjson of :func:`~openroute.queries.messages.summaries`), served by uvicorn with httptools as ``openroute run``
is. What it leaves out is openroute's HTTP stack: middleware (security headers, the inbound dispatch, error pages),
HTTP Basic authentication and its login limiter, the request deadline's protocol, the node's engine and its
threads. ``admin_bench.py --http`` starts it beside the server and alternates their requests, so the two
latencies of a search come from the same moments of the machine: the floor is what this machine, uvicorn,
asyncio, a thread hop, psycopg and the database take for that search, the rest is the node's.
"""

from __future__ import annotations

import sys
from typing import Any


def floor_app(url: str) -> Any:
    """The Starlette application of the floor on the store at ``url``."""
    import anyio.to_thread
    import orjson
    from openroute.persistence import MessageStore
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from openroute.queries.filters import parse_filters, parse_limit
    from openroute.queries.messages import summaries
    from openroute.queries.search import search_summaries

    store = MessageStore(url)

    async def search(request: Request) -> Response:
        params = dict(request.query_params)
        filters = parse_filters({**params, "state": request.query_params.getlist("state"),
                                 "error_code": request.query_params.getlist("error_code")})
        limit = parse_limit(params.get("limit"), "limit")

        def work() -> Any:
            with store.engine.connect() as connection:
                return search_summaries(connection, filters, params.get("cursor"), limit, keep_settings=True)

        page = await anyio.to_thread.run_sync(work)
        body: dict[str, Any] = {"total": page.total, "countEstimated": page.total_estimated, "limit": limit,
                                "items": summaries(page.rows, iso_times=False)}
        if page.next_cursor is not None:
            body["nextCursor"] = page.next_cursor
        return Response(orjson.dumps(body), media_type="application/json")

    return Starlette(routes=[Route("/admin/messages", search)])


def main() -> None:
    import uvicorn

    url, port = sys.argv[1], int(sys.argv[2])
    uvicorn.run(floor_app(url), host="127.0.0.1", port=port, log_level="warning", access_log=False, http="httptools")


if __name__ == "__main__":
    main()
