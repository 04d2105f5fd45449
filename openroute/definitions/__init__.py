"""The definitions: what a route author declares, as plain values that neither run nor store anything.

A route (``route.py``: ``Route``, ``RouteRegistry``, ``Step``) and a reusable sub-route (``sub_route.py``), an
inbound binding and its XML Schema (``binding.py``, ``schema.py``), a typed body (``body.py``), a child message of a
split (``child.py``), an interceptor (``interceptors.py``), a message before it is stored (``message.py``), a retry
policy (``retry.py``), the error tree (``errors.py``), the clock (``clock.py``) and unique names (``names.py``).
The DSL that builds them is ``openroute/dsl.py``; the runtime (``openroute.engine``, ``openroute.runtime``) runs
them. Route authors import these names from ``openroute`` (docs/architecture.md, "The public import surface").
"""
