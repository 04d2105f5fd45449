"""Routes served by the ``openroute run`` test: one route, default bindings (SOAP + JSON)."""

from openroute.definitions.route import Route, RouteRegistry

registry = RouteRegistry([Route("orders", "create", [lambda exchange: None])])
