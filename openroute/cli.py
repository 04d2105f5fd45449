"""The ``openroute`` command line.

``openroute demo``        show messages going through every state on a temporary SQLite file
``openroute run``         serve the reference routes (HTTP/SOAP) on the SQLite file of the configuration
``openroute db upgrade``  bring the database schema to the newest migration
``openroute messages``    list, show, restart and cancel messages (store or a server's admin API)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openroute", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("demo", help="show a message going through every state on a temporary SQLite store")

    run = commands.add_parser("run", help="serve the reference routes")
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8080)
    run.add_argument("--database-url", default=None, help="SQLAlchemy URL (default: sqlite file openroute.db)")
    run.add_argument("--routes", default=None, help="module:attribute of the routes (default: the reference app)")
    run.add_argument("--auth-config", default=None, help="JSON file with source-system and admin credentials")

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="apply all migrations")
    upgrade.add_argument("--database-url", default=None)
    from openroute.console.cli import add_parser as add_messages_parser  # openroute messages list|show|...
    from openroute.spark.cli import add_parser as add_spark_parser  # openroute spark reprocess|archive|audit

    add_messages_parser(commands)
    add_spark_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        import importlib

        try:  # the demo belongs to the reference app, loaded by name like `run` loads its routes
            demo = importlib.import_module("openroute_reference.demo")
        except ImportError as error:
            print(f"openroute demo: the reference application is not installed: {error}", file=sys.stderr)
            return 2
        return int(demo.main())
    if args.command == "run":
        from openroute.server import serve

        return serve(args.host, args.port, args.database_url, args.routes, args.auth_config)
    if args.command == "messages":
        from openroute.console.cli import run as run_messages

        return run_messages(args)
    if args.command == "spark":
        from openroute.spark.cli import run as run_spark

        return run_spark(args)
    if args.command == "db":
        import os

        from openroute.persistence import DEFAULT_DATABASE_URL, MessageStore

        url = args.database_url or os.environ.get("OPENROUTE_DATABASE_URL") or DEFAULT_DATABASE_URL
        try:
            store = MessageStore(url)
            store.upgrade()
            revision = store.current_revision()
            store.dispose()
        except Exception as error:  # any driver, URL or migration problem ends the command with its reason
            print(f"openroute db upgrade: {url}: {error}", file=sys.stderr)
            return 1
        print(f"openroute db upgrade: {url} is at revision {revision}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
