"""Alembic migrations of the message store: ``env.py`` and the revisions under ``versions/``."""
