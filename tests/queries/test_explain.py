"""openroute/queries/_explain.py: an EXPLAIN that SQLAlchemy compiles once per query shape."""

from __future__ import annotations

import sqlalchemy as sa
from openroute.persistence import MessageState, MessageStore, message_table
from sqlalchemy.engine.default import CACHE_HIT, CACHE_MISS

from openroute.queries._explain import Explain


def test_an_explain_is_compiled_once_per_query_shape_and_binds_its_parameters(postgres_store: MessageStore) -> None:
    c = message_table.c
    with postgres_store.engine.connect() as connection:
        hits = []
        for service in ("crm", "billing", "crm"):
            query = sa.select(sa.literal(1)).where(c.service == service, c.state.in_([MessageState.FAILED])).limit(5)
            result = connection.execute(Explain(query, "ANALYZE, TIMING OFF, "))
            hits.append(result.context.cache_hit)
            plan = result.scalar_one()[0]["Plan"]
            assert plan["Node Type"] == "Limit" and plan["Actual Rows"] == 0
        assert hits == [CACHE_MISS, CACHE_HIT, CACHE_HIT]  # the first call compiled it, the others found it
        plain = connection.execute(Explain(sa.select(c.id).where(c.id == 1))).scalar_one()[0]["Plan"]
        assert "Actual Rows" not in plain  # no ANALYZE: the plan only
