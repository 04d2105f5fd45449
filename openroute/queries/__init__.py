"""The read model every face of a node shares: the message search, its filters and cursors, the views of a message
and of the nodes, and the dashboard's reads.

The admin API (:mod:`openroute.admin`), the console (:mod:`openroute.console`) and ``openroute messages`` are thin
faces over it: they parse their requests here, read through these functions and only shape the answer (JSON, HTML,
text). It sits one floor below the edges, beside :mod:`openroute.auth`, and reads the store only::

    from openroute.queries import load_message_detail, parse_filters, search_messages

    with store.engine.connect() as connection:
        page = search_messages(connection, parse_filters({"state": ["FAILED"]}))
"""

from openroute.queries.filters import InvalidQueryError, Page, SearchFilters, parse_filters, parse_message_id
from openroute.queries.messages import MessageNotFoundError, load_message_detail, message_detail, message_summary
from openroute.queries.search import search_messages, search_summaries

__all__ = [
    "InvalidQueryError",
    "MessageNotFoundError",
    "Page",
    "SearchFilters",
    "load_message_detail",
    "message_detail",
    "message_summary",
    "parse_filters",
    "parse_message_id",
    "search_messages",
    "search_summaries",
]
