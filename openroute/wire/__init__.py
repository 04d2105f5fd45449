"""The wire: the HTTP server's protocol under the app, which ``openroute run`` serves with (uvicorn and h11,
nothing of openroute): a deadline for a request to arrive whole (``request_deadline.py``), limits on its headers
(``header_limits.py``) and the client's address behind trusted proxies (``proxy_headers.py``).
"""
