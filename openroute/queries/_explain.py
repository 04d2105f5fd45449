"""``EXPLAIN`` of a SELECT as a SQLAlchemy statement, so it is compiled once per query shape (the compiled cache).

``query.compile()`` by hand compiles on every call: a fifth of the worker thread's CPU of a counted admin search
(``search.py: counted_with_estimate``). Executed as an :class:`Explain`, the query's cache key finds the compiled
``EXPLAIN`` again and only the parameters change::

    plan = connection.execute(Explain(query, "ANALYZE, TIMING OFF, ")).scalar_one()
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ClauseElement, Executable, Select
from sqlalchemy.sql.visitors import InternalTraversal


class Explain(Executable, ClauseElement):
    """PostgreSQL's ``EXPLAIN (<settings>FORMAT JSON) <query>``; ``settings`` end with ``", "`` when given (e.g.
    ``"ANALYZE, TIMING OFF, "``). One row, one column: the plan (JSON)."""

    inherit_cache = False  # the cache key is made from _traverse_internals below
    _traverse_internals = [("query", InternalTraversal.dp_clauseelement), ("settings", InternalTraversal.dp_string)]

    def __init__(self, query: Select[Any], settings: str = "") -> None:
        self.query = query
        self.settings = settings

    @property
    def _all_selected_columns(self) -> Any:
        # a cached compiled form is matched to a new statement by the columns of its query (the one result column is
        # the plan, read by position)
        return self.query.selected_columns


@compiles(Explain)
def _explain(element: Explain, compiler: Any, **kw: Any) -> str:
    return f"EXPLAIN ({element.settings}FORMAT JSON) {compiler.process(element.query, **kw)}"
