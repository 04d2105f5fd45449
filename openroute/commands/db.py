"""``openroute db``: the database's schema and data.

``openroute db upgrade``       bring the database schema to this version's newest migration
``openroute db mask-secrets``  mask the secrets in the stored error texts, call records and events again, with the
                               secret names of the configuration (after adding one to ``secret_names`` or to a
                               system's ``records.secret_fields``)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from openroute.commands import EXIT_CONFIGURATION, EXIT_DATABASE, EXIT_OK, EXIT_SCHEMA, resolve_database_url

EXAMPLE = """examples:
  openroute db upgrade                                   the SQLite file openroute.db in this directory
  openroute db upgrade --database-url postgresql+psycopg://openroute@db/openroute
  OPENROUTE_DATABASE_URL=sqlite:///data/openroute.db openroute db upgrade
  openroute db upgrade --config openroute.toml           the database_url of the server's configuration
"""

MASK_EXAMPLE = """examples:
  openroute db mask-secrets --config openroute.toml      the store and the secret names of the server's configuration
  openroute db mask-secrets --database-url postgresql+psycopg://openroute@db/openroute --secret-name pin

Every stored text people or other systems read (the messages' and transitions' error texts and traces, business
errors, the calls' last errors, call records, confirmations' errors, outbox events) is rewritten with its secrets
masked: the built-in names (password, apikey, token, ...), the configuration's secret_names and its external
systems' records.secret_fields, and each --secret-name. In batches of 1,000 rows, each batch committed; only a
changed text is written. Safe while nodes run, and to run again.
"""


def _store_options(parser: Any) -> None:
    parser.add_argument("--database-url", default=None,
                        help="SQLAlchemy URL (default: OPENROUTE_DATABASE_URL, the --config file, sqlite:///openroute.db)")
    parser.add_argument("--config", default=None, metavar="FILE", help="the server's TOML configuration")


def add_parser(subparsers: Any) -> None:
    """Add ``openroute db`` (``upgrade``, ``mask-secrets``) to the command line."""
    db = subparsers.add_parser("db", help="database schema and data", description=__doc__, epilog=EXAMPLE,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = commands.add_parser("upgrade", help="apply all migrations",
                                  description="Bring the database schema to this version's newest migration.",
                                  epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _store_options(upgrade)
    mask = commands.add_parser("mask-secrets", help="mask the secrets in stored texts again",
                               description="Mask the secrets in the texts already in the store.",
                               epilog=MASK_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _store_options(mask)
    mask.add_argument("--secret-name", action="append", default=[], metavar="NAME", dest="secret_names",
                      help="a name whose values are masked too (repeat for more)")


def run(args: argparse.Namespace) -> int:
    """Run the ``openroute db`` subcommand ``args`` name; the exit code."""
    if args.db_command == "mask-secrets":
        return _mask_secrets(args)
    return _upgrade(args)


def _open_store(what: str, args: argparse.Namespace, *, existing: bool = False) -> tuple[Any, str] | int:
    """The store of ``args`` (``--database-url``, ``--config``) and its URL as shown, or the exit code after one line
    on stderr saying why it cannot be opened; ``existing``: a SQLite file that is not there is not created."""
    from openroute.definitions.errors import ConfigurationError
    from openroute.persistence import MessageStore, sqlite_file

    try:
        url = resolve_database_url(args)  # the --config file's secret names are masked from here on
    except ConfigurationError as error:
        print(f"{what}: {_first_line(error)}", file=sys.stderr)
        return EXIT_CONFIGURATION
    shown = _safe(url)
    file = sqlite_file(url) if existing else None
    if file is not None and not file.is_file():  # opening it would create an empty store: say so instead
        print(f"{what}: {shown}: there is no store file {file.resolve()} (nothing created)", file=sys.stderr)
        return EXIT_CONFIGURATION
    try:
        return MessageStore(url), shown
    except Exception as error:  # a malformed URL, an unsupported database or a missing driver
        print(f"{what}: {shown}: {_first_line(error)}", file=sys.stderr)
        return EXIT_CONFIGURATION


def _upgrade(args: argparse.Namespace) -> int:
    what = "openroute db upgrade"
    opened = _open_store(what, args)
    if isinstance(opened, int):
        return opened
    store, shown = opened
    try:
        store.upgrade()
        revision = store.current_revision()
        store.dispose()
    except Exception as error:  # an unreachable database or a failed migration ends the command with its reason
        store.dispose()
        print(f"{what}: {shown}: {_first_line(error)}", file=sys.stderr)
        return EXIT_DATABASE
    print(f"{what}: {shown} is at revision {revision}")
    return EXIT_OK


def _mask_secrets(args: argparse.Namespace) -> int:
    from openroute.persistence import MessageStore
    from openroute.persistence.stored_texts import mask_stored_texts

    what = "openroute db mask-secrets"
    opened = _open_store(what, args, existing=True)
    if isinstance(opened, int):
        return opened
    store, shown = opened
    try:
        revision, head = store.current_revision(), MessageStore.head_revision()
        if revision != head:
            store.dispose()
            print(f"{what}: {shown} is at schema revision {revision or 'none'}, this openroute needs {head}: run "
                  "openroute db upgrade first (it masks the texts too); nothing changed", file=sys.stderr)
            return EXIT_SCHEMA
        with store.engine.connect() as connection:
            changed = mask_stored_texts(connection, names=args.secret_names, after_batch=connection.commit)
            connection.commit()
        store.dispose()
    except Exception as error:  # an unreachable database: the batches committed so far stay masked
        store.dispose()
        print(f"{what}: {shown}: {_first_line(error)}", file=sys.stderr)
        return EXIT_DATABASE
    total = sum(changed.values())
    columns = ", ".join(f"{name} {count}" for name, count in changed.items() if count)
    print(f"{what}: {shown}: {total} stored text{'' if total == 1 else 's'} masked"
          + (f" ({columns})" if columns else ""))
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
