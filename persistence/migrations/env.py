"""Alembic environment of the message store (run by ``MessageStore.upgrade`` / ``openroute db upgrade``)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context
from openroute.persistence.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    """Emit the migrations' SQL for ``sqlalchemy.url`` without connecting (``alembic upgrade --sql``)."""
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the connection the store hands over (``attributes["connection"]``), else on a connection
    opened for ``sqlalchemy.url`` and closed after."""
    connection = config.attributes.get("connection")
    if connection is not None:
        # the store hands over its own connection so SQLite pragmas and the transaction are shared
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as own:
        context.configure(connection=own, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
