"""``openroute db upgrade``: bring the database schema to this version's newest migration."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from openroute.commands import EXIT_CONFIGURATION, EXIT_DATABASE, EXIT_OK, resolve_database_url

EXAMPLE = """examples:
  openroute db upgrade                                   the SQLite file openroute.db in this directory
  openroute db upgrade --database-url postgresql+psycopg://openroute@db/openroute
  OPENROUTE_DATABASE_URL=sqlite:///data/openroute.db openroute db upgrade
  openroute db upgrade --config openroute.toml           the database_url of the server's configuration
"""


def add_parser(subparsers: Any) -> None:
    db = subparsers.add_parser("db", help="database schema", description=__doc__, epilog=EXAMPLE,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = commands.add_parser("upgrade", help="apply all migrations", description=__doc__, epilog=EXAMPLE,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    upgrade.add_argument("--database-url", default=None,
                         help="SQLAlchemy URL (default: OPENROUTE_DATABASE_URL, the --config file, sqlite:///openroute.db)")
    upgrade.add_argument("--config", default=None, metavar="FILE", help="the server's TOML configuration")


def run(args: argparse.Namespace) -> int:
    from openroute.errors import ConfigurationError
    from openroute.persistence import MessageStore

    try:
        url = resolve_database_url(args)
    except ConfigurationError as error:
        print(f"openroute db upgrade: {_first_line(error)}", file=sys.stderr)
        return EXIT_CONFIGURATION
    shown = _safe(url)
    try:
        store = MessageStore(url)
    except Exception as error:  # a malformed URL, an unsupported database or a missing driver
        print(f"openroute db upgrade: {shown}: {_first_line(error)}", file=sys.stderr)
        return EXIT_CONFIGURATION
    try:
        store.upgrade()
        revision = store.current_revision()
        store.dispose()
    except Exception as error:  # an unreachable database or a failed migration ends the command with its reason
        store.dispose()
        print(f"openroute db upgrade: {shown}: {_first_line(error)}", file=sys.stderr)
        return EXIT_DATABASE
    print(f"openroute db upgrade: {shown} is at revision {revision}")
    return EXIT_OK


def _safe(url: str) -> str:
    """``url`` with its password hidden."""
    from openroute.persistence import masked_url

    return masked_url(url)


def _first_line(error: BaseException) -> str:
    """The first line of ``error`` (the driver's own error when SQLAlchemy wraps one), credentials masked."""
    from openroute.persistence import mask_secrets

    original = getattr(error, "orig", None)
    text = str(original if original is not None else error).strip() or type(error).__name__
    return mask_secrets(text.splitlines()[0])
