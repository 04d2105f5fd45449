"""Admin API (search, detail, restart, cancel, counts), Prometheus metrics and the health check."""

from openroute.admin.api import AdminApi, InvalidQueryError, MessageNotFoundError, message_detail, message_summary
from openroute.admin.metrics import Metrics, health_route

__all__ = [
    "AdminApi",
    "InvalidQueryError",
    "MessageNotFoundError",
    "Metrics",
    "health_route",
    "message_detail",
    "message_summary",
]
