"""Admin API (search, detail, restart, cancel, counts), Prometheus metrics and the health check.

The message search the API and the console share: ``from openroute.admin import parse_filters, search_messages``.
"""

from openroute.admin.api import AdminApi, MessageNotFoundError, message_detail, message_summary
from openroute.admin.counts import MessageCounts, StateCounts
from openroute.admin.filters import InvalidQueryError, Page, SearchFilters, parse_filters
from openroute.admin.metrics import Metrics, health_route
from openroute.admin.search import search_messages

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
