"""Admin API (search, detail, restart, cancel, counts), Prometheus metrics and the health check.

A thin face over the read model (:mod:`openroute.queries`) and the shared authentication (:mod:`openroute.auth`).
The message search the API, the console and ``openroute messages`` share is :mod:`openroute.queries`; its names
stay importable from here: ``from openroute.admin import parse_filters, search_messages``.
"""

from openroute.admin.api import AdminApi
from openroute.admin.metrics import Metrics, health_route
from openroute.jobs.counts import MessageCounts, StateCounts
from openroute.queries.filters import InvalidQueryError, Page, SearchFilters, parse_filters
from openroute.queries.messages import MessageNotFoundError, message_detail, message_summary
from openroute.queries.search import search_messages

__all__ = [
    "AdminApi",
    "InvalidQueryError",
    "MessageCounts",
    "MessageNotFoundError",
    "Metrics",
    "Page",
    "SearchFilters",
    "StateCounts",
    "health_route",
    "message_detail",
    "message_summary",
    "parse_filters",
    "search_messages",
]
